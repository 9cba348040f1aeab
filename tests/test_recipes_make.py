"""recipes/quickstart.mk driven by make through a real shell: every artifact, then only what is stale."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import COMPILE_FASTER

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# The make runs see one CPU device, not the suite's 8 simulated ones: this file tests make's
# orchestration, and `jepa` keeps a compilation cache only on one device (cli/compile_cache.py,
# compilation_cache_dir), so the runs share the suite's cache and compile less.
ONE_DEVICE = {**os.environ, "XLA_FLAGS": COMPILE_FASTER}
TINY_RECIPE = """
objective = "ijepa"
batch_size = 32
lr = 2e-3
warmup_steps = 1
[ijepa]
model = "tiny"
depth = 2
width = 32
heads = 2
patch_size = 4
pred_depth = 1
pred_width = 16
min_keep = 4
"""


def _make(out: Path, recipe: Path, *extra: str, cwd: Path) -> subprocess.CompletedProcess:
    jepa = f"{shlex.quote(sys.executable)} -m jepa_cli"
    return subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "recipes" / "quickstart.mk"),
                           f"OUT={out}", f"RECIPE={recipe}", f"JEPA={jepa}", f"PYTHON={sys.executable}", "STEPS=3",
                           "PROBE_TYPES=knn", "-j2",
                           *extra], cwd=cwd, capture_output=True, text=True, env=ONE_DEVICE, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("quickstart")
    recipe = root / "tiny.toml"
    recipe.write_text(TINY_RECIPE)
    done = _make(Path("out"), recipe, cwd=root)
    assert done.returncode == 0, done.stderr
    return root, recipe, done


def test_every_artifact_is_built_and_the_table_printed(built):
    root, _, done = built
    out = root / "out"
    for split in ("train", "test"):
        assert (out / f"data-{split}.zarr" / "zarr.json").exists()
    assert json.loads((out / "run-init.json").read_text())["step"] == 0
    assert json.loads((out / "run-pretrained.json").read_text())["step"] == 3
    probe = json.loads((out / "probe-knn-pretrained.json").read_text())
    assert probe["encoder"]["run"] == str((out / "run-pretrained").resolve()) and probe["encoder"]["step"] == 3
    assert probe["encoder"]["weights"] == "target"
    assert json.loads((out / "probe-knn-raw.json").read_text())["encoder"] is None
    assert not list(out.glob("probe-linear-*"))  # PROBE_TYPES=knn
    lines = (out / "table.txt").read_text().splitlines()
    assert lines[0] == "builtin:digits test split, top-1 accuracy (1438 train / 359 test)"
    # 3 updates of the recipe's EMA ramp from 0.996: the target holds 0.996 x 0.9973 x 0.9987 = 0.99 of its init
    assert [line.split("  ")[0] for line in lines[2:]] == [
        "raw inputs (--raw)", "run-init target encoder, step 0 (random init)",
        "run-pretrained target encoder, step 3 (still 0.99 random init)"]
    assert probe["encoder"]["init_weight"] == pytest.approx(0.996 * (0.996 + 0.004 / 3) * (0.996 + 0.008 / 3), abs=2e-3)
    assert done.stdout.endswith((out / "table.txt").read_text())
    assert not list(out.glob("*.tmp"))


def test_nothing_reruns_when_nothing_changed(built):
    root, recipe, _ = built
    assert _make(Path("out"), recipe, "-q", "out/table.txt", cwd=root).returncode == 0  # -q: 0 means up to date


def test_touching_the_recipe_reruns_the_runs_and_what_follows_not_the_data(built):
    root, recipe, _ = built
    import time

    stamp = time.time() + 60  # newer than every artifact, however long the build took
    os.utime(recipe, (stamp, stamp))
    plan = _make(Path("out"), recipe, "-n", "out/table.txt", cwd=root).stdout  # -n: print, run nothing
    commands = [line for line in plan.splitlines() if "jepa_cli" in line or "probe_table" in line]
    assert sum(" train " in c for c in commands) == 2
    assert sum(" encode-latents " in c for c in commands) == 4
    assert sum(" probe " in c for c in commands) == 2 and not any("--raw" in c for c in commands)
    assert sum("probe_table.py" in c for c in commands) == 1
    assert not any(" ingest " in c for c in commands) and len(commands) == 9


def test_a_failed_step_leaves_no_target(tmp_path):
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(TINY_RECIPE)
    done = _make(Path("out"), recipe, "TRAIN_FLAGS=--lr -1", cwd=tmp_path)
    assert done.returncode != 0
    assert "jepa: error: --lr must be a number > 0, got -1.0" in done.stderr
    assert not list((tmp_path / "out").glob("run-pretrained.json*"))  # the baseline takes no TRAIN_FLAGS


def _plan(name: str, *variables: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-n", "-f", str(ROOT / "recipes" / name), "JEPA=jepa",
                           *variables], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_in1k_recipe_ingests_train_and_val_as_two_sources_and_trains_the_official_recipe(tmp_path):
    for split in ("train", "val"):
        (tmp_path / "imagenet" / split).mkdir(parents=True)
    plan = _plan("ijepa-in1k.mk", "IN1K=imagenet", "MESH=data=-1,fsdp=8", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    ingests = [line for line in lines if line.startswith("jepa ingest")]
    assert ingests == [
        "jepa ingest 'imagenet/train' 'in1k/data-train.zarr' --size 256x256  --channels 3 --skip-bad --force -q",
        "jepa ingest 'imagenet/val' 'in1k/data-test.zarr' --size 256x256  --channels 3 --skip-bad --force -q"]
    trains = [line.split("' ", 2)[2] for line in lines if "write-result.sh' 'in1k/run-" in line]
    assert len(trains) == 2 and all(t.startswith("jepa train") and "ijepa-in1k-vith14.toml" in t
                                    and "--mesh data=-1,fsdp=8" in t and "--image-size" not in t for t in trains)


def test_the_folder_recipe_splits_one_folder_and_needs_its_source(tmp_path):
    (tmp_path / "photos").mkdir()
    plan = _plan("ijepa-folder.mk", "SOURCE=photos", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "jepa ingest 'photos' 'folder-run/data-test.zarr' --size 32x32 --split test --seed 0 --channels 3" \
        " --skip-bad --force -q" in plan.stdout
    missing = _plan("ijepa-folder.mk", cwd=tmp_path)
    assert missing.returncode != 0 and "set SOURCE=path/to/images" in missing.stderr


def test_the_audio_and_video_recipes_are_the_quickstart_with_their_source_shape_and_recipe(tmp_path):
    audio = _plan("audio-jepa-tones.mk", cwd=tmp_path).stdout
    assert "jepa ingest 'builtin:tones' 'tones/data-train.zarr' --sample-rate 16000 --seconds 1 --split train" in audio
    assert "audio-jepa-small.toml" in audio and "--size" not in audio
    video = _plan("vjepa-moving-digits.mk", cwd=tmp_path).stdout
    assert "jepa ingest 'builtin:moving-digits' 'moving-digits/data-test.zarr' --size 32x32 --split test --seed 0" in video
    assert "vjepa-moving-digits-tiny.toml" in video


def test_the_flow_recipe_samples_unguided_guided_and_in_the_interval_then_measures_fd(tmp_path):
    plan = _plan("flow-digits.mk", "SCALE=3", cwd=tmp_path).stdout.splitlines()
    samples = [line for line in plan if line.startswith("jepa sample")]
    assert [s.split(" -o ")[0].split("--classes all ")[1] for s in samples] == [
        "--guidance-scale 1 --seed 0", "--guidance-scale 3 --seed 0",
        "--guidance-scale 3 --guidance-interval 0.22,0.84 --seed 0"]
    fds = [line for line in plan if line.startswith("jepa fd")]
    assert len(fds) == 3 and all("--run 'flow-digits/encoder'" in line for line in fds)


# The cases below run the recipes through make with JEPA (and PYTHON, for the table) a stand-in that
# appends its arguments to FAKE_LOG as one line (each ended by a \037, which no path holds), creates
# the dataset an ingest names and prints {}: they test which commands make runs, with no training.
FAKE_JEPA = """#!/bin/sh
if [ "$1" = "$FAKE_FAIL" ]; then echo "jepa: error: failing on purpose" >&2; exit 1; fi
printf '%s\037' "$@" >> "$FAKE_LOG" && echo >> "$FAKE_LOG"
if [ "$1" = ingest ]; then mkdir -p "$3" && echo {} > "$3/zarr.json"; fi
echo {}
"""


class Fake:
    """A directory to run a recipe in with the stand-in jepa; `calls` is what it ran in the last `make`."""

    def __init__(self, root: Path, recipe: str = "quickstart.mk"):
        self.root, self.recipe = root, recipe
        self.jepa = root / "fake-jepa"
        self.jepa.write_text(FAKE_JEPA)
        self.jepa.chmod(0o755)
        self.log = root / "calls.log"

    def make(self, *args: str, fail: str = "", home: Path | None = None) -> subprocess.CompletedProcess:
        self.log.write_text("")
        env = {**os.environ, "FAKE_LOG": str(self.log), "FAKE_FAIL": fail, **({"HOME": str(home)} if home else {})}
        return subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "recipes" / self.recipe),
                               f"JEPA={self.jepa}", f"PYTHON={self.jepa}", *args],
                              cwd=self.root, capture_output=True, text=True, env=env, timeout=60)

    @property
    def calls(self) -> list[list[str]]:
        return [line.split("\037")[:-1] for line in self.log.read_text().splitlines()]

    def commands(self) -> list[str]:
        """Each call's subcommand and the name of what it writes (a probe: its type and first input)."""
        named = []
        for call in self.calls:
            if call[0] == "probe":
                named.append(f"probe {call[1]} {Path(call[2]).name}")
                continue
            flag = next((f for f in ("--out", "-o") if f in call), None)
            out = call[call.index(flag) + 1] if flag else call[2] if call[0] == "ingest" else ""
            named.append(f"{Path(call[0]).name} {Path(out).name}".strip())
        return named


@pytest.fixture
def fake(tmp_path):
    fake = Fake(tmp_path)
    done = fake.make("OUT=out")
    assert done.returncode == 0, done.stderr
    return fake


def test_a_second_make_runs_no_command(fake):
    done = fake.make("OUT=out")
    assert done.returncode == 0 and fake.calls == []
    assert fake.make("OUT=out", "-q", "out/table.txt").returncode == 0


@pytest.mark.parametrize("spelling", ["out/", "./out", "./out/"])
def test_the_same_out_spelled_another_way_runs_no_command(fake, spelling):
    assert fake.make(f"OUT={spelling}").returncode == 0 and fake.calls == []


def test_another_jepa_command_runs_no_command(fake):
    other = fake.root / "other-jepa"
    shutil.copy(fake.jepa, other)
    assert fake.make("OUT=out", f"JEPA={other}").returncode == 0 and fake.calls == []


def test_a_dry_run_after_a_change_writes_nothing_and_the_real_run_still_sees_the_change(fake):
    before = {p: p.stat().st_mtime_ns for p in (fake.root / "out").iterdir()}
    plan = fake.make("OUT=out", "STEPS=7", "-n")
    assert plan.returncode == 0 and "--steps 7" in plan.stdout and fake.calls == []
    assert {p: p.stat().st_mtime_ns for p in (fake.root / "out").iterdir()} == before
    assert fake.make("OUT=out", "STEPS=7").returncode == 0 and fake.commands()[0] == "train run-pretrained"


def test_fewer_probe_types_reprint_only_the_table_without_them(fake):
    assert fake.make("OUT=out", "PROBE_TYPES=knn").returncode == 0
    assert fake.commands() == ["probe_table.py"]
    assert [Path(arg).name for arg in fake.calls[0][3:]] == [
        "probe-knn-raw.json", "probe-knn-init.json", "probe-knn-pretrained.json"]


def test_a_new_steps_replaces_the_pretrained_run_and_reruns_only_what_follows_it(fake):
    done = fake.make("OUT=out", "STEPS=7")
    assert done.returncode == 0, done.stderr
    assert fake.commands() == [
        "train run-pretrained", "encode-latents emb-pretrained-train.zarr", "encode-latents emb-pretrained-test.zarr",
        "probe linear emb-pretrained-train.zarr", "probe knn emb-pretrained-train.zarr", "probe_table.py"]
    train = fake.calls[0]
    assert train[train.index("--steps") + 1] == "7" and "--force" in train and "--resume" not in train
    assert fake.make("OUT=out", "STEPS=7").returncode == 0 and fake.calls == []


def test_a_new_size_reingests_both_splits_and_reruns_everything(fake):
    assert fake.make("OUT=out", "SIZE=8x8").returncode == 0
    ingests = [call for call in fake.calls if call[0] == "ingest"]
    assert [call[call.index("--size") + 1] for call in ingests] == ["8x8", "8x8"]
    assert len(fake.calls) == 15


def test_a_new_title_reprints_only_the_table(fake):
    assert fake.make("OUT=out", "TITLE=digits").returncode == 0
    assert fake.commands() == ["probe_table.py"] and fake.calls[0][1:3] == ["--title", "digits"]


def test_a_step_that_failed_after_its_variable_changed_reruns_on_the_next_make(fake):
    failed = fake.make("OUT=out", "STEPS=7", fail="train")
    assert failed.returncode == 2 and "jepa: error: failing on purpose" in failed.stderr
    assert fake.make("OUT=out", "STEPS=7").returncode == 0
    assert fake.commands()[0] == "train run-pretrained" and len(fake.calls) == 6


def test_a_missing_source_fails_in_one_line_before_anything_runs_and_keeps_the_outputs(fake):
    table = (fake.root / "out" / "table.txt").read_bytes()
    done = fake.make("OUT=out", "SOURCE=/nonexistent")
    assert done.returncode == 2 and fake.calls == []
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{ROOT}/recipes/quickstart.mk:")
    assert line.endswith(": *** /nonexistent: no such file or directory (the source to ingest).  Stop.")
    assert (fake.root / "out" / "table.txt").read_bytes() == table


def test_a_source_with_spaces_and_quotes_reaches_ingest_as_one_argument(tmp_path):
    fake = Fake(tmp_path)
    source = tmp_path / "my photos 'raw'"
    source.mkdir()
    assert fake.make("OUT=out", f"SOURCE={source}").returncode == 0
    assert [call[1] for call in fake.calls if call[0] == "ingest"] == [str(source), str(source)]
    table = fake.calls[-1]
    assert table[table.index("--title") + 1] == "my photos 'raw' test split"  # the folder's name, as every recipe


def test_the_folder_recipe_titles_the_table_with_the_folders_name_spaces_included(tmp_path):
    fake = Fake(tmp_path, "ijepa-folder.mk")
    source = tmp_path / "holiday photos" / "2026 a  b"
    source.mkdir(parents=True)
    assert fake.make("OUT=out", f"SOURCE={source}/").returncode == 0
    table = fake.calls[-1]
    assert table[table.index("--title") + 1] == "2026 a  b test split"


def test_a_source_under_an_unexpanded_tilde_is_read_from_home(tmp_path):
    fake = Fake(tmp_path)
    (tmp_path / "photos").mkdir()
    assert fake.make("OUT=out", "SOURCE=~/photos", home=tmp_path).returncode == 0  # as zsh passes it
    assert [call[1] for call in fake.calls if call[0] == "ingest"] == [str(tmp_path / "photos")] * 2


@pytest.mark.parametrize("out", ["my runs", "runs ", "a:b", "50%", "~/runs", "-runs", ""])
def test_an_out_that_make_cannot_name_targets_in_is_refused_in_one_line(tmp_path, out):
    fake = Fake(tmp_path)
    done = fake.make(f"OUT={out}")
    assert done.returncode == 2 and fake.calls == []
    [line] = done.stderr.splitlines()
    assert "*** OUT is empty" in line if not out else f"*** OUT='{out}' cannot be a make target" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.log", "fake-jepa"]


def test_a_flow_recipe_that_changed_retrains_the_flow_and_resamples_every_set_with_force(tmp_path):
    fake = Fake(tmp_path, "flow-digits.mk")
    recipe = tmp_path / "flow.toml"
    recipe.write_text((ROOT / "jepa_cli" / "recipes" / "flow-digits-tiny.toml").read_text())
    assert fake.make("OUT=out", f"FLOW_RECIPE={recipe}").returncode == 0
    stamp = time.time() + 60
    os.utime(recipe, (stamp, stamp))
    assert fake.make("OUT=out", f"FLOW_RECIPE={recipe}").returncode == 0
    assert fake.commands() == ["train flow", "sample samples-unguided.zarr", "fd", "sample samples-guided.zarr", "fd",
                               "sample samples-interval.zarr", "fd", "fd_table.py"]
    assert all("--force" in call for call in fake.calls if call[0] in ("train", "sample"))


def test_a_new_guidance_scale_resamples_only_the_guided_sets(tmp_path):
    fake = Fake(tmp_path, "flow-digits.mk")
    assert fake.make("OUT=out").returncode == 0
    assert fake.make("OUT=out", "SCALE=4").returncode == 0
    assert fake.commands() == ["sample samples-guided.zarr", "fd", "sample samples-interval.zarr", "fd", "fd_table.py"]


def _checkout(tmp_path: Path) -> Path:
    """The recipes and scripts alone, with no .venv beside them."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "recipes", checkout / "recipes")
    return checkout


def _venv_jepa(where: Path) -> Path:
    jepa = where / ".venv" / "bin" / "jepa"
    jepa.parent.mkdir(parents=True)
    jepa.write_text("#!/bin/sh\n")
    jepa.chmod(0o755)
    return jepa


def _plan_without_jepa(checkout: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "JEPA"} | {"PATH": "/usr/bin:/bin"}
    return subprocess.run(["make", "--no-print-directory", "-n", "-f", str(checkout / "recipes" / "ijepa-folder.mk"),
                           "SOURCE=builtin:digits", f"RECIPE={ROOT}/jepa_cli/recipes/ijepa-small32.toml"],
                          cwd=cwd, capture_output=True, text=True, env=env, timeout=60)


def test_jepa_is_the_venv_in_the_current_directory_when_there_is_one(tmp_path):
    checkout = _checkout(tmp_path)
    _venv_jepa(tmp_path)
    plan = _plan_without_jepa(checkout, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "\n./.venv/bin/jepa ingest 'builtin:digits' 'folder-run/data-train.zarr'" in plan.stdout


def test_jepa_is_the_checkouts_venv_from_another_directory(tmp_path):
    checkout = _checkout(tmp_path)
    _venv_jepa(checkout)
    (tmp_path / "elsewhere").mkdir()
    plan = _plan_without_jepa(checkout, cwd=tmp_path / "elsewhere")
    assert plan.returncode == 0, plan.stderr
    assert f"{checkout}/recipes/../.venv/bin/jepa ingest 'builtin:digits'" in plan.stdout


def test_without_any_jepa_make_says_where_it_looked_in_one_line(tmp_path):
    checkout = _checkout(tmp_path)
    plan = _plan_without_jepa(checkout, cwd=tmp_path)
    assert plan.returncode == 2
    [line] = plan.stderr.splitlines()
    assert line.endswith("*** jepa not found: no ./.venv/bin/jepa and no jepa on the PATH; run `make venv` in the"
                         " checkout, or set JEPA=/path/to/jepa.  Stop.")


def test_a_missing_recipe_file_is_named_in_one_line(tmp_path):
    fake = Fake(tmp_path)
    done = fake.make("OUT=out", "RECIPE=nowhere.toml")
    assert done.returncode == 2 and fake.calls == []
    [line] = done.stderr.splitlines()
    assert line.endswith("*** RECIPE=nowhere.toml: no such file.  Stop.")
