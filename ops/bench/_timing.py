"""In-process timing shared by the micro-benchmarks (bench_codec, bench_batch)."""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable

__all__ = ["micros"]


def micros(calls: list[Callable[[], object]], number: int, repeat: int) -> list[float]:
    """Best µs of CPU per call of each of `calls`, their runs interleaved so that a burst of
    other work on the machine hits them alike."""
    timers = [timeit.Timer(call, timer=time.process_time) for call in calls]
    best = [float("inf")] * len(calls)
    for _ in range(repeat):
        for index, timer in enumerate(timers):
            best[index] = min(best[index], timer.timeit(number))
    return [b / number * 1e6 for b in best]
