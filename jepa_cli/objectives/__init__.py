"""What is learned: Objective implementations behind one seam (see docs/architecture.md)."""

from __future__ import annotations

from jepa_cli.errors import InputError
from jepa_cli.objectives.base import EMASpec, Objective
from jepa_cli.objectives.audio_jepa import AudioJEPAObjective
from jepa_cli.objectives.diffusion import DiffusionObjective
from jepa_cli.objectives.flow import FlowObjective
from jepa_cli.objectives.ijepa import IJEPAConfig, IJEPAObjective
from jepa_cli.objectives.vjepa import VJEPAConfig, VJEPAObjective

OBJECTIVES: dict[str, type] = {"ijepa": IJEPAObjective, "vjepa": VJEPAObjective, "audio-jepa": AudioJEPAObjective,
                               "flow": FlowObjective, "diffusion": DiffusionObjective}

__all__ = ["AudioJEPAObjective", "DiffusionObjective", "EMASpec", "FlowObjective", "IJEPAConfig", "IJEPAObjective",
           "OBJECTIVES", "Objective", "VJEPAConfig", "VJEPAObjective", "make_objective"]


def make_objective(name: str, config: dict | None = None) -> Objective:
    """Build an objective from its name and a flat dict of options (unknown key: InputError)."""
    if name not in OBJECTIVES:
        raise InputError(f"unknown objective {name!r} (choose from {', '.join(OBJECTIVES)})")
    return OBJECTIVES[name].from_config(dict(config or {}))
