"""Run a benchmark process's coroutine, under cProfile when asked: its top functions go to
stderr, sorted by PROF_SORT (default tottime), PROF_N rows (default 30). It runs on the loop
the commands use (`adapters.cli.loop`: uvloop where installed), so figures match `apexps up`."""

from __future__ import annotations

import os
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from adapters.cli import loop as event_loop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T], *, profile: bool = False) -> T:
    if not profile:
        return event_loop.run(main)
    import cProfile
    import pstats

    with cProfile.Profile() as prof:
        result = event_loop.run(main)
    pstats.Stats(prof, stream=sys.stderr).sort_stats(os.environ.get("PROF_SORT", "tottime")) \
        .print_stats(int(os.environ.get("PROF_N", "30")))
    return result
