"""Values as plain JSON data, as every file and `--json` output of the toolkit holds them
(docs/formats.md): a NaN or infinite number as null (RFC 8259 has no such number)."""

from __future__ import annotations

import json
import math
from typing import Any


def json_value(value: Any) -> Any:
    """`value` as plain JSON data, recursively: a mapping as a dict with string keys (converted as
    json.dumps converts them: 1 -> "1", True -> "true"), a tuple or list as a list, a NumPy or JAX
    array or scalar as its `tolist()`, a float NaN or infinity as None, str, bool, int and None as
    they are, and anything else as its `str`. What a record reads back as after `json.dumps` and
    `json.loads`, so a freshly built record compares equal to one read from disk."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key if isinstance(key, str) else _json_key(key): json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(item) for item in value]
    if hasattr(value, "tolist"):
        return json_value(value.tolist())
    return str(value)


def _json_key(key: Any) -> str:
    """A mapping key that is not a string: None, a bool or a number as json.dumps writes it, else its str."""
    return json.dumps(key) if key is None or isinstance(key, (bool, int, float)) else str(key)
