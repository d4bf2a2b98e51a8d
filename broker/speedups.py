"""Which compiled accelerators are in use.

A few hot paths have C twins (`setup.py`). Each is optional: a build without a C compiler leaves
it out and the pure-Python code runs, with the same results. `APEXPS_PURE_PYTHON=1` in the
environment turns them all off, for a comparison or when a compiled module is suspected.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["ACCELERATORS", "active", "load"]

#: Every compiled accelerator the build may provide (the extensions of setup.py).
ACCELERATORS = ("adapters.beep._speedups", "adapters.apex._speedups", "broker._speedups")


def load(name: str) -> ModuleType | None:
    """The compiled module `name`, or None if it is not built or switched off."""
    if os.environ.get("APEXPS_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def active() -> dict[str, bool]:
    """Each accelerator and whether this process uses it."""
    return {name: load(name) is not None for name in ACCELERATORS}
