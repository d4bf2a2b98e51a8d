"""The link log writes through a producer of its own that lingers (broker/core.py,
`KafkaConfig.link_linger_ms`), against the real Kafka: with a linger far longer than the test
(25 s: librdkafka wants it below the delivery timeout), a link record stays queued while the
journal's producer, which never lingers, completes round trip after round trip; closing the
core flushes it."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, Position
from broker.records import Publication
from broker.robust.link_records import LinkItem, LinkKind

pytestmark = pytest.mark.kafka


def test_link_records_linger_on_a_producer_of_their_own(kafka_config: KafkaConfig) -> None:
    core = BrokerCore(dataclasses.replace(kafka_config, link_linger_ms=25_000))
    core.open()
    outcomes: list[object] = []
    durable = threading.Event()

    def settled(results: list[object]) -> None:
        outcomes.extend(results)
        durable.set()

    try:
        records = core.links.append_many(
            [LinkItem("desk-1", LinkKind.DATA, Position(0, 0), "fred@example.com", 1)], settled)
        assert [r.kind for r in records] == [LinkKind.RESET, LinkKind.DATA]
        for n in range(10):  # ten journal round trips: a link record on this producer, or
            # on one that did not linger, would be durable after the first
            core.journal.append_sync(Publication(topic="q.linger", source="fred@example.com",
                                                 content=b"<q n='%d'/>" % n))
        assert not durable.is_set()
    finally:
        core.close()  # flushes the link records
    assert durable.is_set()
    assert [getattr(r, "kind", r) for r in outcomes] == [LinkKind.RESET, LinkKind.DATA]
