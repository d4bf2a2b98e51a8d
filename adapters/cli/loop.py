"""The event loop every command runs on: uvloop where it is installed, asyncio's own otherwise.

uvloop (libuv underneath) is a drop-in `asyncio` loop; on this project's benchmark machine it
lifts bare TCP round trips through one process from ~20,000/s to ~70,000/s, which is the floor
under every APEX operation (`ops/bench/bench_apex.py`). `APEXPS_EVENT_LOOP=asyncio` forces the
standard loop, e.g. to rule the loop out while chasing a bug.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["ENV", "loop_factory", "loop_name", "run"]

T = TypeVar("T")

#: Environment variable naming the loop: `uvloop` (the default when installed) or `asyncio`.
ENV = "APEXPS_EVENT_LOOP"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None for asyncio's default (the variable says so, or uvloop
    is not installed)."""
    wanted = os.environ.get(ENV, "uvloop").strip().lower()
    if wanted == "asyncio":
        return None
    if wanted != "uvloop":
        raise SystemExit(f"{ENV}={wanted!r}: say uvloop or asyncio")
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name() -> str:
    """Which loop `run` uses: "uvloop" or "asyncio"."""
    return "asyncio" if loop_factory() is None else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
