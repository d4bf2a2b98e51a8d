"""Batches (docs/robust-binding.md §5.4) on real Kafka and the real BEEP wire: a gap fill asked
for with `batch=` hands the subscriber exactly what the unbatched one does — data, heartbeats,
withheld seqs, content too large for a batch — in the same order; and a subscriber that asked
on subscribe gets live data packed, the same items in fewer APEX data."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from adapters.apex.batch_codec import BATCH_ITEM_CONTENT, decode_batch
from adapters.apex.codec import Data
from adapters.apex.robust_stamp import StampKind, find_stamp
from adapters.app import BrokerApp
from adapters.client.client import ApexClient
from adapters.client.pubsub_client import Delivered, Ended, LinkEvent, PubsubClient
from broker.entitlements import parse_token_set
from broker.kafka_io import KafkaConfig
from broker.records import AccessEffect, AccessEntry, AccessKind, Publication, now_ms
from broker.robust.config import RobustConfig

pytestmark = pytest.mark.kafka

Event = Delivered | Ended | LinkEvent
LINK = "jade-batch"
#: Heartbeats every 100 ms, so an idle moment puts one on the link.
BEATING = RobustConfig(heartbeat_ms=100, max_gap=1000)


async def _next(events: AsyncIterator[Event]) -> Event:
    return await asyncio.wait_for(anext(events), 30)


def _view(event: Event) -> tuple[object, ...]:
    """What the application sees of an item (the refill flag aside: live items lack it)."""
    assert not isinstance(event, Ended)
    s = event.stamp
    assert s is not None
    body = (event.content, event.content_type) if isinstance(event, Delivered) \
        else (type(event.document).__name__,)
    return (s.link_seq, s.kind, s.epoch, s.source, s.source_seq, s.topic, s.token, *body)


async def _run(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=BEATING) as app:
        connect = lambda who: PubsubClient.connect(  # noqa: E731
            "127.0.0.1", app.port, who, link_events=True)
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic("q.b")
        await jade.subscribe("q.b", 600, link=LINK)
        events = jade.events()
        live: list[Event] = []

        async def take(kind: StampKind) -> None:
            """Take live items up to the next one of `kind`."""
            while True:
                event = await _next(events)
                assert event.stamp is not None
                if event.stamp.kind is StampKind.RESET:
                    continue
                live.append(event)
                if event.stamp.kind is kind:
                    return

        big = bytes(range(256)) * (BATCH_ITEM_CONTENT // 256 + 1)
        plan = [(b"a0", None), (b"a1", "6747"), (big, None), (b"a3", None), (b"a4", "6747"),
                (b"a5", None)]
        for k, (body, token) in enumerate(plan):
            await pub.publish("q.b", body, "application/octet-stream", token=token)
            await take(StampKind.DATA)
            if k in (1, 3):
                await take(StampKind.HEARTBEAT)  # idle: a heartbeat takes a link seq
        first, last = live[0].stamp, live[-1].stamp
        assert first is not None and last is not None
        assert [e.stamp.link_seq for e in live if e.stamp] == \
            list(range(first.link_seq, last.link_seq + 1))

        # jade may no longer see 6747: those seqs come back withheld, batched or not
        seen = asyncio.Event()
        app.core.access.watch(lambda key, item: seen.set() if key == "t:deny" else None)
        app.access.put(AccessEntry("t:deny", "jade@example.com", parse_token_set("6747").items,
                                   AccessEffect.DENY, now_ms(), kind=AccessKind.PERMTOKEN))
        await asyncio.wait_for(seen.wait(), 30)

        async def refill(batch: int | None) -> list[Event]:
            reply = await jade.gap(LINK, first.link_seq, last.link_seq, batch=batch)
            assert (reply.code, reply.link_seq) == (250, last.link_seq)
            got: list[Event] = []
            while len(got) < len(live):
                event = await _next(events)
                assert event.stamp is not None
                if event.stamp.refill:
                    got.append(event)
            return got

        one_each, batched = await refill(None), await refill(3)
        assert [_view(e) for e in batched] == [_view(e) for e in one_each]
        kinds = [e.stamp.kind for e in batched if e.stamp]
        assert kinds.count(StampKind.HEARTBEAT) >= 2 and kinds.count(StampKind.WITHHELD) == 2
        assert big in [e.content for e in batched if isinstance(e, Delivered)]
        assert all(e.stamp is not None and e.stamp.refill for e in batched)
        for c in (pub, jade):
            await c.close()


def test_a_batched_gap_fill_hands_over_what_an_unbatched_one_does(
        kafka_config: KafkaConfig) -> None:
    asyncio.run(_run(kafka_config))


# --- live data ------------------------------------------------------------------------------


async def _live(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=RobustConfig(heartbeat_ms=600_000)) as app:
        admin = await PubsubClient.connect("127.0.0.1", app.port, "admin@example.com")
        await admin.create_topic("q.l")
        wires: dict[int | None, tuple[ApexClient, asyncio.Queue[Data]]] = {}
        for batch in (None, 8):
            who = f"w{batch}@example.com"
            client = await ApexClient.connect("127.0.0.1", app.port)
            await client.attach(who)
            inbox: asyncio.Queue[Data] = asyncio.Queue()
            wires[batch] = (client, inbox)
            asyncio.create_task(_pump(client, inbox))  # noqa: RUF006 - ends with the client
            await admin.subscribe("q.l", 600, subscriber=who, batch=batch)
        # one append of 20: the follower hands them over in one or a few polls
        done = asyncio.get_running_loop().create_future()
        app.core.journal.append_many(
            [Publication("q.l", "pub@example.com", f"m{k}".encode()) for k in range(20)],
            lambda results: done.get_loop().call_soon_threadsafe(done.set_result, results))
        await done

        async def items(batch: int | None) -> tuple[int, list[tuple[int, bytes]]]:
            """How many data carried the 20 messages, and (link seq, content) of each."""
            inbox = wires[batch][1]
            carriers, got = 0, []
            while len(got) < 20:
                data = await asyncio.wait_for(inbox.get(), 30)
                if data.content.startswith(b"<batch"):
                    carriers += 1
                    batch_items = decode_batch(data.content).items
                    assert len(batch_items) <= 8
                    got += [(i.stamp.link_seq, i.content) for i in batch_items
                            if i.stamp.kind is StampKind.DATA]
                elif data.originator.subaddress == "q.l":
                    carriers += 1
                    stamp = find_stamp(data.options_of(0))
                    assert stamp is not None
                    got.append((stamp.link_seq, data.content))
            return carriers, got

        plain, packed = await items(None), await items(8)
        expected = [(k + 1, f"m{k}".encode()) for k in range(20)]
        assert plain == (20, expected)
        assert packed[1] == expected and 3 <= packed[0] < 20  # at most 8 a batch, fewer data
        for client, _ in wires.values():
            await client.close()
        await admin.close()


async def _pump(client: ApexClient, inbox: asyncio.Queue[Data]) -> None:
    async for data in client.receive():
        if data.originator.address == "apex=pubsub":
            inbox.put_nowait(data)


def test_live_data_come_packed_to_a_subscriber_that_asked(kafka_config: KafkaConfig) -> None:
    asyncio.run(_live(kafka_config))
