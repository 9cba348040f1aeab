"""`--json` output is strict JSON (cli/common.py emit): NaN and infinities, which Python's json would
write as the non-standard NaN / Infinity that jq and other strict parsers refuse, are written as null."""

from __future__ import annotations

import json
import math

import numpy as np

from jepa_cli.cli.common import emit


def _strict(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as RFC 8259 parsers do."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_writes_non_finite_numbers_as_null(capsys):
    emit({"loss": math.nan, "curve": [1.5, math.inf, -math.inf], "nested": {"top5": float("nan")},
          "array": np.array([0.25, np.nan], np.float32), "scalar": np.float32("inf"), "ok": 2.0}, as_json=True)
    assert _strict(capsys.readouterr().out) == {"loss": None, "curve": [1.5, None, None], "nested": {"top5": None},
                                                "array": [0.25, None], "scalar": None, "ok": 2.0}


def test_human_output_still_shows_nan(capsys):
    emit({"loss": math.nan}, as_json=False)
    assert "nan" in capsys.readouterr().out
