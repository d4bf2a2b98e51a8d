"""`CatchUps`: read-your-writes waits on the journal follower, many waiters per query.

A request that reads the item state (a watch's current state, a subscribe with `cached`, an
approval) first waits until the journal follower has handed on everything the journal held
when the request came (`JournalFollower.when_read`: a watermark query to Kafka, in a worker
thread, then a callback once the follower has read that far). One query per request made 1,000
watches arriving together 1,000 watermark queries, one at a time (the follower's end reader is
one consumer, under a lock) behind six worker threads: at load 8 some of them waited past the
gateway's 30 s.

So waiters share queries. A waiter joins the *next* query, the one not started yet; a query
takes every waiter that joined before it started, and once it is under way the next waiter
begins a new batch, which the following query takes. Each waiter is thus served by a query
that started after it came -- what read-your-writes needs -- and there are never more than one
query running and one batch waiting, whatever the number of waiters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["CatchUps", "WhenRead"]

#: `JournalFollower.when_read`: blocks for the watermark query, then calls the callback (in
#: some thread) once the follower has read everything the journal held then.
WhenRead = Callable[[Callable[[], None]], None]


class CatchUps:
    def __init__(self, when_read: WhenRead, loop: asyncio.AbstractEventLoop) -> None:
        self._when_read, self._loop = when_read, loop
        #: the batch the next query will take (None: nobody waits for one)
        self._next: asyncio.Future[None] | None = None
        self._querying = False
        #: watermark queries made (tests, the benchmark)
        self.queries = 0

    async def wait(self, timeout: float) -> None:
        """Until the follower has handed on what the journal holds now; TimeoutError after
        `timeout` seconds, or what the watermark query raised."""
        if self._next is None:
            self._next = self._loop.create_future()
            if not self._querying:
                self._loop.create_task(self._query())
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._next)

    async def _query(self) -> None:
        self._querying = True
        try:
            while self._next is not None:
                batch, self._next = self._next, None
                self.queries += 1
                try:
                    await asyncio.to_thread(self._when_read, self._resolver(batch))
                except Exception as exc:  # the watermark query failed: every waiter hears it
                    if not batch.done():
                        batch.set_exception(exc)
                        batch.exception()  # retrieved here: waiters that timed out are gone
        finally:
            self._querying = False

    def _resolver(self, batch: asyncio.Future[None]) -> Callable[[], None]:
        def done() -> None:
            if not batch.done():
                batch.set_result(None)

        def hop() -> None:  # any thread
            self._loop.call_soon_threadsafe(done)

        return hop
