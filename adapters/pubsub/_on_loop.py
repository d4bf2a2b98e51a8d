"""`on_loop`: run a call on the event loop's thread, from whichever thread it comes.

A Kafka delivery report runs on the loop's own thread when the loop serves the producer's
reports (broker/report_pipe.py), and on another thread when a poll thread or a `flush` served
it. State the loop owns is touched only from the loop, so the report hands its work over: from
the loop's thread with `call_soon` (no self-pipe write, no extra wake-up: it runs in the
loop's next turn, after the report's own callbacks), from any other with
`call_soon_threadsafe`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

__all__ = ["on_loop"]


def on_loop(loop: asyncio.AbstractEventLoop) -> Callable[[Callable[[], None]], object]:
    """A `defer(call)` for `loop`; make it on the loop's thread (it remembers that thread)."""
    mine = threading.get_ident()
    soon, threadsafe = loop.call_soon, loop.call_soon_threadsafe

    def defer(call: Callable[[], None]) -> object:
        if threading.get_ident() == mine:
            return soon(call)
        return threadsafe(call)

    return defer
