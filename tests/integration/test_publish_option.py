"""What a publisher says of a message (the `apexps.publish` option, docs/robust-binding.md §2.3)
reaches the journal and every subscriber's stamp; a malformed option refuses the data and
journals nothing. Real Kafka, real BEEP over TCP."""

from __future__ import annotations

import asyncio

import pytest

from adapters.apex.codec import Option
from adapters.apex.robust_stamp import PUBLISH_OPTION
from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, PubsubClient
from broker.kafka_io import KafkaConfig
from broker.records import PublishType
from broker.robust.config import RobustConfig
from common.errors import InvalidParameter, ParameterSyntaxError, SyntaxError_

pytestmark = pytest.mark.kafka

SENT = [
    (b"<q sym='IBM' bid='1' />", PublishType.IMAGE, "IBM", "6747", 1),
    (b"<q bid='2' />", PublishType.UPDATE, "IBM", None, 2),
    (b"<q bid='3' />", PublishType.CORRECTION, "IBM", "6747", 3),
    (b"<q />", PublishType.DROP, "IBM", None, None),
    (b"<q sym='MSFT' />", PublishType.ADD, "MSFT", "12", 5),
    (b"<plain />", PublishType.UPDATE, None, None, None),  # XML: parsed at ingest (561 if not)
]

BAD = [
    ("<publish type='snapshot' />", InvalidParameter),
    ("<publish pubseq='0' />", ParameterSyntaxError),
    ("<publish colour='red' />", ParameterSyntaxError),
    ("<!DOCTYPE publish [<!ENTITY a 'b'>]><publish token='&a;' />", SyntaxError_),
]


async def _publish_and_read(config: KafkaConfig) -> None:
    robust = RobustConfig(heartbeat_ms=600_000)
    async with BrokerApp(config, robust=robust) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        await pub.create_topic("q.items")
        await jade.subscribe("q.items", 600)
        for content, ptype, mid, token, pubseq in SENT:
            await pub.publish("q.items", content, "application/xml", publish_type=ptype,
                              message_id=mid, token=token, publisher_seq=pubseq)
        for xml, error in BAD:
            with pytest.raises(error):
                await pub.client.send(pub.endpoint, ["apex=pubsub/q.items@example.com"],
                                      b"<q />", "application/xml",
                                      options=(Option(PUBLISH_OPTION, content=xml),))
        # the connection and the service survive the refusals
        await pub.publish("q.items", b"after", publish_type="image", message_id="X")

        got: list[Delivered] = []
        events = jade.events()
        while len(got) < len(SENT) + 1:
            event = await asyncio.wait_for(anext(events), 30)
            if isinstance(event, Delivered):
                got.append(event)
        stamps = [d.stamp for d in got]
        assert all(s is not None for s in stamps)
        seen = [(d.content, s.publish_type, s.message_id, s.token)
                for d, s in zip(got, stamps, strict=True) if s is not None]
        assert seen == [(c, t, m, k) for c, t, m, k, _ in SENT] + [
            (b"after", PublishType.IMAGE, "X", None)]
        # the journal holds what was said, publisher seq included; the refused data are not
        # in it (source seqs run 1..7 with no gap)
        entries = list(app.core.journal.read_source("pub@example.com"))
        assert [e.source_seq for e in entries] == list(range(1, len(SENT) + 2))
        assert [(e.content, e.publish_type, e.message_id, e.permission_token, e.publisher_seq)
                for e in entries[:-1]] == SENT
        for c in (pub, jade):
            await c.close()


def test_publish_option_reaches_journal_and_stamps(kafka_config: KafkaConfig) -> None:
    asyncio.run(_publish_and_read(kafka_config))

