"""A change is notified once, even when the journal follower hands it over again (real Kafka,
real BEEP). After a restart the follower may start before where the item store's recovery
ended (the fan-out's durable mark lags the items' checkpoint), so it hands the live path
records whose Notifies the last broker journaled already; they must not be journaled again
with new source seqs, which the watcher's link would deliver as new Notifies (the gateway's
`test_watches_sharing_a_session_across_a_broker_kill_9` saw exactly that, now and then). Here
the handing-over is made to happen: the update the watcher was notified of is forwarded again,
and the next Notify the watcher gets is the next change's."""

from __future__ import annotations

import asyncio

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import PubsubClient
from broker.events import WatchTable
from broker.kafka_io import KafkaConfig
from broker.records import PublishType
from tests.integration.test_resource_events import QUIET, contents, next_notify

pytestmark = pytest.mark.kafka


async def _twice(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET, events=WatchTable()) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        async with await connect("pub@example.com") as pub, \
                await connect("jade@example.com") as jade:
            await pub.create_topic("q.once")
            await pub.publish("q.once", b"<v n='0' />", "application/xml",
                              publish_type=PublishType.IMAGE, message_id="A", implicit=False)
            events = jade.events()
            await jade.watch("q.once/A", {2}, 600, watch_id="w")
            current, _ = await next_notify(events)
            assert contents(current) == [b"<v n='0' />"]
            await pub.publish("q.once", b"<v n='1' />", "application/xml",
                              publish_type=PublishType.UPDATE, message_id="A")
            first, _ = await next_notify(events)
            assert contents(first) == [b"<v n='1' />"]

            state = app.core.items.get("q.once", "A")
            assert state is not None and state.deltas
            app.handler.forward([state.deltas[-1].entry])  # the follower's second handing

            await pub.publish("q.once", b"<v n='2' />", "application/xml",
                              publish_type=PublishType.UPDATE, message_id="A")
            after, _ = await next_notify(events)
            assert contents(after) == [b"<v n='2' />"]


def test_a_change_handed_over_again_is_not_notified_again(kafka_config: KafkaConfig) -> None:
    asyncio.run(_twice(kafka_config))
