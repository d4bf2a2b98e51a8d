"""The garbage collector of a long-running server process, set once it has started.

Why. CPython's cyclic collector runs a young collection every 700 net container allocations
and, every hundred of those, a full one that walks every tracked object in the process. A
started broker holds a few hundred thousand of them that live as long as it does (modules,
lxml and Avro schemas, compiled readers, the access rules), so a full collection cost it
50 to 120 ms, measured on the pubsub benchmark: a stall of every delivery in flight, which is
what a p99 target of 20 ms cannot absorb. `gc.freeze()` moves what exists once the broker is
up into a generation no collection walks (the Python docs' own recipe for servers), and a
higher young threshold makes collections fewer; the delivery path's own objects die young, by
reference counting, so few cycles wait for the collector meanwhile.

The gateway (`apexps gateway`) is such a server too: 1,000 SSE streams and the aiohttp,
BEEP and lxml machinery behind them. Over a 1,000-watch run of ops/bench/bench_gateway.py
--stages it had 95 young, 20 middle and 2 full collections of over 1 ms unsettled (the
longest 39, 230 and 327 ms, at load 6.9), and 8, 3 and 1 settled (61, 136 and 54 ms, load
8-16). How long one takes on a loaded machine is mostly the scheduler's doing (settled middle
ones of 336 and 620 ms were seen at load 18-21); how many there are is this setting's.

Only the processes that serve call this (`apexps up`/`apexps broker`/`apexps gateway`, and the
benchmarks' servers, which stand for them); a library would not change its host's collector.
"""

from __future__ import annotations

import gc

__all__ = ["GEN0_THRESHOLD", "settle"]

#: Net container allocations between young collections (CPython's default is 700).
GEN0_THRESHOLD = 10_000


def settle() -> None:
    """Freeze what the started process holds and space the collections out."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
