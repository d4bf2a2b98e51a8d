"""Robust delivery on the live pubsub path (docs/robust-binding.md): real Kafka, real BEEP over
TCP. Every delivery carries its link's next seq; a range is refilled exactly (same content, link
and source seqs), also after a broker kill -9; heartbeats advance idle links; bad gap requests
get their code and change nothing; a subscribe either claims its link and records the
subscription, or does neither. Source repair is in test_pubsub_repair.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, Ended, LinkEvent, PubsubClient
from broker.kafka_io import KafkaConfig
from broker.robust.config import RobustConfig
from broker.robust.fanout import FanoutMarks
from common.errors import (
    AccessDenied,
    ApexpsError,
    InvalidParameter,
    JournalUnavailable,
    RebuildRefused,
    ServiceNotAvailable,
)
from tests.integration.broker_process import start_broker
from tests.integration.deliveries import deliveries
from tests.integration.link_log import logged

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)

Event = Delivered | Ended | LinkEvent


async def _next(events: AsyncIterator[Event], timeout: float = 30) -> Event:
    return await asyncio.wait_for(anext(events), timeout)


def _seqs(got: list[Delivered]) -> list[tuple[str, int, str, int]]:
    out = []
    for d in got:
        assert d.stamp is not None
        assert d.stamp.source is not None and d.stamp.source_seq is not None
        out.append((d.stamp.link, d.stamp.link_seq, d.stamp.source, d.stamp.source_seq))
    return out


async def _sequenced(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, fred, jade = (await connect("pub@example.com"), await connect("fred@example.com"),
                           await connect("jade@example.com"))
        caps = await fred.capabilities()
        assert (caps.seq_bits, caps.heartbeat_ms, caps.max_gap) == (32, 600_000, 100)
        assert caps.link_retention_ms == config.link_retention_ms
        for t in ("q.a", "q.b"):
            await pub.create_topic(t)
            await fred.subscribe(t, 600)
        await jade.subscribe("q.a", 600, link="desk-1")
        for k in range(6):
            await pub.publish("q.a" if k % 2 == 0 else "q.b", f"m{k}".encode())
        got = await deliveries(fred, 6)
        # one link across both topics: link seqs 1..6 in journal order
        assert [s[:2] for s in _seqs(got)] == [("fred@example.com", i) for i in range(1, 7)]
        assert [d.content for d in got] == [f"m{k}".encode() for k in range(6)]
        jade_got = await deliveries(jade, 3)
        assert [s[:2] for s in _seqs(jade_got)] == [("desk-1", i) for i in range(1, 4)]
        # the same message carries the same source and source seq on both links
        assert _seqs(jade_got)[0][2:] == _seqs(got)[0][2:]
        assert all(d.stamp is not None and d.stamp.topic == d.topic for d in got)
        # someone else's link: 537 (NotYourLink) on subscribe; the subscription is not recorded
        with pytest.raises(AccessDenied):
            await fred.subscribe("q.b", 600, link="desk-1")
        assert [w for w, _ in app.service.recipient_links("q.b")] == ["fred@example.com"]
        for c in (pub, fred, jade):
            await c.close()


def test_link_seqs_rise_by_one_per_delivery_across_topics(kafka_config: KafkaConfig) -> None:
    asyncio.run(_sequenced(kafka_config))


async def _away_and_back(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        await pub.create_topic("q.away")
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com")
        await fred.subscribe("q.away", 600, link="fred-desk")
        for k in range(3):
            await pub.publish("q.away", f"a{k}".encode())
        before = await deliveries(fred, 3)
        await fred.close()
        for k in range(3, 8):
            await pub.publish("q.away", f"a{k}".encode())
        # wait until the link log holds all 8 (the fan-out of the last publish is durable)
        assert app.handler.sequenced is not None
        await asyncio.wait_for(app.handler.sequenced.sent_through("fred-desk", 8), 6)
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com")
        last = before[-1].stamp
        assert last is not None and last.link_seq == 3
        reply = await fred.gap("fred-desk", last.link_seq + 1, epoch=last.epoch)
        assert (reply.code, reply.link_seq) == (250, 8)
        refilled = await deliveries(fred, 5)
        assert [d.content for d in refilled] == [f"a{k}".encode() for k in range(3, 8)]
        assert all(d.stamp is not None and d.stamp.refill for d in refilled)
        seqs = _seqs(refilled)
        assert [s[1] for s in seqs] == [4, 5, 6, 7, 8]
        assert [s[3] for s in seqs] == [_seqs(before)[-1][3] + i for i in range(1, 6)]
        # a gap of one: from = to, the same item again
        await fred.gap("fred-desk", 6, 6)
        again = await deliveries(fred, 1)
        assert _seqs(again) == [seqs[2]] and again[0].content == b"a5"
        for c in (pub, fred):
            await c.close()


def test_returning_subscriber_gets_exactly_what_it_missed(kafka_config: KafkaConfig) -> None:
    asyncio.run(_away_and_back(kafka_config))


async def _bad_gaps(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com")
        await pub.create_topic("q.bad")
        await fred.subscribe("q.bad", 600, link="fred-bad")
        for k in range(4):
            await pub.publish("q.bad", f"b{k}".encode())
        await deliveries(fred, 4)
        # sent before the link log holds them (robust-binding §2.5): wait until it does
        assert app.handler.sequenced is not None
        await asyncio.wait_for(app.handler.sequenced.sent_through("fred-bad", 4), 10)
        head = app.core.links.last("fred-bad")
        assert head is not None and head.link_seq == 4
        cases: list[tuple[int, int | None, type[ApexpsError]]] = [
            (3, 2, InvalidParameter),             # backwards
            (0, 2, InvalidParameter),             # 0 is a reset, never refilled
            (2, 9, InvalidParameter),             # seqs the link has not carried yet
            (1, 2**40, InvalidParameter),         # beyond the 32-bit resolution
            (1, 2_000_000, RebuildRefused),  # longer than maxgap (100)
        ]
        for lo, hi, error in cases:
            with pytest.raises(error):
                await fred.gap("fred-bad", lo, hi)
        with pytest.raises(RebuildRefused) as refused:
            await fred.gap("fred-bad", 1, 500)
        assert refused.value.code == 570
        # negative and absurdly long numbers: refused on the data itself (553)
        for raw in (b"<gap link='fred-bad' linkfrom='-1' linkto='2' transID='77' />",
                    b"<gap link='fred-bad' linkfrom='1' linkto='" + b"9" * 60
                    + b"' transID='78' />"):
            with pytest.raises(InvalidParameter):
                await fred.client.send(fred.endpoint, [fred.service], raw,
                                       "application/beep+xml")
        # someone else's link
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        with pytest.raises(AccessDenied):
            await jade.gap("fred-bad", 1, 2)
        # nothing changed: the link is where it was, nothing was sent to fred, and a good
        # request still works
        assert app.core.links.last("fred-bad") == head
        await pub.publish("q.bad", b"after")
        nxt = await deliveries(fred, 1)
        assert nxt[0].content == b"after" and _seqs(nxt)[0][1] == 5
        for c in (pub, fred, jade):
            await c.close()


def test_bad_gap_requests_get_their_code_and_change_nothing(kafka_config: KafkaConfig) -> None:
    asyncio.run(_bad_gaps(kafka_config))


async def _heartbeats(config: KafkaConfig) -> None:
    robust = RobustConfig(heartbeat_ms=200, max_gap=100)
    async with BrokerApp(config, robust=robust) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        await pub.create_topic("q.idle")
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com",
                                          link_events=True)
        await fred.subscribe("q.idle", 600, link="fred-idle")
        await pub.publish("q.idle", b"only")
        events = fred.events()
        begins = await _next(events)  # subscribing made the link: its epoch-0 reset (§2.2)
        assert isinstance(begins, LinkEvent) and begins.stamp.kind == "reset"
        assert (begins.stamp.epoch, begins.stamp.link_seq) == (0, 0)
        first = await _next(events)
        assert isinstance(first, Delivered) and first.stamp is not None
        assert first.stamp.link_seq == 1
        beat = await _next(events, 10)
        assert isinstance(beat, LinkEvent) and beat.stamp.kind == "heartbeat"
        assert beat.stamp.link_seq == 2
        # fred is away while the link stays idle: only heartbeats advance it
        await fred.close()
        assert app.handler.sequenced is not None
        await asyncio.wait_for(app.handler.sequenced.sent_through("fred-idle", 5), 10)
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com",
                                          link_events=True)
        events = fred.events()
        seen = await _next(events, 10)
        assert isinstance(seen, LinkEvent) and seen.stamp.link_seq > 3  # a hole: 3..seen-1
        hole = (3, seen.stamp.link_seq - 1)
        reply = await fred.gap("fred-idle", *hole)
        assert reply.link_seq == hole[1]
        filled = []
        while len(filled) < hole[1] - hole[0] + 1:
            event = await _next(events, 10)
            if isinstance(event, LinkEvent) and event.stamp.refill:
                assert event.stamp.kind == "heartbeat"
                filled.append(event.stamp.link_seq)
        assert filled == list(range(hole[0], hole[1] + 1))
        for c in (pub, fred):
            await c.close()


def test_heartbeat_only_gap_is_detected_and_filled(kafka_config: KafkaConfig) -> None:
    asyncio.run(_heartbeats(kafka_config))


async def _after_kill(config: KafkaConfig) -> None:
    proc, port = await start_broker(config.bootstrap, "--heartbeat-ms", "600000",
                                      namespace=config.namespace, logs=False)
    try:
        pub = await PubsubClient.connect("127.0.0.1", port, "pub@example.com")
        fred = await PubsubClient.connect("127.0.0.1", port, "fred@example.com")
        await pub.create_topic("q.crash")
        await fred.subscribe("q.crash", 600, link="fred-crash")
        for k in range(10):
            await pub.publish("q.crash", f"c{k}".encode())
        live = await deliveries(fred, 10)
        await logged(config, ("fred-crash",), 10)  # the refill's records, out of their linger
        proc.kill()
        await proc.wait()
        for c in (pub, fred):
            with contextlib.suppress(ApexpsError, ConnectionError):
                await c.close()
        proc, port = await start_broker(config.bootstrap, "--heartbeat-ms", "600000",
                                      namespace=config.namespace, logs=False)
        fred = await PubsubClient.connect("127.0.0.1", port, "fred@example.com")
        reply = await fred.gap("fred-crash", 3, 8)
        assert (reply.code, reply.link_seq) == (250, 8)
        refilled = await deliveries(fred, 6)
        assert _seqs(refilled) == _seqs(live)[2:8]
        assert [d.content for d in refilled] == [d.content for d in live[2:8]]
        # after a kill -9 the link begins a new epoch: records sent but never durable may be
        # lost, and their seqs must not carry other messages (robust-binding §2.5)
        pub = await PubsubClient.connect("127.0.0.1", port, "pub@example.com")
        await pub.publish("q.crash", b"later")
        nxt = await deliveries(fred, 1)
        assert nxt[0].content == b"later"
        assert nxt[0].stamp is not None and (nxt[0].stamp.epoch, nxt[0].stamp.link_seq) == (1, 1)
        for c in (pub, fred):
            await c.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_range_refills_exactly_after_broker_kill_9(kafka_config: KafkaConfig) -> None:
    asyncio.run(_after_kill(kafka_config))


async def _claim_fails(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com")
        await pub.create_topic("q.claim")

        def kafka_down(link: str, owner: str) -> None:
            raise JournalUnavailable("kafka did not take the link's reset")

        real, app.core.links.claim = app.core.links.claim, kafka_down  # type: ignore[method-assign]
        with pytest.raises(ServiceNotAvailable):
            await fred.subscribe("q.claim", 600, link="fred-claim")
        # all or nothing: no subscription, no rights, no link
        assert app.service.recipient_links("q.claim") == []
        assert not [s for s in app.core.subscriptions if s.topic == "q.claim"]
        assert app.core.links.head("fred-claim") is None
        app.core.links.claim = real  # type: ignore[method-assign]
        await fred.subscribe("q.claim", 600, link="fred-claim")
        head = app.core.links.last("fred-claim")
        assert head is not None and (head.epoch, head.owner) == (0, "fred@example.com")
        for c in (pub, fred):
            await c.close()


def test_a_subscribe_whose_link_claim_fails_records_nothing(kafka_config: KafkaConfig) -> None:
    asyncio.run(_claim_fails(kafka_config))


async def _clean_restart(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com")
        await pub.create_topic("q.clean")
        await fred.subscribe("q.clean", 600, link="fred-clean")
        for k in range(3):
            await pub.publish("q.clean", f"c{k}".encode())
        await deliveries(fred, 3)
        for c in (pub, fred):
            await c.close()
    # a clean stop: every link record durable, and the clean-stop record says so
    async with BrokerApp(config, robust=QUIET) as app:
        assert app.core.fanout.clean_writer is not None
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com")
        await pub.publish("q.clean", b"later")
        [nxt] = await deliveries(fred, 1)
        assert nxt.content == b"later"
        assert nxt.stamp is not None and (nxt.stamp.epoch, nxt.stamp.link_seq) == (0, 4)
        for c in (pub, fred):
            await c.close()
        # the record was deleted on start: had this broker died, the next would not trust it
        again = FanoutMarks(config, app.core._producer, app.core.codec)  # type: ignore[arg-type]
        await asyncio.to_thread(again.load)
        assert again.clean_writer is None


def test_after_a_clean_stop_links_keep_their_epochs(kafka_config: KafkaConfig) -> None:
    """A broker stopped cleanly leaves its links where they were: the next message takes the
    next seq of the same epoch (a kill -9 begins a new one:
    test_range_refills_exactly_after_broker_kill_9)."""
    asyncio.run(_clean_restart(kafka_config))
