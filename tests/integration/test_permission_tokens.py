"""Permission tokens (XEP-0040 §5.1, broker/entitlements.py) on the live pubsub path: real
Kafka, real BEEP over TCP. A subscriber denied a token never receives a message carrying it,
live or by gap fill, and its link seqs stay contiguous; grants and denies written at runtime by
another process take effect on the next message; a deny added after delivery turns the refill
of that seq into a `withheld` stamp; the plain (unsequenced) path filters too."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from adapters.apex.codec import Data
from adapters.apex.robust_codec import Withheld
from adapters.apex.robust_stamp import StampKind
from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, Ended, LinkEvent, PubsubClient
from adapters.client.resequencer import Action, Deliver, Resequencer
from adapters.pubsub.handler import PubsubHandler
from broker.access import AccessControl, access_registry
from broker.core import BrokerCore
from broker.entitlements import parse_token_set
from broker.kafka_io import KafkaConfig, Position
from broker.kafka_producer import KafkaProducer
from broker.pubsub import PubsubService
from broker.records import (
    AccessEffect,
    AccessEntry,
    AccessKind,
    JournalEntry,
    PublishType,
    RecordKind,
    now_ms,
)
from broker.robust.config import RobustConfig
from common.errors import InvalidParameter

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)
GRANT, DENY = AccessEffect.ALLOW, AccessEffect.DENY

Event = Delivered | Ended | LinkEvent


def permtoken(eid: str, subscriber: str, spec: str, effect: AccessEffect = GRANT,
              topic: str | None = None) -> AccessEntry:
    return AccessEntry(eid, subscriber, parse_token_set(spec).items, effect, now_ms(), topic,
                       kind=AccessKind.PERMTOKEN)


async def _next(events: AsyncIterator[Event], timeout: float = 30) -> Event:
    return await asyncio.wait_for(anext(events), timeout)


async def _deliveries(events: AsyncIterator[Event], count: int) -> list[Delivered]:
    """The next `count` deliveries; a link event among them (heartbeats are off here) fails
    the test, apart from the reset that begins a new link: nothing else may arrive."""
    out: list[Delivered] = []
    while len(out) < count:
        event = await _next(events)
        if isinstance(event, LinkEvent) and event.stamp.kind == "reset" \
                and event.stamp.epoch == 0:
            continue
        assert isinstance(event, Delivered), event
        out.append(event)
    return out


def _view(got: list[Delivered]) -> list[tuple[int, bytes, str | None]]:
    """(link seq, content, token) of each delivery."""
    out = []
    for d in got:
        assert d.stamp is not None
        out.append((d.stamp.link_seq, d.content, d.stamp.token))
    return out


@pytest.fixture(name="writer")
def _writer(kafka_config: KafkaConfig) -> Iterator[AccessControl]:
    """Access entries written straight to Kafka by another client, as `apexps access` does."""
    producer = KafkaProducer(kafka_config)
    try:
        registry = access_registry(kafka_config, producer)
        yield AccessControl(registry)
    finally:
        producer.close()


def _seen(app: BrokerApp, key: str, present: bool = True) -> threading.Event:
    """Set once the broker's access view has (or has lost) entry `key`. The broker's
    AccessControl watches the registry first, so its decisions follow before this fires."""
    arrived = threading.Event()

    def watcher(k: str, item: AccessEntry | None) -> None:
        if k == key and (item is not None) is present:
            arrived.set()

    app.core.access.watch(watcher)
    return arrived


async def _await(arrived: threading.Event) -> None:
    assert await asyncio.to_thread(arrived.wait, 30), "the broker did not see the change"


# --- the acceptance case ----------------------------------------------------------------------

PLAN = [None, "6747", "6800", "6747", None, "6747", "6000", None]


async def _denied_never_receives(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:  # default: the domain gets every token
        app.access.put(permtoken("cli:jade-6747", "jade@example.com", "6747", DENY))
        connect = lambda who: PubsubClient.connect(  # noqa: E731
            "127.0.0.1", app.port, who, link_events=True)
        pub, fred, jade = (await connect("pub@example.com"), await connect("fred@example.com"),
                           await connect("jade@example.com"))
        assert (await jade.capabilities()).permissions == "tokens"
        await pub.create_topic("q.tok")
        await fred.subscribe("q.tok", 600, link="fred-tok")
        await jade.subscribe("q.tok", 600, link="jade-tok")
        for k, token in enumerate(PLAN):
            await pub.publish("q.tok", f"m{k}".encode(), token=token)
        fred_events, jade_events = fred.events(), jade.events()

        granted = await _deliveries(fred_events, len(PLAN))
        assert _view(granted) == [(k + 1, f"m{k}".encode(), t) for k, t in enumerate(PLAN)]
        # jade: everything but the 6747s, on link seqs 1.. with no seq for the filtered ones
        kept = [(k, t) for k, t in enumerate(PLAN) if t != "6747"]
        expected = [(i + 1, f"m{k}".encode(), t) for i, (k, t) in enumerate(kept)]
        denied = await _deliveries(jade_events, len(kept))
        assert _view(denied) == expected
        # sent before the link log holds them (robust-binding §2.5): wait until it does
        assert app.handler.sequenced is not None
        await asyncio.wait_for(app.handler.sequenced.sent_through("jade-tok", len(kept)), 10)
        head = app.core.links.last("jade-tok")
        assert head is not None and head.link_seq == len(kept)

        # a gap fill of jade's whole link: the same items again, still no 6747
        reply = await jade.gap("jade-tok", 1, len(kept))
        assert (reply.code, reply.link_seq) == (250, len(kept))
        refilled = await _deliveries(jade_events, len(kept))
        assert _view(refilled) == expected
        assert all(d.stamp is not None and d.stamp.refill for d in refilled)
        # the link never carried more seqs: asking for them is 553, and nothing is sent
        with pytest.raises(InvalidParameter):
            await jade.gap("jade-tok", len(kept) + 1, len(PLAN))
        # fred's refill carries the 6747s: the deny is jade's alone
        reply = await fred.gap("fred-tok", 1, len(PLAN))
        assert _view(await _deliveries(fred_events, len(PLAN))) == _view(granted)

        # nothing else reached jade: the next thing it gets is the next message
        await pub.publish("q.tok", b"last")
        assert _view(await _deliveries(jade_events, 1)) == [(len(kept) + 1, b"last", None)]
        for c in (pub, fred, jade):
            await c.close()


def test_a_denied_subscriber_never_receives_the_token_live_or_by_gap_fill(
        kafka_config: KafkaConfig) -> None:
    """The acceptance case: jade is denied 6747, fred is granted everything; 6747 messages
    interleave with others; jade's link has contiguous seqs and none for the 6747s."""
    asyncio.run(_denied_never_receives(kafka_config))


# --- changes at runtime -------------------------------------------------------------------------

ACCESS_FILE = """<access domain='example.com'>
  <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
  <grant-token id='fred' subscriber='fred@example.com' tokens='6000-6999' />
</access>
"""


async def _runtime(config: KafkaConfig, path: Path, writer: AccessControl) -> None:
    async with BrokerApp(config, robust=QUIET, access_file=path) as app:
        connect = lambda who: PubsubClient.connect(  # noqa: E731
            "127.0.0.1", app.port, who, link_events=True)
        pub, fred, jade = (await connect("pub@example.com"), await connect("fred@example.com"),
                           await connect("jade@example.com"))
        await pub.create_topic("q.live")
        await fred.subscribe("q.live", 600, link="fred-live")
        await jade.subscribe("q.live", 600, link="jade-live")
        fred_events, jade_events = fred.events(), jade.events()
        fred_seq, jade_seq = itertools.count(1), itertools.count(1)

        async def publish(*tokens: str | None) -> None:
            for k, token in enumerate(tokens):
                await pub.publish("q.live", f"{token}/{k}".encode(), token=token)

        async def expect(events: AsyncIterator[Event], seqs: itertools.count[int],
                         *tokens: str | None) -> None:
            got = await _deliveries(events, len(tokens))
            assert [(d.stamp.link_seq if d.stamp else None, d.stamp.token if d.stamp else None)
                    for d in got] == [(next(seqs), t) for t in tokens]

        # only what the file grants: fred has 6000-6999, jade nothing
        await publish("6747", None)
        await expect(fred_events, fred_seq, "6747", None)
        await expect(jade_events, jade_seq, None)

        # another process grants jade 6000-6999: the next message reaches her
        seen = _seen(app, "cli:jade")
        writer.put(permtoken("cli:jade", "jade@example.com", "6000-6999"))
        await _await(seen)
        await publish("6747", None)
        await expect(fred_events, fred_seq, "6747", None)
        await expect(jade_events, jade_seq, "6747", None)

        # and denies her 67*: the deny wins over her grant, 6800 still comes through
        seen = _seen(app, "cli:jade-no67")
        writer.put(permtoken("cli:jade-no67", "jade@example.com", "67*", DENY))
        await _await(seen)
        await publish("6747", "6800", None)
        await expect(fred_events, fred_seq, "6747", "6800", None)
        await expect(jade_events, jade_seq, "6800", None)

        # the deny removed: 6747 again
        seen = _seen(app, "cli:jade-no67", present=False)
        assert writer.remove("cli:jade-no67")
        await _await(seen)
        await publish("6747")
        await expect(jade_events, jade_seq, "6747")
        for c in (pub, fred, jade):
            await c.close()


def test_grants_and_denies_written_at_runtime_apply_to_the_next_message(
        kafka_config: KafkaConfig, tmp_path: Path, writer: AccessControl) -> None:
    """With --access FILE only the file's grants hold; a grant, a deny and its removal written
    to Kafka by another client each take effect on the next message, without restart."""
    path = tmp_path / "access.xml"
    path.write_text(ACCESS_FILE)
    asyncio.run(_runtime(kafka_config, path, writer))


# --- a deny after delivery ----------------------------------------------------------------------


async def _withheld(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect(  # noqa: E731
            "127.0.0.1", app.port, who, link_events=True)
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic("q.late")
        await jade.subscribe("q.late", 600, link="jade-late")
        plan = [None, "6747", "6800", "6747"]
        for k, token in enumerate(plan):
            await pub.publish("q.late", f"w{k}".encode(), token=token)
        events = jade.events()
        live = await _deliveries(events, len(plan))
        assert [t for _, _, t in _view(live)] == plan

        app.access.put(permtoken("cli:jade-6747", "jade@example.com", "6747", DENY))
        reply = await jade.gap("jade-late", 1, len(plan))
        assert (reply.code, reply.link_seq) == (250, len(plan))
        refilled = [await _next(events) for _ in plan]
        by_seq: list[tuple[int, str, bytes | None]] = []
        for event in refilled:
            assert event.stamp is not None and event.stamp.refill
            if isinstance(event, LinkEvent):
                s = event.stamp
                # no content and nothing of the message: no source, seq, type, topic, token,
                # message-id or time
                assert s.kind is StampKind.WITHHELD and isinstance(event.document, Withheld)
                assert (s.source, s.source_seq, s.publish_type, s.topic, s.token,
                        s.message_id, s.time) == (None,) * 7
                by_seq.append((s.link_seq, "withheld", None))
            else:
                assert isinstance(event, Delivered)
                by_seq.append((event.stamp.link_seq, "data", event.content))
        assert by_seq == [(1, "data", b"w0"), (2, "withheld", None), (3, "data", b"w2"),
                          (4, "withheld", None)]

        # the stub takes the withheld seqs as consumed: contiguous, nothing asked again
        stub = Resequencer("jade-late", 32, 600.0)
        actions: list[Action] = []
        for event in refilled:
            assert event.stamp is not None
            body = event.content if isinstance(event, Delivered) else b""
            actions += stub.receive(event.stamp, body, 0.1)
        assert [a.content for a in actions if isinstance(a, Deliver)] == [b"w0", b"w2"]
        assert all(isinstance(a, Deliver) for a in actions)
        assert stub.idle and stub.counters.withheld == 2
        for c in (pub, jade):
            await c.close()


def test_a_deny_added_after_delivery_withholds_the_refill(kafka_config: KafkaConfig) -> None:
    """Seqs jade received before the deny are refilled as `withheld` stamps without content;
    the others are refilled as they were."""
    asyncio.run(_withheld(kafka_config))


# --- the plain path ----------------------------------------------------------------------------


def _entry(offset: int, token: str | None) -> JournalEntry:
    return JournalEntry(
        position=Position(0, offset), kind=RecordKind.DATA, topic="q.plain",
        source="pub@example.com", source_seq=offset + 1, gap_to=None, gap_reason=None,
        publish_type=PublishType.UPDATE, publisher_seq=None, message_id=None, revision_id=None,
        publication_date=None, expiration_date=None, permission_token=token,
        content_type="text/plain", content=f"p{offset}".encode(), fields={}, options={},
        appended_at=now_ms())


async def _plain(core: BrokerCore) -> None:
    access = AccessControl(core.access)
    access.put(AccessEntry("cli:all", "*@example.com", ("all:all",), GRANT, now_ms()))
    access.put(permtoken("cli:tokens", "*@example.com", "*"))
    access.put(permtoken("cli:jade-6747", "jade@example.com", "6747", DENY))
    service = PubsubService(core, access, "example.com")
    service.create_topic("pub@example.com", "q.plain")
    for who in ("fred@example.com", "jade@example.com"):
        service.subscribe(who, who, "q.plain", 600)
    sent: list[Data] = []
    handler = PubsubHandler(service, core.journal, sent.append)  # no link log: plain path
    handler.forward([_entry(0, None), _entry(1, "6747"), _entry(2, "6800")])
    assert [(d.content, sorted(str(r) for r in d.recipients)) for d in sent] == [
        (b"p0", ["fred@example.com", "jade@example.com"]),
        (b"p1", ["fred@example.com"]),
        (b"p2", ["fred@example.com", "jade@example.com"]),
    ]
    access.put(permtoken("cli:fred-6747", "fred@example.com", "6747", DENY))
    sent.clear()
    handler.forward([_entry(3, "6747")])
    assert sent == []  # nobody may see it: nothing is sent at all


def test_the_plain_path_filters_recipients_per_message(core: BrokerCore) -> None:
    """Without a link log each data goes to the topic's subscribers entitled to its token."""
    asyncio.run(_plain(core))
