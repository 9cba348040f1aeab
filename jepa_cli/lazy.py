"""Packages whose modules import JAX but whose names the CLI needs before JAX loads (PEP 562)."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: each name in `exports` is read from the submodule it
    maps to, imported on first use; any other name is an AttributeError."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
