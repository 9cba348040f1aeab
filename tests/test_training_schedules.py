"""Schedules, optimizer, mesh rule and config parsing: no training, no compile beyond tiny ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jepa_cli.errors import InputError
from jepa_cli.training import config as config_lib
from jepa_cli.training import mesh as mesh_lib
from jepa_cli.training import optimizer

# The official ViT-H/14 run: ImageNet-1k 1,281,167 images / batch 2048 -> ipe 625, 300 epochs, warmup 40.
IPE, EPOCHS = 625, 300
T_MAX = int(1.0 * EPOCHS * IPE)


def test_ijepa_momentum_matches_official_generator():
    from jepa_cli.objectives import make_objective

    obj = make_objective("ijepa", {"model": "tiny", "patch_size": 4, "image_size": 16, "channels": 1})
    obj = obj.with_total_updates(T_MAX)
    for i in (0, 1, 5000, T_MAX):
        assert float(obj.ema_spec.momentum(i)) == pytest.approx(0.996 + i * (1.0 - 0.996) / (IPE * EPOCHS * 1.0), rel=1e-7)


def test_adamw_matches_torch_formula():
    """Decoupled decay on masked leaves, none on biases; Adam moments as torch.optim.AdamW."""
    lr_fn = lambda s: jnp.asarray(0.1)  # noqa: E731
    wd_fn = lambda s: jnp.asarray(0.5)  # noqa: E731
    params = {"w": jnp.array([[1.0, -2.0]]), "bias": jnp.array([3.0])}
    grads = {"w": jnp.array([[0.5, 0.25]]), "bias": jnp.array([1.0])}
    tx = optimizer.make_optimizer(lr_fn, wd_fn, {"w": True, "bias": False})
    updates, _ = tx.update(grads, tx.init(params), params)
    new = jax.tree.map(lambda p, u: p + u, params, updates)
    for name, decay in (("w", True), ("bias", False)):
        p, g = np.asarray(params[name]), np.asarray(grads[name])
        m, v = 0.1 * g / (1 - 0.9), 0.001 * g * g / (1 - 0.999)
        want = p * (1 - 0.1 * 0.5 * decay) - 0.1 * m / (np.sqrt(v) + 1e-8)
        np.testing.assert_allclose(np.asarray(new[name]), want, rtol=1e-6)


def test_mesh_parse_and_rule():
    assert mesh_lib.parse_mesh("data=-1,fsdp=2") == {"data": -1, "fsdp": 2}
    assert mesh_lib.resolve_mesh_shape("data=-1,fsdp=2", 8) == {"data": 4, "fsdp": 2}
    assert mesh_lib.resolve_mesh_shape("fsdp=8", 8) == {"data": 1, "fsdp": 8}
    for bad in ("data=16", "model=2", "data", "data=x", "data=-1,fsdp=-1"):
        with pytest.raises(InputError):
            mesh_lib.resolve_mesh_shape(bad, 8)
    assert mesh_lib.leaf_spec((192, 768), 8) == jax.sharding.PartitionSpec(None, "fsdp")
    assert mesh_lib.leaf_spec((12, 5), 8) == jax.sharding.PartitionSpec()
    assert mesh_lib.leaf_spec((16, 3), 8) == jax.sharding.PartitionSpec("fsdp", None)
    assert mesh_lib.leaf_spec((192,), 1) == jax.sharding.PartitionSpec()


def test_make_mesh_takes_the_first_devices_with_auto_axes():
    mesh = mesh_lib.make_mesh("data=2,fsdp=2")  # 4 of the 8 simulated CPU devices
    assert [[d.id for d in row] for row in mesh.devices] == [[0, 1], [2, 3]]
    assert mesh.axis_names == ("data", "fsdp")
    assert mesh.axis_types == (jax.sharding.AxisType.Auto,) * 2


def test_epochs_making_more_updates_than_the_int32_count_are_refused():
    cfg = config_lib.build_config({"epochs": 1e12, "batch_size": 8})
    with pytest.raises(InputError, match=r"^--epochs 1e\+12 makes 5e\+12 updates of 8; a run is at most 2147483647"):
        config_lib.resolve_lengths(cfg, num_samples=40)


@pytest.mark.slow
def test_toml_unknown_key_and_layers(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('steps = 5\nbatch_size = 8\n[ijepa]\nmodel = "small"\n')
    cfg = config_lib.resolve_config({"batch_size": 16, "objective_config": {"patch_size": 8}}, recipe)
    assert (cfg.steps, cfg.batch_size) == (5, 16)  # the command line wins
    assert cfg.objective_config == {"model": "small", "patch_size": 8}
    recipe.write_text("steps = 5\nlearning_rate = 0.1\n")
    with pytest.raises(InputError, match="learning_rate"):
        config_lib.resolve_config({}, recipe)


def test_recipes_parse():
    from pathlib import Path

    from jepa_cli.objectives import make_objective

    root = Path(__file__).resolve().parents[1] / "jepa_cli" / "recipes"
    for path in sorted(root.glob("*.toml")):
        cfg = config_lib.resolve_config({}, path)
        make_objective(cfg.objective, cfg.objective_config)  # every key is known to the objective
    vith = config_lib.resolve_config({}, root / "ijepa-in1k-vith14.toml")
    assert (vith.lr, vith.start_lr, vith.final_lr, vith.warmup_epochs, vith.epochs) == (1e-3, 2e-4, 1e-6, 40, 300)
    assert (vith.wd, vith.final_wd, vith.batch_size, vith.ipe_scale) == (0.04, 0.4, 2048, 1.0)
    assert vith.objective_config["model"] == "huge" and vith.objective_config["patch_size"] == 14


@pytest.mark.slow
@pytest.mark.parametrize("text, expected", [
    ('steps = "two"', "steps must be an integer in 0..2147483647, got 'two'"),
    ("batch_size = 1.5", "batch_size must be an integer >= 1, got 1.5"),
    ('betas = "x"', "betas must be two numbers in [0, 1) such as 0.9,0.999, got 'x'"),
    ("seed = 4294967296", "seed must be an integer in 0..4294967295, got 4294967296"),
    ("seed = -1", "seed must be an integer in 0..4294967295, got -1"),
    ("lr = 0.0", "lr must be a number > 0, got 0.0"),
    ("lr = nan", "lr must be a number > 0, got nan"),
    ("steps = -3", "steps must be an integer in 0..2147483647, got -3"),
    ("steps = 99999999999999999999", "steps must be an integer in 0..2147483647, got 99999999999999999999"),
    ("batch_size = 0", "batch_size must be an integer >= 1, got 0"),
    ("async_checkpointing = 1", "async_checkpointing must be true or false, got 1"),
    ("objective = 3", "objective must be one of ijepa, vjepa, audio-jepa, flow, diffusion, lejepa or module:factory, got 3"),
    ("[ijepax]\ndepth = 1", "unknown table [ijepax] (the objective's options go in [ijepa])"),
])
def test_toml_value_out_of_type_or_range_names_the_file_and_key(tmp_path, text, expected):
    recipe = tmp_path / "r.toml"
    recipe.write_text(text + "\n")
    with pytest.raises(InputError) as exc:
        config_lib.resolve_config({}, recipe)
    assert str(exc.value) == f"{recipe}: {expected}"


@pytest.mark.slow
def test_toml_syntax_error_names_the_line(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("steps = 3\nbatch_size = = 4\n")
    with pytest.raises(InputError, match=r"r\.toml: not valid TOML \(.*line 2"):
        config_lib.resolve_config({}, recipe)


def test_command_line_value_out_of_range_names_the_option():
    with pytest.raises(InputError, match=r"^--batch-size must be an integer >= 1, got 0$"):
        config_lib.build_config({"batch_size": 0})
