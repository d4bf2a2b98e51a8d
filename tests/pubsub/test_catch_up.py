"""`CatchUps` (adapters/pubsub/_catch_up.py): waiters share the follower's watermark queries,
and each is served by a query that started after it came."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from adapters.pubsub._catch_up import CatchUps


class _Follower:
    """A `when_read` that keeps each query's callback for the test to call (the follower
    having read that far), and can hold a query in its thread until released."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.callbacks: list[Callable[[], None]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.started = asyncio.Event()
        self.answered = asyncio.Event()

    def when_read(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon_threadsafe(self.started.set)
        self.hold.wait()
        self.callbacks.append(callback)
        self.loop.call_soon_threadsafe(self.answered.set)


def test_waiters_that_come_together_share_one_query() -> None:
    """A hundred waits begun in one turn make one watermark query, and all end when the
    follower has read what it named."""

    async def run() -> None:
        follower = _Follower(asyncio.get_running_loop())
        ups = CatchUps(follower.when_read, asyncio.get_running_loop())
        waits = [asyncio.ensure_future(ups.wait(30)) for _ in range(100)]
        await follower.answered.wait()
        assert not any(w.done() for w in waits)
        follower.callbacks[0]()
        await asyncio.gather(*waits)
        assert ups.queries == 1

    asyncio.run(run())


def test_a_waiter_after_the_query_began_waits_for_the_next() -> None:
    """One that comes while a query is under way is not served by it (that query may have
    asked Kafka before its request came), but by the next, which starts right after."""

    async def run() -> None:
        follower = _Follower(asyncio.get_running_loop())
        follower.hold.clear()
        ups = CatchUps(follower.when_read, asyncio.get_running_loop())
        first = asyncio.ensure_future(ups.wait(30))
        await follower.started.wait()  # the first query is in its thread
        second = asyncio.ensure_future(ups.wait(30))
        await asyncio.sleep(0)  # the second waiter has joined
        follower.answered.clear()
        follower.hold.set()
        await follower.answered.wait()
        follower.callbacks[0]()
        await first
        assert not second.done()
        while len(follower.callbacks) < 2:  # the second query, for the second waiter
            follower.answered.clear()
            await follower.answered.wait()
        follower.callbacks[1]()
        await second
        assert ups.queries == 2

    asyncio.run(run())


def test_a_failed_query_reaches_its_waiters() -> None:
    """The watermark query's error (Kafka not answering) is every waiter's of that query."""

    async def run() -> None:
        def when_read(_callback: Callable[[], None]) -> None:
            raise ConnectionError("no answer")

        ups = CatchUps(when_read, asyncio.get_running_loop())
        with pytest.raises(ConnectionError):
            await asyncio.gather(ups.wait(30), ups.wait(30))

    asyncio.run(run())
