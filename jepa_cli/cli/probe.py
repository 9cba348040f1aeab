"""`jepa probe linear|knn|attentive TRAIN.zarr TEST.zarr`: score frozen features with a probe."""

from __future__ import annotations

import click

from jepa_cli.cli.common import (SEED, emit, output_options, print_mapping, progress_bar, stderr_log, stdout_console,
                                 warn)
from jepa_cli.cli.complete import complete_datasets, complete_runs, complete_steps


# Features a sample above which the linear probe is said to be slow before it starts (a 256x256 grey
# image; a 32x32 RGB clip of 16 frames has 49,152)
LINEAR_SLOW_FEATURES = 65_536


@click.command("probe")
@click.argument("probe", type=click.Choice(["linear", "knn", "attentive"]))
@click.argument("train", type=click.Path(path_type=str), shell_complete=complete_datasets)
@click.argument("test", type=click.Path(path_type=str), shell_complete=complete_datasets)
@click.option("--raw", is_flag=True, help="Probe raw inputs (flattened, pixels scaled to [0, 1]) instead of latents; TRAIN and TEST "
                   "must agree in modality and sample shape, not in what wrote them (e.g. real vs sampled).")
@click.option("--raw-pool", "raw_pool", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --raw: average images and video frames over P x P pixel blocks first (a cheaper "
                   "baseline for large inputs: a 16-frame 64x64 RGB clip has 196,608 values, 12,288 at P 4).")
@click.option("--k", "k", type=click.IntRange(min=1), default=20, show_default=True,
              help="knn: neighbours; more than TRAIN's samples is lowered to that number, with a warning.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=0.07, show_default=True,
              help="knn: temperature of the weighted vote.")
@click.option("--vote", type=click.Choice(["weighted", "majority"]), default="weighted", show_default=True,
              help="knn: exp(sim/T)-weighted votes (DINO) or one vote per neighbour.")
@click.option("--epochs", type=click.IntRange(min=1), default=20, show_default=True, help="attentive: epochs.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="attentive: minibatch size (256); knn: test rows per batch (automatic).")
@click.option("--per-class", is_flag=True, help="Add per-class top-1 accuracy.")
@click.option("--allow-mismatch", is_flag=True,
              help="Probe TRAIN and TEST even if they were encoded differently (run, step, weights, pool, layers).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the held-out split / probe init.")
@click.option("--run", "run_dir", type=click.Path(path_type=str), default=None, shell_complete=complete_runs,
              help="Probe RUN's target encoder on TRAIN and TEST as image (or audio, video) datasets, encoded in memory.")
@click.option("--step", "step", default=None, metavar="N|all", shell_complete=complete_steps,
              help="With --run: the checkpoint to probe (default: the latest), or all of them, oldest first.")
@output_options
def command(probe, train, test, raw, raw_pool, k, temperature, vote, epochs, batch_size, per_class, allow_mismatch,
            seed, run_dir, step, as_json, verbose, quiet):
    """Score frozen features with a linear, k-NN or attentive probe.

    Features are the `inputs` of latent datasets (from encode-latents), or of any dataset with
    --raw. linear: standardised features, logistic regression, weight decay chosen on a held-out
    part of TRAIN. knn: cosine, k neighbours, DINO's temperature-weighted vote; a --k above TRAIN's
    number of samples is lowered to it (every sample votes) with a warning line, and the result's
    "k" is the one used. attentive: V-JEPA's
    one-query cross-attention probe over tokens (encode with --pool none). Accuracies are fractions;
    top-5 only with more than 5 classes (else null in --json: every label is among the five best).

    \b
    Examples:
      jepa probe linear emb-train.zarr emb-test.zarr --json
      jepa probe knn digits-train.zarr digits-test.zarr --raw --k 20
      jepa probe knn digits-train.zarr digits-test.zarr --run runs/digits --step all --json
    """
    import time

    from jepa_cli.errors import InputError
    from jepa_cli.evaluation import features as feats
    from jepa_cli.evaluation.probes import probe_features, probe_progress, probe_result

    log = stderr_log(quiet or as_json and not verbose)
    if run_dir is not None or step is not None:
        return _probe_run(probe, train, test, run_dir, step, k, temperature, vote, seed, raw, per_class, as_json,
                          log, quiet)
    if raw_pool > 1 and not raw:
        raise InputError("--raw-pool goes with --raw (it pools raw pixels)")
    tr, te, num_classes, mismatch = feats.load_pair(train, test, raw=raw, tokens=probe == "attentive",
                                                    allow_mismatch=allow_mismatch, raw_pool=raw_pool)
    if mismatch:
        warn(f"TRAIN and TEST were not encoded alike ({mismatch})", quiet)
    if verbose:  # an error may still follow, and an error must stay the only line on stderr
        log(f"{probe} probe: {tr.n} train, {te.n} test, dim {tr.x.shape[-1]}, {num_classes} classes")
    if probe == "linear" and tr.x.shape[-1] > LINEAR_SLOW_FEATURES:
        # said up front: its progress moves only once a fit is done, minutes apart at this size
        warn(f"{'--raw: ' if raw else ''}{tr.x.shape[-1]:,} features a sample: the linear probe's fits on "
             f"{tr.n:,} samples will take minutes; pool or downsample (ingest with a smaller --size)", quiet)
    start = time.perf_counter()
    with progress_bar(*probe_progress(probe, te.n, epochs), quiet=quiet or (as_json and not verbose)) as advance:
        out = probe_features(probe, tr, te, num_classes, k=k, temperature=temperature, vote=vote, epochs=epochs,
                             batch_size=batch_size, seed=seed, on_advance=advance,
                             on_note=advance.log if verbose else None)
    if probe == "knn":
        _warn_k_lowered(k, out["k"], train, quiet)
    result = probe_result(probe, out, tr, te, num_classes, (train, test), raw, mismatch, per_class,
                          time.perf_counter() - start)
    emit(result, as_json, lambda r: _print_result(r, probe, per_class))


def _print_result(r: dict, probe: str, per_class: bool) -> None:
    """A probe's result for people: its fields, then a table of the per-class accuracies when asked."""
    # a top-5 of 5 classes or fewer is None (features.topk_accuracy): --json keeps the null, this omits it
    flat = {key: value for key, value in r.items() if key != "per_class" and not (key == "top5" and value is None)}
    print_mapping(flat, title=f"{probe} probe")
    if per_class:
        from rich.table import Table

        table = Table(title="per class")
        for col in ("class", "name", "n", "top1"):
            table.add_column(col)
        for row in r["per_class"]:
            table.add_row(str(row["class"]), row["name"], str(row["n"]), f"{row['top1']:.4f}")
        stdout_console().print(table)


def _warn_k_lowered(given: int, used: int, train: str, quiet: bool) -> None:
    """The one warning line of a k-NN probe whose --k exceeded TRAIN's samples (knn_probe lowers it)."""
    if used < given:
        warn(f"--k {given} is more than the {used} samples of {train}: the k-NN probe used k={used}, every "
             "training sample", quiet)


def _probe_run(probe, train, test, run_dir, step, k, temperature, vote, seed, raw, per_class, as_json, log, quiet):
    """`--run RUN [--step N|all]`: one result per checkpoint (evaluation/online.py probe_run)."""
    k_given = k
    from jepa_cli.errors import InputError
    from jepa_cli.evaluation.features import accuracy_text
    from jepa_cli.evaluation.online import probe_run

    if run_dir is None:
        raise InputError("--step needs --run RUN")
    if probe == "attentive" or raw or per_class:
        raise InputError("--run probes the encoder's mean-pooled features with knn or linear (no attentive, "
                         "--raw or --per-class)")
    if step is not None and step != "all":
        if not (step.isascii() and step.isdecimal()):
            raise InputError(f"--step must be a checkpoint step or 'all', got {step!r}")
        step = int(step)
    rows = probe_run(run_dir, train, test, probe, step, k=k, temperature=temperature, vote=vote, seed=seed,
                     on_result=lambda r: log(f"step {r['step']}: {accuracy_text(r['top1'], r['top5'])}"))
    if probe == "knn":
        k = rows[0]["k"]
        _warn_k_lowered(k_given, k, train, quiet)
    result = {"probe": probe, "run": run_dir, "train": train, "test": test, "weights": "target",
              "k": k if probe == "knn" else None, "results": rows}

    def human(r):
        from rich.table import Table

        table = Table(title=f"{probe} probe of {run_dir}'s target encoder")
        for col in ("step", "top1", "top5"):
            table.add_column(col)
        for row in r["results"]:
            table.add_row(str(row["step"]), f"{row['top1']:.4f}", "-" if row["top5"] is None else f"{row['top5']:.4f}")
        stdout_console().print(table)

    emit(result, as_json, human)
