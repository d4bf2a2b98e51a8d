"""Expiration (content-based draft §5.2.1) over the wire: real Kafka, real BEEP over TCP.
Expired messages are not delivered, cached or snapshotted; `0` goes to the current subscribers
once; a gap fill for a seq whose message has expired since gets a stamp without content (the
link stays contiguous); a header that does not parse is refused with 561 and journals nothing.
The service's clock is moved forward rather than waited for."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, LinkEvent, PubsubClient
from broker.kafka_io import KafkaConfig
from broker.records import now_ms
from broker.robust.config import RobustConfig
from common.errors import InvalidMessage
from tests.integration.test_cached_messages import FUTURE, PAST, TOPIC, doc, is_live, place, until

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)
TEN_MINUTES = 600_000


def _in(ms: int) -> str:
    return datetime.fromtimestamp((now_ms() + ms) / 1000, UTC).isoformat()


async def _expiry(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        offset = [0]
        app.service._clock = lambda: now_ms() + offset[0]  # the clock port, moved forward
        connect = lambda who, **kw: PubsubClient.connect(  # noqa: E731
            "127.0.0.1", app.port, who, **kw)
        pub = await connect("pub@example.com")
        jade = await connect("jade@example.com", link_events=True)
        await pub.create_topic(TOPIC)
        await jade.subscribe(TOPIC, 86_400, link="jade-desk")
        events = jade.events()
        soon = _in(TEN_MINUTES)
        sent = [("1", None), ("2", PAST), ("3", "0"), ("4", soon), ("5", "*"), ("6", FUTURE)]
        for n, (mid, exp) in enumerate(sent, start=1):
            await pub.publish(TOPIC, doc(n, mid, 1, exp), "application/xml")
        live = [e for e in await until(events, lambda e: is_live(e, 6))
                if isinstance(e, Delivered)]
        # the past-dated message never went out; the others did, on link seqs 1..5
        assert [place(d) for d in live] == [1, 3, 4, 5, 6]
        assert [d.stamp.link_seq for d in live if d.stamp] == [1, 2, 3, 4, 5]

        offset[0] = 2 * TEN_MINUTES  # message 4 has expired now, and 3 (`0`) long since
        reply = await jade.gap("jade-desk", 1, 5)
        assert reply.code == 250
        refill = await until(events, lambda e: getattr(e, "stamp", None) is not None
                             and e.stamp.link_seq == 5)  # type: ignore[union-attr]
        kinds = [(e.stamp.link_seq, "data" if isinstance(e, Delivered) else e.stamp.kind)
                 for e in refill if e.stamp is not None]
        assert kinds == [(1, "data"), (2, "withheld"), (3, "withheld"), (4, "data"),
                         (5, "data")]
        assert all(isinstance(e, LinkEvent) and e.stamp.source is None
                   for e in refill if e.stamp is not None and e.stamp.kind == "withheld")

        # expired messages are not snapshotted nor cached either
        await jade.snapshot(TOPIC, link="jade-desk")
        await pub.publish(TOPIC, doc(7, "7", 1, None), "application/xml")
        state = [place(e) for e in await until(events, lambda e: is_live(e, 7))
                 if isinstance(e, Delivered) and e.stamp and e.stamp.snapshot]
        assert sorted(state) == [1, 5, 6]
        fred = await connect("fred@example.com")
        fred_events = fred.events()
        await fred.subscribe(TOPIC, 600, cached=True)
        await pub.publish(TOPIC, doc(8, "8", 1, None), "application/xml")
        cached = [place(e) for e in await until(fred_events, lambda e: is_live(e, 8))
                  if isinstance(e, Delivered) and e.stamp and e.stamp.snapshot]
        assert sorted(cached) == [1, 5, 6, 7]
        for c in (pub, jade, fred):
            await c.close()


def test_expired_messages_are_neither_delivered_nor_refilled_nor_cached(
        kafka_config: KafkaConfig) -> None:
    """A past date never goes out; `0` goes live once; after its date a message is a
    withheld stamp in a gap fill and missing from snapshots and cached messages."""
    asyncio.run(_expiry(kafka_config))


async def _bad_headers(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic(TOPIC)
        await jade.subscribe(TOPIC, 600)
        events = jade.events()
        for exp in ("tomorrow", "2030-13-15T12:15:00Z", "**"):
            with pytest.raises(InvalidMessage, match="expiration-date"):
                await pub.publish(TOPIC, doc(1, "1", 1, exp), "application/xml")
        bad_revision = doc(1, "1", 1, None).replace(b">1</ps:revision-id>", b">-1</ps:revision-id>")
        with pytest.raises(InvalidMessage, match="revision-id"):
            await pub.publish(TOPIC, bad_revision, "application/xml")
        await pub.publish(TOPIC, doc(2, "1", 1, None), "application/xml")
        (first,) = [e for e in await until(events, lambda e: is_live(e, 2))
                    if isinstance(e, Delivered)]
        assert first.stamp is not None and first.stamp.source_seq == 1  # nothing before it
        for c in (pub, jade):
            await c.close()


def test_headers_that_do_not_parse_are_refused_and_journal_nothing(
        kafka_config: KafkaConfig) -> None:
    """561 (the ingest's) for an expiration-date or revision-id that does not parse; the
    journal stays as it was (the next message takes source seq 1)."""
    asyncio.run(_bad_headers(kafka_config))
