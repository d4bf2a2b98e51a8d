"""A watch waits for the journal follower's catch-up (its current state holds what the journal
held when it came) outside the management lock, so watches that arrive together wait for it
together: under the lock each waited for a lazy fetch of its own, one after another, and 1,000
watches through the gateway took 70 s (adapters/pubsub/events.py). Real Kafka, real BEEP."""

from __future__ import annotations

import asyncio

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import PubsubClient
from broker.events import WatchTable
from broker.kafka_io import KafkaConfig
from broker.records import PublishType
from broker.robust.config import RobustConfig

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)


async def _together(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET, events=WatchTable()) as app:
        sequenced = app.handler.sequenced
        assert sequenced is not None
        caught_up = sequenced.caught_up
        waiting: list[int] = []
        both = asyncio.Event()

        async def each_waits_for_the_other() -> None:
            # a watch's catch-up ends only once the other watch's has begun: with the wait
            # under the lock, the second never begins and both watches time out
            waiting.append(1)
            if len(waiting) == 2:
                both.set()
            await both.wait()
            await caught_up()

        sequenced.caught_up = each_waits_for_the_other  # type: ignore[method-assign]
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade, fred = (await connect("pub@example.com"), await connect("jade@example.com"),
                           await connect("fred@example.com"))
        await pub.create_topic("q.t")
        await pub.publish("q.t", b"1", "text/plain", publish_type=PublishType.IMAGE,
                          message_id="A", implicit=False)
        replies = await asyncio.wait_for(asyncio.gather(
            jade.watch("q.t/A", {2}, 600, watch_id="j"),
            fred.watch("q.t/A", {2}, 600, watch_id="f")), 20)
        assert [r.code for r in replies] == [250, 250]
        assert len(waiting) == 2
        for c in (pub, jade, fred):
            await c.close()


def test_watches_wait_for_the_catch_up_together(kafka_config: KafkaConfig) -> None:
    """Two watches at once both wait for the follower's catch-up at the same time, and both
    are granted."""
    asyncio.run(_together(kafka_config))
