"""The fan-out mark (broker/robust/fanout.py): what is in the journal but was never put on its
subscribers' links when a broker stopped is sequenced by the next broker, not lost. Real Kafka,
real BEEP over TCP.

A broker killed between a publication becoming durable and its link seqs becoming durable
leaves exactly that state: journal records beyond the fan-out mark. The test makes the state
deterministically — the journal gets records while no broker serves the namespace — and checks
that the next broker delivers them on the link, right after what the link carried before."""

from __future__ import annotations

import asyncio

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import PubsubClient
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.records import Publication
from broker.robust.config import RobustConfig
from tests.integration.deliveries import deliveries

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000)
LINK = "jade-mark"


def _journal_behind_the_fanout(config: KafkaConfig, count: int) -> None:
    """Append to the journal as a broker's publish path does, with no fan-out running."""
    core = BrokerCore(config, robust=QUIET)
    core.open()
    try:
        for k in range(count):
            core.journal.append_sync(Publication("q.mark", "pub@example.com",
                                                 f"unsequenced {k}".encode()))
    finally:
        core.close()


async def _mark(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        await pub.create_topic("q.mark")
        await jade.subscribe("q.mark", 3600, link=LINK)
        for k in range(3):
            await pub.publish("q.mark", f"live {k}".encode())
        before = await deliveries(jade, 3)
        for c in (pub, jade):
            await c.close()

    await asyncio.to_thread(_journal_behind_the_fanout, config, 5)

    async with BrokerApp(config, robust=QUIET) as app:
        # the new broker puts them on the link while jade is away (the link log shows it)
        assert app.handler.sequenced is not None
        await asyncio.wait_for(app.handler.sequenced.sent_through(LINK, 8), 30)
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        await jade.gap(LINK, 4)  # a subscriber that comes back asks for what it missed
        after = await deliveries(jade, 5)
        await jade.close()
    stamps = [d.stamp for d in before + after]
    assert all(s is not None for s in stamps)
    # the link goes on where it stood, in the same epoch, and carries each message once
    assert [(s.epoch, s.link_seq) for s in stamps if s is not None] == \
        [(0, n) for n in range(1, 9)]
    assert [s.source_seq for s in stamps if s is not None] == list(range(1, 9))
    assert [d.content for d in after] == [f"unsequenced {k}".encode() for k in range(5)]


def test_journaled_but_unsequenced_messages_reach_their_links_after_a_restart(
        kafka_config: KafkaConfig) -> None:
    asyncio.run(_mark(kafka_config))
