"""Kafka holds what each subscriber acknowledged (DESIGN invariant 8): a robust subscriber
answers `ok` to each delivery, and the broker writes, per link and epoch, the newest record it
was answered for to `NS.acks` (broker/robust/acks.py). Real Kafka, real BEEP over TCP."""

from __future__ import annotations

import asyncio

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import PubsubClient
from adapters.client.robust_client import RobustSubscriber
from broker.codec import Codec
from broker.kafka_io import KafkaConfig, read_partition
from broker.robust.acks import SCHEMA, ack_key
from broker.robust.config import RobustConfig

pytestmark = [pytest.mark.kafka]

QUIET = RobustConfig(heartbeat_ms=600_000)  # link seqs are then exactly the messages


def test_what_the_subscriber_answered_is_in_kafka(kafka_config: KafkaConfig) -> None:
    async def body() -> tuple[str, int]:
        async with BrokerApp(kafka_config, robust=QUIET) as app:
            assert app.acks is not None
            pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
            jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
            await pub.create_topic("q.acks")
            robust = await RobustSubscriber.open(jade, "jade-acks")
            await robust.subscribe("q.acks", 600)
            messages = robust.messages()
            for k in range(30):
                await pub.publish("q.acks", f"m{k}".encode())
            got = [await asyncio.wait_for(anext(messages), 60) for _ in range(30)]
            last = got[-1].stamp
            assert last.epoch is not None
            await asyncio.wait_for(app.acks.reached(robust.link, last.epoch, last.link_seq), 60)
            await robust.close()
            await jade.close()
            await pub.close()
            return robust.link, last.epoch
        # closing the broker writes what is left and flushes its producer

    link, epoch = asyncio.run(asyncio.wait_for(body(), 180))
    codec = Codec()
    found = [codec.decode(rec.value, expect=SCHEMA)[1]
             for rec in read_partition(kafka_config, kafka_config.topic("acks"), 0)
             if rec.key == ack_key(link, epoch) and rec.value is not None]
    assert found, "no acknowledgement of the link in Kafka"
    newest = found[-1]
    # 30 data after the link's first reset (ordinal 0): the 30th is link seq 30
    assert (newest["link"], newest["epoch"], newest["seq"], newest["ordinal"]) == \
        (link, epoch, 30, 30)
