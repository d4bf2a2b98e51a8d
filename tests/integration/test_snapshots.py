"""Publish types, data item state and snapshots over the wire (docs/robust-binding.md §9): real
Kafka, real BEEP over TCP. A subscription with snapshot='true' gets the items' images and deltas,
then live data, with no gap and no duplicate while a publisher keeps publishing; a snapshot
request gets the state once and nothing after; the state survives a broker kill -9; bad
requests get their codes and change nothing."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, Ended, LinkEvent, PubsubClient
from adapters.client.resequencer import Deliver, Resequencer
from broker.kafka_io import KafkaConfig, read_partition
from broker.records import PublishType
from broker.robust.config import RobustConfig
from common.errors import (
    AccessDenied,
    ApexpsError,
    InvalidParameter,
    NotTaken,
    ParameterSyntaxError,
    SyntaxError_,
)
from tests.integration.broker_process import start_broker

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)
TOPIC = "q.snap"
ITEMS = ("IBM", "MSFT", "ORCL", "HPQ")
P = PublishType
#: How often each publish type comes up in the generated feeds.
WEIGHTS = {P.UPDATE: 10, P.CORRECTION: 3, P.IMAGE: 4, P.ADD: 1, P.DROP: 2}

Event = Delivered | Ended | LinkEvent
Message = tuple[str, PublishType]


def _feed(count: int, seed: int) -> list[Message]:
    rng = random.Random(seed)
    types, weights = list(WEIGHTS), list(WEIGHTS.values())
    return [(rng.choice(ITEMS), rng.choices(types, weights)[0]) for _ in range(count)]


def _model(feed: list[Message], upto: int) -> dict[str, list[int]]:
    """Per item, the source seqs of its image and the deltas since, after the first `upto`
    messages of the one publisher (XEP-0040 §3.1 read plainly)."""
    state: dict[str, list[int]] = {}
    for seq, (mid, ptype) in enumerate(feed[:upto], start=1):
        if ptype in (P.IMAGE, P.ADD):
            state[mid] = [seq]
        elif ptype is P.DROP:
            state.pop(mid, None)
        else:
            state.setdefault(mid, []).append(seq)
    return state


def _as_state(got: list[Delivered]) -> dict[str, list[int]]:
    state: dict[str, list[int]] = {}
    for d in got:
        assert d.stamp is not None and d.stamp.message_id is not None
        assert d.stamp.source_seq is not None
        state.setdefault(d.stamp.message_id, []).append(d.stamp.source_seq)
    return state


async def _publish(pub: PubsubClient, feed: list[Message], first: int, last: int) -> None:
    """Messages first..last (1-based) of `feed`; content names the message's seq."""
    for seq in range(first, last + 1):
        mid, ptype = feed[seq - 1]
        await pub.publish(TOPIC, f"<q n='{seq}' />".encode(), "application/xml",
                          publish_type=ptype, message_id=mid)


async def _until(events: AsyncIterator[Event], done: object, timeout: float = 30,
                 ) -> list[Event]:
    """Events until `done(event)` is true (that one included)."""
    out: list[Event] = []
    while True:
        event = await asyncio.wait_for(anext(events), timeout)
        out.append(event)
        if done(event):  # type: ignore[operator]
            return out


def _live_seq(event: Event, seq: int) -> bool:
    return isinstance(event, Delivered) and event.stamp is not None \
        and not event.stamp.snapshot and event.stamp.source_seq == seq


async def _subscribe_during_publishing(config: KafkaConfig) -> None:
    feed = _feed(160, seed=40)
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who, **kw: PubsubClient.connect(  # noqa: E731
            "127.0.0.1", app.port, who, **kw)
        pub, fred = await connect("pub@example.com"), await connect("fred@example.com")
        jade = await connect("jade@example.com", link_events=True)  # a heartbeat would show
        caps = await jade.capabilities()
        assert P.SNAPSHOT in caps.publish_types
        await pub.create_topic(TOPIC)
        await fred.subscribe(TOPIC, 600)  # the witness: everything, live
        fred_events = fred.events()
        await _publish(pub, feed, 1, 40)
        await _until(fred_events, lambda e: _live_seq(e, 40))  # forwarded: in the state
        halfway, subscribed = asyncio.Event(), asyncio.Event()

        async def publisher() -> None:
            for seq in range(41, 121):
                await _publish(pub, feed, seq, seq)
                if seq == 60:
                    halfway.set()
            await subscribed.wait()  # some of the feed certainly follows the subscription
            await _publish(pub, feed, 121, len(feed))

        task = asyncio.create_task(publisher())
        await halfway.wait()
        await jade.subscribe(TOPIC, 600, link="jade-desk", snapshot=True)
        subscribed.set()
        await task
        got = await _until(jade.events(), lambda e: _live_seq(e, len(feed)))
        witness = await _until(fred_events, lambda e: _live_seq(e, len(feed)))
        assert len(witness) == len(feed) - 40

        # the link begins with its epoch-0 reset; no heartbeats on a quiet link
        first = got[0]
        assert isinstance(first, LinkEvent) and first.stamp.kind == "reset" \
            and (first.stamp.epoch, first.stamp.link_seq) == (0, 0)
        data = [e for e in got[1:] if isinstance(e, Delivered)]
        assert len(data) == len(got) - 1
        snap = [d for d in data if d.stamp is not None and d.stamp.snapshot]
        live = data[len(snap):]
        # images and deltas first, then live data; link seqs 1, 2, 3 … across both
        assert all(d.stamp is not None and not d.stamp.snapshot for d in live)
        assert [d.stamp.link_seq for d in data if d.stamp is not None] == list(
            range(1, len(data) + 1))
        # No gap, no duplicate: the live part is every message after some cut, and the
        # snapshot is exactly the items' state at that cut.
        first = live[0].stamp
        assert first is not None and first.source_seq is not None
        cut = first.source_seq - 1
        assert 40 <= cut <= 120
        assert [d.stamp.source_seq for d in live if d.stamp] == list(range(cut + 1,
                                                                           len(feed) + 1))
        assert _as_state(snap) == _model(feed, cut)
        assert snap, "the snapshot held the items published before the subscription"
        for d in snap:  # each copy is the message the publisher sent, as it said it
            assert d.stamp is not None and d.stamp.source_seq is not None
            mid, ptype = feed[d.stamp.source_seq - 1]
            assert (d.stamp.message_id, d.stamp.publish_type) == (mid, ptype)
            assert d.content == f"<q n='{d.stamp.source_seq}' />".encode()
        seqs = [d.stamp.source_seq for d in snap if d.stamp]
        assert seqs == sorted(seqs)  # one source: its seqs rise, each image before its deltas
        # The subscriber stub hands the application all of it: state, then the stream.
        stub = Resequencer("jade-desk", caps.seq_bits, 600.0)
        delivered = []
        for d in data:
            assert d.stamp is not None
            delivered += stub.receive(d.stamp, d.content, 0.0)
        assert [a.content for a in delivered if isinstance(a, Deliver)] == [
            d.content for d in data]
        assert stub.idle and stub.positions().sources == {"pub@example.com": len(feed)}
        # the live state equals the model of the whole feed
        assert {k[1]: [v.entry.source_seq for v in s.versions]
                for k, s in app.core.items.states().items() if k[0] == TOPIC
                } == _model(feed, len(feed))  # (the WKT topics hold items of their own)
        for c in (pub, fred, jade):
            await c.close()


def test_snapshot_subscription_meets_the_live_stream_exactly(kafka_config: KafkaConfig,
                                                             ) -> None:
    asyncio.run(_subscribe_during_publishing(kafka_config))


async def _requests(config: KafkaConfig) -> None:
    feed = _feed(60, seed=41)
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who, **kw: PubsubClient.connect(  # noqa: E731
            "127.0.0.1", app.port, who, **kw)
        pub, fred, barney = (await connect("pub@example.com"), await connect("fred@example.com"),
                             await connect("barney@example.com"))
        await pub.create_topic(TOPIC)
        await fred.subscribe(TOPIC, 600)
        fred_events = fred.events()
        await _publish(pub, feed, 1, len(feed))
        # A message barney may not see (the permission hook, filled in elsewhere, decides).
        app.service.entitled = (  # type: ignore[method-assign]
            lambda entry, who, live=False:
            entry.permission_token != "secret" or who != "barney@example.com")
        await pub.publish(TOPIC, b"<secret />", publish_type="image", message_id="SECRET",
                          token="secret")
        await _until(fred_events, lambda e: isinstance(e, Delivered) and e.stamp is not None
                     and e.stamp.message_id == "SECRET")
        events = barney.events()
        await barney.snapshot(TOPIC)
        state = _model(feed, len(feed))
        got = []
        while len(got) < sum(len(v) for v in state.values()):
            event = await asyncio.wait_for(anext(events), 30)
            assert isinstance(event, Delivered)
            got.append(event)
        assert all(d.stamp is not None and d.stamp.snapshot and d.stamp.link
                   == "barney@example.com" for d in got)
        assert _as_state(got) == state  # SECRET is not among them
        assert [d.stamp.link_seq for d in got if d.stamp] == list(range(1, len(got) + 1))
        # The link log knows they were snapshot copies: a gap fill resends them marked so.
        await barney.gap("barney@example.com", 1, 2)
        refilled = [e for e in await _until(events, lambda e: isinstance(e, Delivered)
                                            and e.stamp is not None and e.stamp.link_seq == 2)
                    if isinstance(e, Delivered)]
        assert [(d.stamp.link_seq, d.stamp.source_seq, d.stamp.snapshot, d.stamp.refill)
                for d in refilled if d.stamp] == [
            (d.stamp.link_seq, d.stamp.source_seq, True, True) for d in got[:2] if d.stamp]
        assert [d.content for d in refilled] == [d.content for d in got[:2]]
        # one item only; an item without state is an empty answer
        await pub.publish(TOPIC, b"<q late='1' />", publish_type="update", message_id="IBM")
        await _until(fred_events, lambda e: _live_seq(e, len(feed) + 2))
        await barney.snapshot(TOPIC, "NOPE")
        await barney.snapshot(TOPIC, "IBM")
        ibm = [*state.get("IBM", []), len(feed) + 2]
        # Nothing live reached barney in between: the next items are IBM's state, late update
        # included, on the link seqs right after the first snapshot.
        again = await _until(events, lambda e: isinstance(e, Delivered) and e.stamp is not None
                             and e.stamp.source_seq == len(feed) + 2)
        assert [d.stamp.source_seq for d in again if isinstance(d, Delivered) and d.stamp] == ibm
        assert [d.stamp.link_seq for d in again if isinstance(d, Delivered) and d.stamp] == list(
            range(len(got) + 1, len(got) + 1 + len(ibm)))
        assert "barney@example.com" not in {w for w, _ in app.service.recipient_links(TOPIC)}
        # A deleted topic's items go with it: created again, it starts with no state.
        await pub.delete_topic(TOPIC)
        await pub.create_topic(TOPIC)
        await pub.publish(TOPIC, b"<fresh />", publish_type="image", message_id="NEW")
        await barney.subscribe(TOPIC, 600, link="barney-witness")
        await pub.publish(TOPIC, b"<after />", publish_type="update", message_id="NEW")
        await _until(events, lambda e: isinstance(e, Delivered) and e.content == b"<after />")
        await barney.snapshot(TOPIC)
        fresh = await _until(events, lambda e: isinstance(e, Delivered)
                             and e.content == b"<after />")
        assert [d.content for d in fresh if isinstance(d, Delivered)] == [b"<fresh />",
                                                                           b"<after />"]
        for c in (pub, fred, barney):
            await c.close()


def test_snapshot_request_gets_the_state_once(kafka_config: KafkaConfig) -> None:
    asyncio.run(_requests(kafka_config))


async def _followed(app: BrokerApp) -> None:
    """Until the journal follower has handed on (and the item state applied) everything the
    journal holds now."""
    loop = asyncio.get_running_loop()
    read: asyncio.Future[None] = loop.create_future()
    await asyncio.to_thread(app.follower.when_read,
                            lambda: loop.call_soon_threadsafe(read.set_result, None))
    await asyncio.wait_for(read, 10)


async def _bad_requests(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        wilma = await PubsubClient.connect("127.0.0.1", app.port, "wilma@example.com")
        await pub.create_topic(TOPIC)
        await pub.publish(TOPIC, b"<q />", publish_type="image", message_id="IBM")
        await pub.subscribe(TOPIC, 600, link="pub-desk")
        await _followed(app)  # the image is in the item state before it is compared
        before = app.core.items.states()
        with pytest.raises(NotTaken) as unknown:
            await wilma.snapshot("no.such.topic")
        assert unknown.value.code == 550
        with pytest.raises(AccessDenied):  # someone else's link: 537
            await wilma.snapshot(TOPIC, link="pub-desk")
        raw: list[tuple[bytes, type[ApexpsError]]] = [
            (b"<!DOCTYPE snapshot [<!ENTITY a 'q.snap'>]><snapshot topic='&a;' transID='5' />",
             SyntaxError_),
            (b"<snapshot topic='q.snap' transID='6'", SyntaxError_),
            (b"<snapshot topic='q.snap' transID='7' colour='red' />", ParameterSyntaxError),
            (b"<snapshot topic='q.snap' />", ParameterSyntaxError),
            (b"<snapshot topic='q.snap' transID='x' />", ParameterSyntaxError),
            (b"<snapshot topic='q/snap' transID='8' />", InvalidParameter),
        ]
        for doc, error in raw:
            with pytest.raises(error) as refused:
                await wilma.client.send(wilma.endpoint, [wilma.service], doc,
                                        "application/beep+xml")
            assert refused.value.code == error.code
        # Nothing changed: no link for wilma, no subscription, the same item state; the
        # connection and the service still answer.
        assert app.core.links.last("wilma@example.com") is None
        assert app.core.items.states() == before
        assert [w for w, _ in app.service.recipient_links(TOPIC)] == ["pub@example.com"]
        events = wilma.events()
        await wilma.snapshot(TOPIC)
        (item,) = await _until(events, lambda e: isinstance(e, Delivered))
        assert isinstance(item, Delivered) and item.stamp is not None and item.stamp.snapshot
        for c in (pub, wilma):
            await c.close()


def test_bad_snapshot_requests_get_their_code_and_change_nothing(kafka_config: KafkaConfig,
                                                                 ) -> None:
    asyncio.run(_bad_requests(kafka_config))


async def _checkpointed(config: KafkaConfig) -> None:
    """Until the broker has written an item checkpoint marker."""
    topic = config.topic("items")
    for _ in range(500):
        found = await asyncio.to_thread(
            lambda: any(r.key is not None and r.key.startswith(b"\x00partition\x00")
                        for r in read_partition(config, topic, 0)))
        if found:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no item checkpoint was written")


async def _after_kill(config: KafkaConfig) -> None:
    feed = _feed(80, seed=42)
    args = ("--heartbeat-ms", "600000")
    proc, port = await start_broker(config.bootstrap, *args, namespace=config.namespace,
                                    logs=False)
    try:
        pub = await PubsubClient.connect("127.0.0.1", port, "pub@example.com")
        await pub.create_topic(TOPIC)
        await _publish(pub, feed, 1, 50)
        await _checkpointed(config)
        await _publish(pub, feed, 51, len(feed))  # on ok: in the journal, maybe not in a
        proc.kill()                               # checkpoint, maybe not even forwarded
        await proc.wait()
        with contextlib.suppress(ApexpsError, ConnectionError):
            await pub.close()
        proc, port = await start_broker(config.bootstrap, *args, namespace=config.namespace,
                                        logs=False)
        jade = await PubsubClient.connect("127.0.0.1", port, "jade@example.com")
        events = jade.events()
        await jade.snapshot(TOPIC)
        want = _model(feed, len(feed))
        total = sum(len(v) for v in want.values())
        got: list[Delivered] = []
        while len(got) < total:
            event = await asyncio.wait_for(anext(events), 30)
            if isinstance(event, Delivered):
                got.append(event)
        assert _as_state(got) == want
        assert all(d.content == f"<q n='{d.stamp.source_seq}' />".encode()
                   for d in got if d.stamp)
        # and the state goes on from there: a new image, seen live, replaces IBM
        pub = await PubsubClient.connect("127.0.0.1", port, "pub@example.com")
        await jade.subscribe(TOPIC, 600, link="jade-after")
        await pub.publish(TOPIC, b"<q n='81' />", "application/xml", publish_type="image",
                          message_id="IBM")
        await _until(events, lambda e: _live_seq(e, len(feed) + 1))
        await jade.snapshot(TOPIC, "IBM", link="jade-after")
        (ibm,) = await _until(events, lambda e: isinstance(e, Delivered))
        assert isinstance(ibm, Delivered) and ibm.stamp is not None and ibm.stamp.snapshot
        assert ibm.content == b"<q n='81' />"
        for c in (pub, jade):
            await c.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_item_state_survives_a_broker_kill_9(kafka_config: KafkaConfig) -> None:
    asyncio.run(_after_kill(kafka_config))


async def _read_your_writes(config: KafkaConfig) -> list[bytes]:
    """Publish an image, and once its `ok` is in, ask for a snapshot from another connection at
    once: the item state may not have it yet (the follower reads it back from Kafka), so the
    service waits until it does. Returns the image each snapshot carried."""
    got: list[bytes] = []
    async with BrokerApp(config, robust=QUIET) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        wilma = await PubsubClient.connect("127.0.0.1", app.port, "wilma@example.com")
        await pub.create_topic(TOPIC)
        events = wilma.events()
        for n in range(5):
            body = f"<q n='{n}' />".encode()
            await pub.publish(TOPIC, body, "application/xml", publish_type="image",
                              message_id="IBM")
            await wilma.snapshot(TOPIC)
            (copy,) = await _until(events, lambda e: isinstance(e, Delivered))
            assert isinstance(copy, Delivered)
            got.append(copy.content)
        for c in (pub, wilma):
            await c.close()
    return got


def test_a_snapshot_holds_what_was_acknowledged_before_it(kafka_config: KafkaConfig) -> None:
    got = asyncio.run(_read_your_writes(kafka_config))
    assert got == [f"<q n='{n}' />".encode() for n in range(5)]
