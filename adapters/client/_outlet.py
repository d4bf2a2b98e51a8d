"""Where the data a relay delivers to an application go: queued for `receive()`, or handed to
one callback as they arrive (`deliver_to`). `ApexClient` and `ReconnectingApexClient` both
have one; None marks the end (the connection, or reconnecting, is over)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog

from adapters.apex.codec import Data

__all__ = ["DataOutlet"]

log = structlog.get_logger(__name__)


class DataOutlet:
    """`put` each data (None at the end); `receive()` or `deliver_to` takes them.

    `context`: log fields that say whose consumer failed, should it raise."""

    def __init__(self, **context: Any) -> None:
        self._queue: asyncio.Queue[Data | None] = asyncio.Queue()
        self._callback: Callable[[Data | None], None] | None = None
        self._context = context

    def put(self, data: Data | None) -> None:
        if self._callback is None:
            self._queue.put_nowait(data)
            return
        try:
            self._callback(data)
        except Exception:  # the consumer's bug must not end the read loop or the supervisor
            log.exception("data consumer failed", **self._context)

    def deliver_to(self, callback: Callable[[Data | None], None]) -> None:
        """From now on hand each data to `callback` instead of queueing it; what is queued
        already goes to it first, through the same guard."""
        self._callback = callback
        while not self._queue.empty():
            self.put(self._queue.get_nowait())

    async def receive(self) -> AsyncIterator[Data]:
        """The queued data, until the end (which stays, for a later `receive()`)."""
        while True:
            data = await self._queue.get()
            if data is None:
                self._queue.put_nowait(None)
                return
            yield data
