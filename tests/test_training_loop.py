"""The trainer on the toy objective (tests/toy_objective.py) over 8 simulated CPU devices
(tests/conftest.py sets XLA_FLAGS before JAX starts): sharding, exact resume, restore on another
mesh, gradient accumulation, divergence, collapse telemetry, --steps 0."""

from __future__ import annotations

import os
import signal

import jax
import numpy as np
import pytest
from adversarial import damage_checkpoint

from jepa_cli.data import store
from jepa_cli.errors import InputError, JepaError
from jepa_cli.training.config import TrainConfig, build_config
from jepa_cli.training.loop import Callbacks, train
from jepa_cli.training.run import load_run, params_sha256
from jepa_cli.training.runfiles import read_metrics

TOY = "toy_objective:make"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "toy.zarr"
    rng = np.random.default_rng(0)
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(path / "inputs", rng.integers(0, 256, (96, 8, 8, 1), dtype=np.uint8))
    return path


def _cfg(dataset, out, **kw):
    values = dict(objective=TOY, data=str(dataset), out=str(out), steps=8, batch_size=16, mesh="data=4,fsdp=2",
                  lr=1e-2, warmup_steps=2, seed=3, async_checkpointing=True)
    values.update(kw)
    return build_config(values)


def _sha(run, step=None):
    _, _, host, _ = load_run(run, step)
    return params_sha256(host)


def test_fsdp8_shards_every_divisible_leaf():
    from toy_objective import make

    from jepa_cli.training import mesh as mesh_lib
    from jepa_cli.training.run import abstract_state, build_optimizer
    from jepa_cli.training.state import init_state

    obj = make({"image_size": 8, "dim": 16})
    cfg = build_config({"steps": 1})
    lengths = {"steps": 1, "t_max": 1, "warmup_steps": 0, "ipe": 1}
    tx, *_ = build_optimizer(cfg, obj, lengths, jax.eval_shape(obj.init, jax.ShapeDtypeStruct((2,), np.uint32)))
    mesh = mesh_lib.make_mesh("fsdp=8")
    sh = mesh_lib.state_shardings(mesh, abstract_state(obj, tx))
    state = jax.jit(lambda k: init_state(obj, tx, k), out_shardings=sh)(jax.random.PRNGKey(0))
    kernel = state.params["encoder"]["kernel"]  # [64, 16]: sharded along 64
    assert len(kernel.addressable_shards) == 8
    assert all(s.data.size == kernel.size // 8 for s in kernel.addressable_shards)
    mu = state.opt_state[0].mu["encoder"]["kernel"]  # optimizer state follows the same rule
    assert all(s.data.size == mu.size // 8 for s in mu.addressable_shards)
    assert all(s.data.size == state.ema["kernel"].size // 8 for s in state.ema["kernel"].addressable_shards)


@pytest.mark.slow
def test_data4_fsdp2_trains_and_resumes_exactly(dataset, tmp_path):
    full = train(_cfg(dataset, tmp_path / "full", save_every=4))
    assert full["step"] == 8 and full["checkpoints"] == [4, 8]
    lines = read_metrics(tmp_path / "full")
    assert [m["step"] for m in lines] == list(range(1, 9))
    for key in ("loss", "lr", "weight_decay", "ema_momentum", "grad_norm", "repr_std", "repr_cov_offdiag",
                "examples_per_sec"):
        assert all(np.isfinite(m[key]) for m in lines), key

    # interrupted by SIGINT after step 5, then resumed: bit-identical to the uninterrupted run
    def interrupt(step):
        if step == 5:
            os.kill(os.getpid(), signal.SIGINT)

    part = train(_cfg(dataset, tmp_path / "part", save_every=4), callbacks=Callbacks(after_step=interrupt))
    assert part["interrupted"] == "SIGINT" and part["step"] == 5 and part["checkpoints"] == [4, 5]
    # a half-written checkpoint (orbax's temporary directory, as a crash mid-save leaves it) is ignored
    partial = tmp_path / "part" / "checkpoints" / "7.orbax-checkpoint-tmp-1700000000000000"
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "junk").write_bytes(b"\0" * 10)
    rest = train(_cfg(dataset, tmp_path / "part", save_every=4), resume=True)
    assert rest["step"] == 8
    assert _sha(tmp_path / "part") == _sha(tmp_path / "full")
    assert [m["step"] for m in read_metrics(tmp_path / "part")] == list(range(1, 9))


@pytest.mark.slow
def test_restore_on_another_mesh(dataset, tmp_path):
    """fsdp=8 -> data=8 -> one device: the same values, and training continues."""
    from toy_objective import make

    from jepa_cli.training import mesh as mesh_lib
    from jepa_cli.training.checkpoint import Checkpoints
    from jepa_cli.training.run import abstract_state, build_optimizer

    run = tmp_path / "run"
    train(_cfg(dataset, run, steps=4, mesh="fsdp=8"))
    saved = _sha(run)
    _, obj, _, _ = load_run(run)
    cfg = build_config({"steps": 4})
    tx, *_ = build_optimizer(cfg, obj, {"steps": 4, "t_max": 4, "warmup_steps": 2, "ipe": 6},
                             jax.eval_shape(obj.init, jax.ShapeDtypeStruct((2,), np.uint32)))
    abstract = abstract_state(obj, tx)
    for spec in ("data=8", "data=1"):
        mesh = mesh_lib.make_mesh(spec)
        sh = mesh_lib.state_shardings(mesh, abstract)
        target = jax.tree.map(lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h),
                              abstract.as_dict(), sh.as_dict())
        ck = Checkpoints(run, create=False)
        state, _, _ = ck.restore(4, target)
        ck.close()
        assert state["params"]["encoder"]["kernel"].sharding.mesh.devices.size == mesh.devices.size
        assert params_sha256({"params": state["params"], "ema": state["ema"]}) == saved
    out = train(_cfg(dataset, run, steps=6, mesh="data=8"), resume=True)
    assert out["step"] == 6 and np.isfinite(out["loss"])
    out = train(_cfg(dataset, run, steps=7, mesh="data=1"), resume=True)
    assert out["step"] == 7 and np.isfinite(out["loss"])
    del make


@pytest.mark.slow
def test_grad_accum_matches_large_batch_and_schedules_per_update(dataset, tmp_path):
    common = dict(steps=3, batch_size=16, mesh="data=2,fsdp=2", objective_config={"noise": 0.0})
    one = train(_cfg(dataset, tmp_path / "one", **common))
    acc = train(_cfg(dataset, tmp_path / "acc", grad_accum=4, **common))
    _, _, a, _ = load_run(tmp_path / "one")
    _, _, b, _ = load_run(tmp_path / "acc")
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-6)
    # 12 micro-batches, 3 updates: LR, WD and EMA momentum advanced 3 times, as without accumulation
    m1, m4 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "acc")
    for key in ("lr", "weight_decay", "ema_momentum"):
        assert [m[key] for m in m1] == [m[key] for m in m4]
    assert acc["step"] == 3 and one["loss"] == pytest.approx(acc["loss"], rel=1e-4)


@pytest.mark.slow
def test_divergence_keeps_last_good_checkpoint(dataset, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(JepaError, match="diverged at step 6") as exc:
        train(_cfg(dataset, run, save_every=2, objective_config={"diverge_at": 5}))
    assert "last good checkpoint is step 4" in str(exc.value)
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == [2, 4]
    assert load_run(run)[3] == 4


def test_a_dimensional_collapse_is_a_fall_of_the_effective_rank_below_0_7_of_its_peak():
    from jepa_cli.training.loop import collapse_sign

    healthy = {"repr_std": 0.5, "target_std": 0.4, "effective_rank": 1.3}
    assert collapse_sign(healthy, TrainConfig(batch_size=8), rank_peak=None) is None  # the first row: no peak yet
    assert collapse_sign(healthy, TrainConfig(batch_size=8), rank_peak=1.8) is None  # 1.3 >= 0.7 x 1.8 = 1.26
    assert "effective_rank 1.2 fell below 0.7 x its peak 1.8" in collapse_sign(
        {**healthy, "effective_rank": 1.2}, TrainConfig(batch_size=8), rank_peak=1.8)
    assert collapse_sign({**healthy, "effective_rank": 1.2}, TrainConfig(batch_size=8, grad_accum=2),
                         rank_peak=1.8) is None  # micro-batch 4: spans at most 3 dimensions
    assert "target_std 0 <" in collapse_sign({**healthy, "target_std": 0.0}, TrainConfig(batch_size=8))


@pytest.mark.slow
def test_collapse_flagged_and_steps0_writes_init(dataset, tmp_path):
    logs = []
    out = train(_cfg(dataset, tmp_path / "c", steps=2, objective_config={"collapse": True}),
                callbacks=Callbacks(on_log=logs.append))
    assert out["collapse_suspected_at"] == 1 and any("collapsed" in m for m in logs)
    assert read_metrics(tmp_path / "c")[0]["repr_std"] == 0.0
    init = train(_cfg(dataset, tmp_path / "z", steps=0))
    assert init["checkpoints"] == [0]
    cfg, obj, host, step = load_run(tmp_path / "z")
    assert step == 0 and cfg["objective"] == TOY
    np.testing.assert_array_equal(host["ema"]["kernel"], host["params"]["encoder"]["kernel"])


# ---- rates, reusable runs, the run lock, damaged checkpoints, signals, bad data ------------------

@pytest.mark.slow
def test_every_metrics_row_reports_a_positive_rate(dataset, tmp_path):
    out = train(_cfg(dataset, tmp_path / "run", steps=3, log_every=1))
    rates = [m["examples_per_sec"] for m in read_metrics(tmp_path / "run")]
    assert len(rates) == 3 and all(r > 0 for r in rates), rates
    assert out["last_metrics"]["examples_per_sec"] == rates[-1]


@pytest.mark.slow
def test_run_without_a_checkpoint_is_trained_again_without_force(dataset, tmp_path):
    """What a crash before the first save leaves (run.json 'running', rows, no checkpoint) is reused."""
    import json

    run = tmp_path / "run"
    (run / "checkpoints" / "3.orbax-checkpoint-tmp-1").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"jepa_kind": "run", "config": {}, "status": "running"}))
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n{"step": 2, "loss": 9.0}\n')
    out = train(_cfg(dataset, run, steps=2))
    assert out["checkpoints"] == [2]
    assert [m["loss"] != 9.0 for m in read_metrics(run)] == [True, True]
    assert json.loads((run / "run.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_truncate_metrics_keeps_rows_up_to_the_step_atomically(tmp_path):
    from jepa_cli.training.rundir import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n[3]\n{"step": 3}\n{"step": 4}\n{"step": 5, "lo')
    truncate_metrics(path, 3)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary left


@pytest.mark.slow
def test_lock_of_a_killed_trainer_does_not_block_the_next(dataset, tmp_path):
    import subprocess
    import sys

    run = tmp_path / "run"
    train(_cfg(dataset, run, steps=2))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from jepa_cli.training.runfiles import run_lock; "
                               f"run_lock({str(run)!r}).acquire(); print('locked', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert holder.stdout.readline() == b"locked\n"
    assert (run / ".lock").read_text() == f"{holder.pid}\n"
    holder.kill()  # SIGKILL: no cleanup runs, RUN/.lock stays behind
    holder.wait()
    assert (run / ".lock").exists()
    out = train(_cfg(dataset, run, steps=3), resume=True)
    assert out["step"] == 3 and not (run / ".lock").exists()


@pytest.mark.slow
def test_run_lock_refuses_a_second_holder_naming_the_first(tmp_path):
    from jepa_cli.training.runfiles import run_lock

    with run_lock(tmp_path).held():
        with pytest.raises(InputError, match=f"pid {os.getpid()}"):
            run_lock(tmp_path).acquire()
    with run_lock(tmp_path).held():  # released: free again
        pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's abandoned reads
def test_resume_falls_back_past_a_damaged_checkpoint_and_sets_it_aside(dataset, tmp_path):
    run = tmp_path / "run"
    train(_cfg(dataset, run, steps=4, save_every=2))
    damage_checkpoint(run, 4)
    logs = []
    out = train(_cfg(dataset, run, steps=6, save_every=2), callbacks=Callbacks(on_log=logs.append), resume=True)
    assert any("checkpoint at step 4 is unreadable" in m and "using step 2" in m for m in logs), logs
    assert (run / "unreadable-checkpoints" / "4" / "state").is_dir()
    assert out["step"] == 6 and out["checkpoints"] == [2, 4, 6]
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert load_run(run, 4)[3] == 4  # step 4 was trained and saved again


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's abandoned reads
def test_load_run_reports_the_damaged_checkpoint_it_skips(dataset, tmp_path):
    run = tmp_path / "run"
    train(_cfg(dataset, run, steps=4, save_every=2))
    damage_checkpoint(run, 4)
    skipped = []
    assert load_run(run, on_fallback=lambda step, message: skipped.append((step, message)))[3] == 2
    assert [s for s, _ in skipped] == [4] and "using step 2" in skipped[0][1]
    with pytest.raises(InputError, match="checkpoint at step 4 is unreadable"):
        load_run(run, 4)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's abandoned reads
def test_resume_with_every_checkpoint_damaged_is_refused_naming_the_step(dataset, tmp_path):
    from adversarial import snapshot

    run = tmp_path / "run"
    train(_cfg(dataset, run, steps=2))
    damage_checkpoint(run, 2)
    before = snapshot([run])
    with pytest.raises(InputError, match="no checkpoint reads back .*step 2 is unreadable.*--force"):
        train(_cfg(dataset, run, steps=4), resume=True)
    assert snapshot([run]) == before


@pytest.mark.slow
def test_second_sigterm_stops_at_once_without_saving(dataset, tmp_path):
    from jepa_cli.errors import Terminated

    def terminate_twice(step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Terminated):
        train(_cfg(dataset, tmp_path / "run", steps=6), callbacks=Callbacks(after_step=terminate_twice))
    assert not (tmp_path / "run" / "checkpoints" / "2").exists()


def _latent_set(path):
    store.write_group(path, store.base_attributes("dataset", modality="latent", layout="ND", class_names=[]))
    store.write_array(path / "inputs", np.zeros((32, 16), np.float32))


def _corrupt_metadata(path):
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    (path / "inputs").mkdir()
    (path / "inputs" / "zarr.json").write_text('{"shape": [32, 8, 8')


def _empty(path):
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(path / "inputs", np.zeros((0, 8, 8, 1), np.uint8))


def _ten_images(path):
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(path / "inputs", np.zeros((10, 8, 8, 1), np.uint8))


def _damaged_chunk(path):
    store.write_group(path, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=[]))
    store.write_array(path / "inputs", np.random.default_rng(0).integers(0, 256, (32, 8, 8, 1), dtype=np.uint8))
    for chunk in (path / "inputs" / "c").rglob("*"):
        if chunk.is_file():
            chunk.write_bytes(chunk.read_bytes()[:7])


@pytest.mark.slow
@pytest.mark.parametrize("make, message", [
    (_latent_set, "modality is 'latent'"),
    (_corrupt_metadata, "damaged array metadata"),
    (_empty, "the dataset is empty"),
    (_ten_images, "--batch-size 16 is larger than the dataset (10 examples)"),
    (_damaged_chunk, "example 0 is unreadable, a chunk of 'inputs' is truncated or corrupt"),
], ids=["latent-set", "corrupt-zarr-json", "no-samples", "fewer-samples-than-the-batch", "truncated-chunk"])
def test_unusable_data_is_refused_before_anything_is_written(tmp_path, make, message):
    data = tmp_path / "data.zarr"
    make(data)
    with pytest.raises(InputError) as exc:
        train(_cfg(data, tmp_path / "run"))
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_saving_a_replicated_state_compiles_no_slicing_program(tmp_path, caplog):
    # orbax splits a replicated array across its replicas with eager slices, one compile per shape:
    # about 1.8 s on a 2-block model over 4 devices (training/checkpoint.py)
    import logging

    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jepa_cli.training.checkpoint import Checkpoints

    replicated = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec())
    state = {f"w{i}": jax.device_put(jnp.full((8 + i, 16), float(i)), replicated) for i in range(3)}
    checkpoints = Checkpoints(tmp_path, async_save=False)
    with caplog.at_level(logging.WARNING, logger="jax"), jax.log_compiles():
        checkpoints.save(1, state, None, {})
    compiled = [r.getMessage() for r in caplog.records if "ompil" in r.getMessage()]
    assert compiled == []
    written = sorted(p.name for p in (tmp_path / "checkpoints" / "1" / "state").iterdir())
    assert written == ["_METADATA", "_sharding", "array_metadatas", "commit_success.txt", "d", "manifest.ocdbt",
                       "ocdbt.process_0"]  # as orbax's own handler writes them
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    restored = checkpoints.restore(1, target)[0]
    assert [float(restored[f"w{i}"].sum()) for i in range(3)] == [0.0, 9 * 16.0, 2 * 10 * 16.0]


@pytest.mark.slow
def test_a_reader_arriving_while_another_opens_the_source_gets_its_label(tmp_path, monkeypatch):
    # grain's reader threads ask for the first elements together; a CI run once saw one of them find
    # the inputs open and the labels not yet read ("'NoneType' object is not subscriptable")
    import concurrent.futures
    import threading
    import time

    from jepa_cli.training.data import ZarrSource

    data = tmp_path / "d.zarr"
    store.write_group(data, store.base_attributes("dataset", modality="image", layout="NHWC", class_names=["a", "b"]))
    store.write_array(data / "inputs", np.zeros((8, 4, 4, 1), np.uint8))
    store.write_array(data / "labels", np.arange(8, dtype=np.int32) % 2)
    read_array, reading_labels = store.read_array, threading.Event()

    def slow_labels(path):
        if path.name == "labels":
            reading_labels.set()
            time.sleep(0.3)  # the second reader arrives meanwhile
        return read_array(path)

    monkeypatch.setattr(store, "read_array", slow_labels)
    source = ZarrSource(data, with_labels=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(source.__getitem__, 0)
        assert reading_labels.wait(10)
        second = source[1]
        assert (int(first.result()["label"]), int(second["label"])) == (0, 1)


@pytest.mark.slow
def test_a_pickled_source_opens_its_arrays_again(dataset):
    import pickle

    from jepa_cli.training.data import ZarrSource

    source = ZarrSource(dataset, with_labels=False)
    first = source[0]["image"]
    copy = pickle.loads(pickle.dumps(source))
    assert copy._array is None
    np.testing.assert_array_equal(copy[0]["image"], first)


def test_the_abstract_state_has_the_initial_states_shapes_with_or_without_abstract_params():
    from jepa_cli.objectives import make_objective
    from jepa_cli.training.run import abstract_state, build_optimizer
    from jepa_cli.training.state import init_state

    objective = make_objective("ijepa", dict(model="tiny", width=32, depth=1, heads=2, patch_size=4, image_size=16,
                                             channels=1, pred_depth=1, pred_width=16, total_updates=4))
    abstract_params = jax.eval_shape(objective.init, jax.ShapeDtypeStruct((2,), np.uint32))
    tx = build_optimizer(build_config({"steps": 4}), objective, {"steps": 4, "t_max": 4, "warmup_steps": 1, "ipe": 1},
                         abstract_params)[0]
    state = init_state(objective, tx, jax.random.PRNGKey(0))
    want = jax.tree.map(lambda a: (a.shape, a.dtype), state)
    for abstract in (abstract_state(objective, tx), abstract_state(objective, tx, abstract_params)):
        assert jax.tree.map(lambda a: (a.shape, a.dtype), abstract) == want
    assert len(jax.tree.leaves(state)) == 125  # params, encoder EMA, Adam moments, counts, step, rng


@pytest.mark.slow
def test_a_process_other_than_0_takes_process_0s_decision_on_run_and_never_looks_itself(tmp_path):
    """In a multi-process launch process 0 may already have written RUN/run.json when another process
    gets going; that process must not refuse RUN as "written meanwhile" (it then left process 0 waiting
    in orbax's first barrier forever): it follows the mode process 0 checked under the lock."""
    from jepa_cli.training.rundir import lock_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text('{"written": "by process 0, after the plans were made"}')
    lock, mode = lock_run(run, main=False, planned="new", resume=False, force=False, seen=None)
    assert lock is None and mode == "new"
    assert not (run / ".lock").exists()
