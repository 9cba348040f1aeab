"""The token-mixer pattern of a block stack (option `mixer`) and the scan-order names, without JAX: the
CLI checks them before JAX loads.

A pattern is a comma-separated list of mixer names (`attn`, `s5`); block i of a stack of depth d gets
entry i mod len(pattern), so `s5,s5,s5,attn` is a 3:1 hybrid at a depth that is a multiple of 4 (at
depth 6: s5, s5, s5, attn, s5, s5) and a list of d names sets every block. One pattern serves the
encoder and the predictor (each repeats it to its own depth), unless `pred_mixer` gives the predictor
its own.
"""

from __future__ import annotations

from jepa_cli.errors import InputError

MIXERS = ("attn", "s5")  # attn: models/block.py Attention; s5: models/s5.py S5Mixer
SCAN_ORDERS = ("raster", "serpentine", "hilbert")  # models/scan_order.py
SSM_GAPS = ("skip", "elapse")  # models/s5.py: what a masked hole in the scan is to the recurrence
SSM_STEP = (1e-3, 1e-1)  # S5's initial step range: lindermanlab/S5 ssm.py init_log_steps (dt_min, dt_max)
# The largest state size P: every S5 block's initialisation takes the dense eigendecomposition of a P x P
# matrix (models/s5.py hippo_n), O(P^2) memory and O(P^3) time: 0.6 s at 1024, 7 s at 2048 on 2 CPU cores,
# per block (the default is 64). 200,000 would need 298 GiB.
MAX_SSM_STATE = 2048
# The initial steps' range in float32: the state keeps exp(-step / 2) of itself from one token to the next.
# Below 1e-6 that rounds to 1 (and B_bar, its distance from 1, to 0: the block takes no input); at 100 it
# is already e^-50 (the state forgets at once), and past about 200 it underflows to 0.
SSM_STEP_LIMITS = (1e-6, 100.0)
ATTENTION_IMPLS = ("xla", "dot_product")  # models/block.py Attention.impl
# the objectives whose models take the mixer options (`jepa train --help` names them): the JEPA encoders
# and predictors (ModelConfig), the generative objectives' DiT (GenerativeConfig) and LeJEPA's encoder
JEPA_MIXER_APPLIES = ("ijepa", "vjepa", "audio-jepa")  # `pred_mixer`: the objectives with a predictor
MIXER_APPLIES = JEPA_MIXER_APPLIES + ("flow", "diffusion", "lejepa")


def check_ssm(state: int, step) -> None:
    """Refuses S5 options no layer can take: a state size that is not an even number >= 2 (P/2
    conjugate pairs are stored) or is over MAX_SSM_STATE, a step range that is not 0 < LO <= HI or
    leaves SSM_STEP_LIMITS."""
    if state < 2 or state % 2:
        raise InputError(f"ssm_state must be an even number >= 2 (P/2 conjugate pairs are stored), got {state}")
    if state > MAX_SSM_STATE:
        raise InputError(f"ssm_state must be at most {MAX_SSM_STATE} (each S5 block's initialisation "
                         f"eigendecomposes a dense P x P matrix: O(P^2) memory, O(P^3) time), got {state}")
    low, high = step
    if not 0 < low <= high < float("inf"):
        raise InputError(f"ssm_step must be LO,HI with 0 < LO <= HI, got {low},{high}")
    least, most = SSM_STEP_LIMITS
    if not least <= low <= high <= most:
        raise InputError(f"ssm_step must lie within {least:g}..{most:g} (in float32 a smaller step leaves the "
                         f"state unchanged and the input unread, a larger one forgets the state at every token), "
                         f"got {low:g},{high:g}")


def parse_mixer(pattern: str, depth: int, what: str = "encoder") -> tuple[str, ...]:
    """The mixer of each of `depth` blocks named by `pattern` ('s5,attn' -> s5, attn, s5, attn, ...).
    An empty pattern or entry, an unknown name, or more entries than `depth` is an InputError."""
    names = [word.strip() for word in str(pattern).split(",")]
    if not pattern or not str(pattern).strip() or any(not n for n in names):
        raise InputError(f"mixer pattern {pattern!r} has an empty entry (write names such as s5,s5,s5,attn)")
    unknown = [n for n in names if n not in MIXERS]
    if unknown:
        raise InputError(f"unknown mixer {unknown[0]!r} in pattern {pattern!r} (choose from {', '.join(MIXERS)})")
    if len(names) > depth:
        raise InputError(f"mixer pattern {pattern!r} names {len(names)} blocks but the {what} has {depth}")
    return tuple(names[i % len(names)] for i in range(depth))
