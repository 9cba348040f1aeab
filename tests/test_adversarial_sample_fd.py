"""Hostile input to `jepa sample` and `jepa fd` (tests/adversarial.py): one error line, exit 2,
nothing written."""

from __future__ import annotations

import json

import numpy as np
from adversarial import expect_refusal

from jepa_cli.data import store


def test_sampling_a_run_that_is_not_generative_writes_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"config": {"objective": "ijepa"}, "lengths": {"steps": 1}}))
    expect_refusal("sample", run, "-o", tmp_path / "s.zarr", "--png", tmp_path / "s.png", guard=[tmp_path],
                   fragments=["is not generative"])


def test_fd_of_datasets_of_different_dimensions_writes_nothing(tmp_path):
    for name, dim in (("a.zarr", 3), ("b.zarr", 4)):
        store.write_group(tmp_path / name, store.base_attributes("dataset", modality="latent", layout="ND",
                                                                 class_names=[]))
        store.write_array(tmp_path / name / "inputs", np.ones((5, dim), np.float32))
    expect_refusal("fd", tmp_path / "a.zarr", tmp_path / "b.zarr", guard=[tmp_path],
                   fragments=["3-dimensional", "has 4"])
