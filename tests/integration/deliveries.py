"""Collecting what a `PubsubClient` is delivered, for tests that count deliveries."""

from __future__ import annotations

import asyncio

from adapters.client.pubsub_client import Delivered, PubsubClient


async def deliveries(client: PubsubClient, count: int, timeout_s: float = 30) -> list[Delivered]:
    """The next `count` messages delivered to `client` (other events skipped); TimeoutError if
    one takes longer than `timeout_s`."""
    out: list[Delivered] = []
    events = client.events()
    while len(out) < count:
        event = await asyncio.wait_for(anext(events), timeout_s)
        if isinstance(event, Delivered):
            out.append(event)
    return out
