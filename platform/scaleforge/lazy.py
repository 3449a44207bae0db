"""Package exports imported on first use.

A job's pre-flight imports one module of a package (``scaleforge.train.preflight``), and Python
imports the package's ``__init__`` first: when that imports the package's job (Ray Train, Ray Data,
matplotlib), a config that cannot run waits seconds for its one-line error. The packages whose job
is heavy name their exports here instead (PEP 562).
"""

import importlib
from typing import Any, Callable


def lazy_exports(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``homes[name]`` (a module) when ``package.name`` is first
    used."""

    def __getattr__(name: str) -> Any:
        if name in homes:
            return getattr(importlib.import_module(homes[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
