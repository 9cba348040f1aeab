"""What is learned: Objective implementations behind one seam (see docs/architecture.md).

The objectives' modules import JAX, so this package loads them on first use (PEP 562): the CLI reads
objectives/genconfig.py to declare `jepa train`'s options, and `jepa train --help` or a refused option
must not pay for importing JAX.
"""

from __future__ import annotations

from typing import Any

from jepa_cli.errors import InputError
from jepa_cli.lazy import lazy_exports
from jepa_cli.names import OBJECTIVE_NAMES

_EXPORTS = {"AudioJEPAObjective": "audio_jepa", "DiffusionObjective": "diffusion", "EMASpec": "base",
            "FlowObjective": "flow", "IJEPAConfig": "ijepa_config", "IJEPAObjective": "ijepa", "LeJEPAConfig": "lejepa_config",
            "LeJEPAObjective": "lejepa", "Objective": "base",
            "VJEPAConfig": "vjepa", "VJEPAObjective": "vjepa"}  # name -> the module that defines it
_REGISTRY = {"ijepa": "IJEPAObjective", "vjepa": "VJEPAObjective", "audio-jepa": "AudioJEPAObjective",
             "flow": "FlowObjective", "diffusion": "DiffusionObjective", "lejepa": "LeJEPAObjective"}  # --objective name -> class
assert tuple(_REGISTRY) == OBJECTIVE_NAMES

__all__ = [*sorted(_EXPORTS), "OBJECTIVES", "make_objective"]


_exported = lazy_exports(__name__, _EXPORTS)


def __getattr__(name: str) -> Any:
    if name == "OBJECTIVES":  # dict[str, type]: every objective class by its --objective name
        return {key: _exported(cls) for key, cls in _REGISTRY.items()}
    return _exported(name)


def make_objective(name: str, config: dict | None = None):
    """Build an objective from its name and a flat dict of options (unknown key: InputError)."""
    if name not in _REGISTRY:
        raise InputError(f"unknown objective {name!r} (choose from {', '.join(_REGISTRY)})")
    return _exported(_REGISTRY[name]).from_config(dict(config or {}))
