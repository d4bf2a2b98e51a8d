"""The well-known topics (content-based draft §6) over the wire: real Kafka, real BEEP over TCP.
WKT=Topics: one message per topic, a stable message-id and rising revisions, cached; listtopics
agrees with it, also after a kill -9. WKT=Subscriptions: each subscriber sees its own
subscriptions only (§6.3.1), another's are refused with 537; only the service publishes there."""

from __future__ import annotations

import asyncio
import contextlib
import re

import pytest

from adapters.apex.pubsub_codec import message_schema_element
from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, PubsubClient
from broker.kafka_io import KafkaConfig
from broker.records import PublishType, Topic, now_ms
from broker.robust.config import RobustConfig
from common.errors import AccessDenied, ApexpsError, InvalidParameter
from tests.integration.broker_process import start_broker
from tests.integration.test_cached_messages import until
from tests.integration.test_schemas_wire import QUOTE_XSD, SELECTOR_SCHEMA

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)
TOPICS, SUBS = "WKT=Topics", "WKT=Subscriptions"


def field(d: Delivered, name: str) -> str:
    found = re.search(rf"<(?:ps:)?{name}>([^<]*)</(?:ps:)?{name}>".encode(), d.content)
    assert found is not None, (name, d.content)
    return found.group(1).decode()


def about(topic: str) -> object:
    """Is the event the WKT=Topics message about `topic`?"""
    return lambda e: isinstance(e, Delivered) and f"<topic-name>{topic}<".encode() in e.content


async def cached_topics(client: PubsubClient, sentinel: PubsubClient, name: str,
                        ) -> list[Delivered]:
    """Subscribe to WKT=Topics with cached; create topic `name` (seen live) to know where the
    cached messages end; return those."""
    events = client.events()
    await client.subscribe(TOPICS, 600, cached=True)
    await sentinel.create_topic(name)
    got = [e for e in await until(events, about(name)) if isinstance(e, Delivered)]
    assert got[-1].stamp is not None and not got[-1].stamp.snapshot
    assert all(d.stamp is not None and d.stamp.snapshot for d in got[:-1])
    return got[:-1]


async def _topics(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        admin, jade, fred = (await connect("admin@example.com"),
                             await connect("jade@example.com"), await connect("fred@example.com"))
        await admin.create_topic(
            "q.one", description="quotes", selector_schemas=(SELECTOR_SCHEMA,),
            message_schema=message_schema_element(QUOTE_XSD.encode()))
        for name in ("q.two", "q.three"):
            await admin.create_topic(name)
        jade_events = jade.events()
        listed = await cached_topics(jade, admin, "q.four")
        (one,) = [d for d in listed if field(d, "topic-name") == "q.one"]
        assert field(one, "description") == "quotes"  # and §6.2's schemas:
        assert b"<message-schema><xs:schema" in one.content
        assert b"<xs:element name=\"net-change-pct\" type=\"xs:decimal\"/>" in one.content
        assert re.search(rb"<selector-schema [^>]*class=\"JMS\"", one.content)
        assert sorted(field(d, "topic-name") for d in listed) == ["q.one", "q.three", "q.two"]
        assert all(field(d, "disposition") == "publish" for d in listed)
        assert all(field(d, "ps:message-id") == field(d, "topic-name") for d in listed)
        assert all(d.originator == f"apex=pubsub/{TOPICS}@example.com" for d in listed)
        created = {field(d, "topic-name"): int(field(d, "ps:revision-id")) for d in listed}

        # a deletion: the same message-id, a higher revision, disposition cancel, a drop
        await admin.delete_topic("q.two")
        (gone,) = [e for e in await until(jade_events, about("q.two"))
                   if isinstance(e, Delivered) and b"q.two" in e.content]
        assert field(gone, "disposition") == "cancel"
        assert gone.stamp is not None and gone.stamp.publish_type is PublishType.DROP
        assert gone.stamp.message_id == "q.two"
        assert int(field(gone, "ps:revision-id")) > created["q.two"]
        # created again: a higher revision still
        await admin.create_topic("q.two")
        (again,) = [e for e in await until(jade_events, about("q.two"))
                    if isinstance(e, Delivered)]
        assert field(again, "disposition") == "publish"
        assert int(field(again, "ps:revision-id")) > int(field(gone, "ps:revision-id"))
        await admin.delete_topic("q.three")

        # the cached list is the current list, and listtopics says the same
        now = await cached_topics(fred, admin, "q.five")
        names = sorted(field(d, "topic-name") for d in now)
        assert names == ["q.four", "q.one", "q.two"]
        assert sorted(await fred.list_topics()) == sorted([*names, "q.five"])

        # the service's own: nobody else publishes there, deletes or creates them
        with pytest.raises(AccessDenied):
            await admin.publish(TOPICS, b"<forged />", "application/xml")
        with pytest.raises(AccessDenied):
            await admin.delete_topic(TOPICS)
        with pytest.raises(InvalidParameter):
            await admin.create_topic(SUBS)
        for c in (admin, jade, fred):
            await c.close()


def test_topics_topic_lists_the_topics_with_rising_revisions(kafka_config: KafkaConfig,
                                                              ) -> None:
    """WKT=Topics: a publish message per topic created, a cancel (drop, higher revision) per
    topic deleted; cached gives the current list, which listtopics agrees with."""
    asyncio.run(_topics(kafka_config))


async def _subscriptions(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        jade, fred = await connect("jade@example.com"), await connect("fred@example.com")
        await jade.create_topic("q.one")
        await jade.create_topic("q.two")
        await jade.subscribe("q.one", 600)
        await fred.subscribe("q.one", 600)
        await fred.subscribe("q.two", 600)

        # §6.3.1: jade may not read fred's subscriptions; nothing is recorded
        with pytest.raises(AccessDenied):
            await jade.subscribe(SUBS, 600, subscriber="fred@example.com", cached=True)
        assert [s.topic for s in app.service.subscriptions(SUBS)] == []

        events = jade.events()
        await jade.subscribe(SUBS, 600, cached=True)
        await jade.subscribe("q.two", 600)  # seen live
        got = [e for e in await until(
            events, lambda e: isinstance(e, Delivered) and b"q.two" in e.content)
            if isinstance(e, Delivered)]
        assert all(field(d, "subscriber") == "jade@example.com" for d in got)
        # cached: q.one (and the WKT=Subscriptions subscription itself, perhaps; it is
        # recorded before its cached messages are taken); live: q.two
        assert {field(d, "topic-name") for d in got if d.stamp and d.stamp.snapshot} <= {
            "q.one", SUBS}
        assert "q.one" in {field(d, "topic-name") for d in got}
        assert field(got[-1], "current-status") == "ACTIVE"

        # fred's changes never reach jade; her own cancel does, with a reason
        await fred.cancel("q.one")
        await jade.cancel("q.one")
        (ended,) = [e for e in await until(
            events, lambda e: isinstance(e, Delivered) and b"q.one" in e.content)
            if isinstance(e, Delivered)]
        assert field(ended, "subscriber") == "jade@example.com"
        assert field(ended, "current-status") == "TERMINATED"
        assert field(ended, "reason") == "cancelled"
        assert ended.stamp is not None and ended.stamp.publish_type is PublishType.DROP

        # a selector of one's own narrows one's own view; it never widens it to another's
        barney = await connect("barney@example.com")
        barney_events = barney.events()
        await barney.subscribe(SUBS, 600, cached=True, selector="(topic-name=q.two)",
                               selector_class="RFC-2254")
        await fred.subscribe("q.one", 600)  # fred's: not barney's to see
        await barney.subscribe("q.one", 600)  # barney's, but not q.two
        await barney.subscribe("q.two", 600)  # barney's and q.two: seen
        seen = [e for e in await until(
            barney_events, lambda e: isinstance(e, Delivered) and b"q.two" in e.content)
            if isinstance(e, Delivered)]
        assert [(field(d, "subscriber"), field(d, "topic-name")) for d in seen] == [
            ("barney@example.com", "q.two")]
        for c in (jade, fred, barney):
            await c.close()


def test_subscriptions_topic_is_private_to_each_subscriber(kafka_config: KafkaConfig) -> None:
    """WKT=Subscriptions: a subscriber sees its own subscriptions, with state and reason, and
    nothing of another's; asking for another's is 537."""
    asyncio.run(_subscriptions(kafka_config))


async def _after_kill(config: KafkaConfig) -> None:
    args = ("--heartbeat-ms", "600000")
    proc, port = await start_broker(config.bootstrap, *args, namespace=config.namespace,
                                    logs=False)
    try:
        admin = await PubsubClient.connect("127.0.0.1", port, "admin@example.com")
        for name in ("q.a", "q.b", "q.c"):
            await admin.create_topic(name)
        await admin.delete_topic("q.b")
        seen = await PubsubClient.connect("127.0.0.1", port, "seen@example.com")
        before = {field(d, "topic-name"): field(d, "ps:revision-id")
                  for d in await cached_topics(seen, admin, "q.d")}
        proc.kill()
        await proc.wait()
        with contextlib.suppress(ApexpsError, ConnectionError):
            await admin.close()
        proc, port = await start_broker(config.bootstrap, *args, namespace=config.namespace,
                                        logs=False)
        admin = await PubsubClient.connect("127.0.0.1", port, "admin@example.com")
        jade = await PubsubClient.connect("127.0.0.1", port, "jade@example.com")
        listed = await cached_topics(jade, admin, "q.e")
        # the very messages journaled before the kill, from the rebuilt cache
        after = {field(d, "topic-name"): field(d, "ps:revision-id") for d in listed}
        assert sorted(after) == ["q.a", "q.c", "q.d"]
        assert {k: after[k] for k in before} == before
        assert sorted(await jade.list_topics()) == ["q.a", "q.c", "q.d", "q.e"]
        for c in (admin, jade):
            await c.close()
        with contextlib.suppress(ApexpsError, ConnectionError):
            await seen.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_topics_topic_is_rebuilt_after_a_kill_9(kafka_config: KafkaConfig) -> None:
    """After a kill -9 the cached WKT=Topics is rebuilt from Kafka and agrees with
    listtopics."""
    asyncio.run(_after_kill(kafka_config))


async def _reconciled(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        # as a broker from before WKT=Topics left it: a topic and no message about it
        app.core.topics.put(Topic(name="q.old", created_at=now_ms(), owner="admin@example.com"))
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        admin, jade = await connect("admin@example.com"), await connect("jade@example.com")
        listed = await cached_topics(jade, admin, "q.new")
        assert [field(d, "topic-name") for d in listed] == ["q.old"]
        for c in (admin, jade):
            await c.close()


def test_topics_topic_is_reconciled_with_the_registry_at_start(kafka_config: KafkaConfig,
                                                               ) -> None:
    """A topic the journal has no WKT=Topics message about gets one when the broker starts."""
    asyncio.run(_reconciled(kafka_config))


async def _expired(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        offset = [0]
        app.service._clock = lambda: now_ms() + offset[0]  # the clock port, moved forward
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        await jade.create_topic("q.short")
        events = jade.events()
        await jade.subscribe(SUBS, 86_400)
        await jade.subscribe("q.short", 600)
        await until(events, lambda e: isinstance(e, Delivered) and b"q.short" in e.content)
        offset[0] = 700_000
        await jade.list_topics()  # any request wakes the expiry timer to the moved clock
        got = await until(events, lambda e: isinstance(e, Delivered) and b"q.short" in e.content)
        ended = got[-1]
        assert isinstance(ended, Delivered)
        assert field(ended, "current-status") == "TERMINATED"
        assert field(ended, "reason") == "expired"
        await jade.close()


def test_an_expired_subscription_shows_terminated_with_its_reason(kafka_config: KafkaConfig,
                                                                   ) -> None:
    """A subscription whose duration runs out is published TERMINATED, reason expired."""
    asyncio.run(_expired(kafka_config))
