"""Coalescing in the sequenced fan-out (adapters/apex/_sequenced.py, "Coalescing"): what
`forward` is handed while an append is unsettled is gathered and appended together once it
settles. Real Kafka, real BEEP over TCP.

The entries are real journal records, published before anybody subscribed (so the follower
forwarded them to nobody) and then handed to `forward` one at a time in one event-loop step,
as a follower handing one message per poll at a paced rate would, only faster than any append
can settle."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from adapters.apex.pubsub_client import PubsubClient
from adapters.app import BrokerApp
from broker.kafka_io import KafkaConfig
from broker.records import JournalEntry
from broker.robust.config import RobustConfig
from broker.robust.links import LinkBatchCallback, LinkItem, LinkRecord
from tests.integration.deliveries import deliveries

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000)
TOPIC = "q.coalesce"
COUNT = 40


def _count_appends(app: BrokerApp) -> list[int]:
    """The size of every link-log append from now on, in order."""
    appends: list[int] = []
    append_many = app.core.links.append_many

    def counted(items: Sequence[LinkItem], callback: LinkBatchCallback) -> list[LinkRecord]:
        appends.append(len(items))
        return append_many(items, callback)

    app.core.links.append_many = counted  # type: ignore[method-assign]
    return appends


async def _coalesced(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        fanout = app.handler.sequenced
        assert fanout is not None
        pub, fred, barney = [await PubsubClient.connect("127.0.0.1", app.port, who)
                             for who in ("pub@example.com", "fred@example.com",
                                         "barney@example.com")]
        await pub.create_topic(TOPIC)
        for k in range(COUNT):
            await pub.publish(TOPIC, f"m{k}".encode())
        entries: list[JournalEntry] = await asyncio.to_thread(
            lambda: list(app.core.journal.read_source("pub@example.com")))
        assert [e.content for e in entries] == [f"m{k}".encode() for k in range(COUNT)]
        await fred.subscribe(TOPIC, 3600, link="fred-co")
        await barney.subscribe(TOPIC, 3600, batch=16)

        appends = _count_appends(app)
        for entry in entries:  # one step: no append can settle meanwhile
            fanout.forward([entry])
        # the first went at once (an idle fan-out does not wait); the rest wait for it
        assert appends == [2]
        part = entries[0].position.partition
        assert fanout.mark()[part] <= entries[0].position.offset  # none of them durable yet

        got_fred, got_barney = await asyncio.gather(deliveries(fred, COUNT),
                                                    deliveries(barney, COUNT))
        # ... and went as one append once it settled: in order, once, on every link
        assert appends == [2, 2 * (COUNT - 1)]
        for got, link in ((got_fred, "fred-co"), (got_barney, "barney@example.com")):
            assert [d.content for d in got] == [f"m{k}".encode() for k in range(COUNT)]
            stamps = [d.stamp for d in got]
            assert [(s.link, s.link_seq, s.source_seq) for s in stamps if s is not None] == \
                [(link, k + 1, e.source_seq) for k, e in enumerate(entries)]
        assert fanout.mark()[part] == entries[-1].position.offset + 1

        fanout.forward([entries[-1]])  # idle again: appended at once
        assert appends[-1] == 2
        for c in (pub, fred, barney):
            await c.close()


def test_entries_forwarded_while_an_append_is_unsettled_go_together_in_order_once(
        kafka_config: KafkaConfig) -> None:
    """Entries handed to the fan-out while an append is in flight are gathered and appended
    as one batch when it settles; every link gets each once, in order, and the fan-out mark
    does not pass them until they are durable."""
    asyncio.run(_coalesced(kafka_config))


async def _gathered_then_snapshot(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        fanout = app.handler.sequenced
        assert fanout is not None
        pub, fred = [await PubsubClient.connect("127.0.0.1", app.port, who)
                     for who in ("pub@example.com", "fred@example.com")]
        await pub.create_topic(TOPIC)
        for k in range(COUNT):  # each its own data item: a snapshot copies every one
            await pub.publish(TOPIC, f"m{k}".encode(), message_id=f"item{k}")
        entries: list[JournalEntry] = await asyncio.to_thread(
            lambda: list(app.core.journal.read_source("pub@example.com")))
        await fred.subscribe(TOPIC, 3600, link="fred-snap")

        appends = _count_appends(app)
        for entry in entries:  # one step: all but the first are gathered
            fanout.forward([entry])
        copies = fanout.queue_snapshot("fred@example.com", "fred-snap", TOPIC)
        assert copies == COUNT
        # what was gathered went ahead of the snapshot, as its own append
        assert appends == [1, COUNT - 1, COUNT]

        got = await deliveries(fred, 2 * COUNT)
        stamps = [d.stamp for d in got]
        assert all(s is not None for s in stamps)
        # on the link: every live copy first, then the snapshot's, seqs 1, 2, 3 ... across both
        assert [(s.link_seq, s.snapshot, d.content) for s, d in zip(stamps, got, strict=True)
                if s is not None] == \
            [(k + 1, False, f"m{k}".encode()) for k in range(COUNT)] + \
            [(COUNT + k + 1, True, f"m{k}".encode()) for k in range(COUNT)]
        for c in (pub, fred):
            await c.close()


def test_what_was_gathered_goes_on_the_link_ahead_of_a_snapshot(
        kafka_config: KafkaConfig) -> None:
    """A snapshot queued while forwarded entries wait to be appended follows them on the link:
    the gathered entries are appended first, so link seqs stay in the order things were
    queued."""
    asyncio.run(_gathered_then_snapshot(kafka_config))
