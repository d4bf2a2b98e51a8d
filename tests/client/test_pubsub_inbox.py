"""PubsubClient's event inbox: what `events()` yields comes in the order it was put, a waiting
reader wakes for the next, and a lost connection ends every reader, now and later."""

from __future__ import annotations

import asyncio

import pytest

from adapters.client._received import Inbox
from adapters.client.pubsub_client import Ended, PubsubClient
from common.errors import ServiceNotAvailable


def test_items_come_in_order_and_a_waiter_wakes_for_the_next() -> None:
    async def run() -> list[str]:
        inbox = Inbox()
        got: list[str] = []

        async def read(n: int) -> None:
            while len(got) < n:
                await inbox.wait()
                while inbox.items:
                    item = inbox.items.popleft()
                    assert isinstance(item, Ended)
                    got.append(item.topic)

        reader = asyncio.create_task(read(3))
        await asyncio.sleep(0)  # the reader now waits on an empty inbox
        for topic in ("a", "b", "c"):
            inbox.put_nowait(Ended(topic, "s@x"))
        await asyncio.wait_for(reader, 5)
        return got

    assert asyncio.run(run()) == ["a", "b", "c"]


def test_a_cancelled_wait_leaves_no_waiter_behind() -> None:
    async def run() -> int:
        inbox = Inbox()
        waiting = asyncio.create_task(inbox.wait())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        inbox.put_nowait(None)  # must not touch the cancelled waiter
        return len(inbox._waiters)

    assert asyncio.run(run()) == 0


def test_a_lost_connection_ends_every_reader_of_events() -> None:
    async def run() -> list[str]:
        client = PubsubClient.__new__(PubsubClient)
        client._events = Inbox()
        first, second = client.events(), client.events()
        client._events.put_nowait(Ended("t", "s@x"))
        client._events.put_nowait(None)
        out = [type(await anext(first)).__name__]
        for events in (first, second):
            try:
                await anext(events)
            except ServiceNotAvailable:
                out.append("lost")
        return out

    assert asyncio.run(run()) == ["Ended", "lost", "lost"]
