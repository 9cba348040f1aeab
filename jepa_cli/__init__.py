"""jepa: a command-line toolkit for joint-embedding predictive self-supervised learning in JAX."""

__version__ = "0.1.0"
