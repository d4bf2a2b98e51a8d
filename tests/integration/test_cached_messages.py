"""Cached messages (content-based draft §5.8 `cached`, §5.2.1 revisions) over the wire: real
Kafka, real BEEP over TCP. A subscribe with `cached` gets per message-id the latest unexpired
revision, then live data, with no gap and no duplicate while a publisher keeps publishing; the
plain (unsequenced) path does the same; the cache is rebuilt from Kafka after a kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, Ended, LinkEvent, PubsubClient
from broker.kafka_io import KafkaConfig
from broker.robust.config import RobustConfig
from common.errors import ApexpsError
from tests.integration.broker_process import start_broker

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)
TOPIC = "equity.quote.service"
MIDS = ("1029", "1030", "1031", "1032")
PAST = "2001-03-15T12:15:00-08:00"
FUTURE = "2099-03-15T12:15:00-08:00"

Event = Delivered | Ended | LinkEvent
#: One message: (message-id, revision, expiration-date or None)
Message = tuple[str, int, str | None]


def doc(n: int, mid: str, rev: int, exp: str | None) -> bytes:
    """A ps:message-content whose content names its place `n` in the feed."""
    expiry = "" if exp is None else f"<ps:expiration-date>{exp}</ps:expiration-date>"
    return (f"<ps:message-content transID='{n}' content='#Content'"
            f" xmlns:ps='http://www.example.com/pubsub'><ps:topic>{TOPIC}</ps:topic>"
            f"<ps:publisher>pub@example.com</ps:publisher>{expiry}"
            f"<ps:message-id>{mid}</ps:message-id><ps:revision-id>{rev}</ps:revision-id>"
            f"<ps:content Name='Content'><q n='{n}' /></ps:content>"
            "</ps:message-content>").encode()


def feed(count: int, seed: int, *, past_until: int) -> list[Message]:
    """Revisions that rise mostly and fall now and then; expirations of every kind (past
    dates only among the first `past_until`: they are never delivered live)."""
    rng = random.Random(seed)
    revs = dict.fromkeys(MIDS, 0)
    out: list[Message] = []
    for n in range(1, count + 1):
        mid = rng.choice(MIDS)
        step = rng.choice(["up", "up", "up", "same", "stale"])
        if step == "up":
            revs[mid] += rng.choice([1, 2])
        rev = revs[mid] - (3 if step == "stale" else 0)  # now and then an old revision
        kinds = [None, "*", FUTURE, "0"] + ([PAST] if n <= past_until else [])
        out.append((mid, max(rev, 0), rng.choice(kinds)))
    return out


def cached_model(messages: list[Message], upto: int) -> dict[str, int]:
    """message-id -> the feed position (1-based) of its cached message after `upto`: the
    highest revision that was not `0`, unless that one has expired (draft §5.2.1)."""
    best: dict[str, tuple[int, int, str | None]] = {}
    for n, (mid, rev, exp) in enumerate(messages[:upto], start=1):
        if exp == "0":
            continue
        if mid not in best or rev > best[mid][0]:
            best[mid] = (rev, n, exp)
    return {mid: n for mid, (_, n, exp) in best.items() if exp != PAST}


async def publish(pub: PubsubClient, messages: list[Message], first: int, last: int) -> None:
    for n in range(first, last + 1):
        mid, rev, exp = messages[n - 1]
        await pub.publish(TOPIC, doc(n, mid, rev, exp), "application/xml")


def place(d: Delivered) -> int:
    """The feed position a delivered copy carries."""
    return int(d.content.split(b"<q n='")[1].split(b"'")[0])


async def until(events: AsyncIterator[Event], done: object, timeout: float = 30,
                ) -> list[Event]:
    out: list[Event] = []
    while True:
        event = await asyncio.wait_for(anext(events), timeout)
        out.append(event)
        if done(event):  # type: ignore[operator]
            return out


def is_live(event: Event, n: int) -> bool:
    return isinstance(event, Delivered) and (event.stamp is None or not event.stamp.snapshot) \
        and place(event) == n


async def _meets_the_live_stream(config: KafkaConfig) -> None:
    messages = feed(160, seed=20, past_until=40)
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, fred, jade = (await connect("pub@example.com"), await connect("fred@example.com"),
                           await connect("jade@example.com"))
        await pub.create_topic(TOPIC)
        await fred.subscribe(TOPIC, 600)  # the witness: what went live, and when
        fred_events = fred.events()
        await publish(pub, messages, 1, 40)
        last_live = max(n for n, m in enumerate(messages[:40], 1) if m[2] != PAST)
        await until(fred_events, lambda e: is_live(e, last_live))
        halfway, subscribed = asyncio.Event(), asyncio.Event()

        async def publisher() -> None:
            for n in range(41, 121):
                await publish(pub, messages, n, n)
                if n == 60:
                    halfway.set()
            await subscribed.wait()
            await publish(pub, messages, 121, len(messages))

        task = asyncio.create_task(publisher())
        await halfway.wait()
        await jade.subscribe(TOPIC, 600, link="jade-desk", cached=True)
        subscribed.set()
        await task
        got = [e for e in await until(jade.events(), lambda e: is_live(e, len(messages)))
               if isinstance(e, Delivered)]
        cached = [d for d in got if d.stamp is not None and d.stamp.snapshot]
        live = got[len(cached):]
        assert all(d.stamp is not None and not d.stamp.snapshot for d in live)
        # one link, contiguous across the cached part and the live part
        assert [d.stamp.link_seq for d in got if d.stamp] == list(range(1, len(got) + 1))
        cut = place(live[0]) - 1
        assert 60 <= cut <= 120
        assert [place(d) for d in live] == list(range(cut + 1, len(messages) + 1))
        assert {messages[place(d) - 1][0]: place(d) for d in cached} == cached_model(
            messages, cut)
        assert len(cached) == len({place(d) for d in cached})  # one per message-id
        for c in (pub, fred, jade):
            await c.close()


def test_cached_messages_meet_the_live_stream_exactly(kafka_config: KafkaConfig) -> None:
    """Cached: the latest unexpired revision per message-id at the moment of subscribing;
    then every later message live; link seqs contiguous across both."""
    asyncio.run(_meets_the_live_stream(kafka_config))


async def _plain_path(config: KafkaConfig) -> None:
    messages: list[Message] = [("1029", 1, None), ("1029", 3, FUTURE), ("1029", 2, None),
                               ("1030", 5, "0"), ("1031", 1, PAST), ("1032", 1, "*")]
    async with BrokerApp(config, robust=QUIET, sequenced=False) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, fred, jade = (await connect("pub@example.com"), await connect("fred@example.com"),
                           await connect("jade@example.com"))
        await pub.create_topic(TOPIC)
        await fred.subscribe(TOPIC, 600)
        await publish(pub, messages, 1, len(messages))
        await until(fred.events(), lambda e: is_live(e, 6))
        events = jade.events()
        await jade.subscribe(TOPIC, 600, cached=True)
        await pub.publish(TOPIC, doc(7, "1033", 1, None), "application/xml")
        got = [place(e) for e in await until(events, lambda e: is_live(e, 7))
               if isinstance(e, Delivered)]
        assert got == [2, 6, 7]  # 1029 rev 3, 1032; then live
        for c in (pub, fred, jade):
            await c.close()


def test_cached_messages_on_the_plain_path(kafka_config: KafkaConfig) -> None:
    """Without link seqs, the cached messages go first as plain data, then live data."""
    asyncio.run(_plain_path(config=kafka_config))


async def _after_kill(config: KafkaConfig) -> None:
    messages = feed(60, seed=21, past_until=60)
    args = ("--heartbeat-ms", "600000")
    proc, port = await start_broker(config.bootstrap, *args, namespace=config.namespace,
                                    logs=False)
    try:
        pub = await PubsubClient.connect("127.0.0.1", port, "pub@example.com")
        await pub.create_topic(TOPIC)
        await publish(pub, messages, 1, len(messages))  # ok: in the journal, maybe no more
        proc.kill()
        await proc.wait()
        with contextlib.suppress(ApexpsError, ConnectionError):
            await pub.close()
        proc, port = await start_broker(config.bootstrap, *args, namespace=config.namespace,
                                        logs=False)
        jade = await PubsubClient.connect("127.0.0.1", port, "jade@example.com")
        pub = await PubsubClient.connect("127.0.0.1", port, "pub@example.com")
        events = jade.events()
        await jade.subscribe(TOPIC, 600, cached=True)
        await pub.publish(TOPIC, doc(61, "9999", 1, None), "application/xml")  # the end
        got = [e for e in await until(events, lambda e: is_live(e, 61))
               if isinstance(e, Delivered)]
        assert all(d.stamp is not None and d.stamp.snapshot for d in got[:-1])
        assert {messages[place(d) - 1][0]: place(d) for d in got[:-1]} == cached_model(
            messages, len(messages))
        await pub.close()
        await jade.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_the_cache_is_rebuilt_after_a_kill_9(kafka_config: KafkaConfig) -> None:
    """Killed right after the last `ok`, the broker rebuilds the cache from Kafka: a cached
    subscribe after the restart gets the latest unexpired revisions."""
    asyncio.run(_after_kill(kafka_config))


async def _forced_race(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        loop = asyncio.get_running_loop()
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, fred, jade = (await connect("pub@example.com"), await connect("fred@example.com"),
                           await connect("jade@example.com"))
        await pub.create_topic(TOPIC)
        await fred.subscribe(TOPIC, 600)
        fred_events = fred.events()
        await pub.publish(TOPIC, doc(1, "1029", 1, None), "application/xml")
        await until(fred_events, lambda e: is_live(e, 1))
        recorded = app.service.subscribe

        def subscribe_then_publish(*args: object, **kwargs: object) -> object:
            """The subscription is recorded; before the service answers, a message is
            published and forwarded (the witness has it): the race the one-step opening
            closes, forced instead of hoped for."""
            sub = recorded(*args, **kwargs)  # type: ignore[arg-type]
            if kwargs.get("subscriber", args[1] if len(args) > 1 else None) == "jade@example.com":
                async def publish_and_see() -> None:
                    await pub.publish(TOPIC, doc(2, "1030", 1, None), "application/xml")
                    await until(fred_events, lambda e: is_live(e, 2))
                asyncio.run_coroutine_threadsafe(publish_and_see(), loop).result(30)
            return sub

        app.service.subscribe = subscribe_then_publish  # type: ignore[method-assign]
        events = jade.events()
        await jade.subscribe(TOPIC, 600, link="jade-race", cached=True)
        await pub.publish(TOPIC, doc(3, "1031", 1, None), "application/xml")
        got = [d for d in await until(events, lambda e: is_live(e, 3))
               if isinstance(d, Delivered)]
        # message 2 came once, as a cached message: never also live
        assert [(place(d), d.stamp is not None and d.stamp.snapshot) for d in got] == [
            (1, True), (2, True), (3, False)]
        for c in (pub, fred, jade):
            await c.close()


def test_a_message_forwarded_while_subscribing_comes_once(kafka_config: KafkaConfig) -> None:
    """A message forwarded between the subscription being recorded and its cached messages
    being taken is among the cached messages and does not come live as well."""
    asyncio.run(_forced_race(kafka_config))
