"""Forwarding on acknowledgement (broker/delivery/cursor.py) against the real Kafka and wire: a
publication reaches its subscribers from memory once Kafka acknowledged its journal record,
whether or not the journal follower ever reads it back. The follower is silenced here (as one
lagging far behind would be); subscribers still get every message once, in order, on the plain
path and on sequenced links, and the well-known topics' records (journaled by the broker too)
leave no hole that only the follower could fill."""

from __future__ import annotations

import asyncio

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import PubsubClient
from broker.kafka_io import KafkaConfig
from broker.records import JournalEntry
from broker.robust.config import RobustConfig
from tests.integration.deliveries import deliveries

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)


async def _silenced(config: KafkaConfig, sequenced: bool) -> None:
    async with BrokerApp(config, robust=QUIET, sequenced=sequenced) as app:
        followed: list[JournalEntry] = []

        def deaf(entries: list[JournalEntry], reached: dict[int, int]) -> None:
            followed.extend(entries)  # read back from Kafka, and dropped on the floor

        app.follower._deliver = deaf  # type: ignore[method-assign]
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com")
        await pub.create_topic("q.ack")
        await fred.subscribe("q.ack", 600, link="fred-ack" if sequenced else None)
        for k in range(5):
            await pub.publish("q.ack", f"a{k}".encode())
        got = await deliveries(fred, 5)
        assert [d.content for d in got] == [f"a{k}".encode() for k in range(5)]
        assert app.handler.cursor.by_ack >= 5 and app.handler.cursor.waiting() == 0
        for c in (pub, fred):
            await c.close()


@pytest.mark.parametrize("sequenced", [False, True], ids=["plain", "robust"])
def test_subscribers_get_what_kafka_acknowledged_without_the_follower(
        kafka_config: KafkaConfig, sequenced: bool) -> None:
    asyncio.run(_silenced(kafka_config, sequenced))


async def _forward_fails(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET, sequenced=False) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        await pub.create_topic("q.fails")
        cursor = app.handler.cursor
        acked = cursor.acked

        def broken(entries: list[JournalEntry]) -> None:
            raise RuntimeError("forwarding broke")

        cursor.acked = broken  # type: ignore[method-assign]
        # answered (durable) although forwarding it raised: the publisher is never left
        # waiting on a subscriber's trouble
        await asyncio.wait_for(pub.publish("q.fails", b"one"), 30)
        cursor.acked = acked  # type: ignore[method-assign]
        await asyncio.wait_for(pub.publish("q.fails", b"two"), 30)  # and it keeps serving
        await pub.close()


def test_a_publisher_is_answered_when_forwarding_its_message_fails(
        kafka_config: KafkaConfig) -> None:
    asyncio.run(_forward_fails(kafka_config))
