"""The fixed sets of names that options choose from, in a module without JAX: `jepa train --help`,
shell completion and option validation read them before anything heavy is imported. The modules
that implement each name check against these tuples (objectives/__init__.py, models/vit.py)."""

OBJECTIVE_NAMES = ("ijepa", "vjepa", "audio-jepa", "flow", "diffusion", "lejepa")
MODEL_NAMES = ("tiny", "small", "base", "large", "huge", "giant")  # models/config.py MODEL_SIZES
LOSSES = ("smooth_l1", "l2", "l1")  # smooth_l1: the official I-JEPA code; l2: the paper
COMPUTE_DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "dots", "block")
BUILTIN_SOURCES = ("digits", "moving-digits", "tones")  # `jepa ingest builtin:NAME` (data/sources.py BUILTINS)
