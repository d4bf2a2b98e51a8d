"""The broker core: the journal and the registries over one Kafka, opened and recovered as one.

Later layers (the pubsub service, sequencing, selectors) hang off this object; the wire adapters
call into them. After a crash, `open()` rebuilds everything from Kafka: registries are read
whole from their compacted topics and the journal replays its tail (see broker/journal.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from broker.codec import Codec, default_codec
from broker.holds import HeldData
from broker.journal import Journal, RecoveryReport
from broker.kafka_io import KafkaConfig, ensure_topics
from broker.kafka_producer import KafkaProducer, ReportLoop
from broker.names import validate_topic
from broker.records import AccessEntry, Subscription, Topic, now_ms
from broker.registry import Registry
from broker.robust.acks import AckLog
from broker.robust.config import RobustConfig
from broker.robust.fanout import FanoutMarks
from broker.robust.items import ItemStore
from broker.robust.links import LinkLog, LinkRecoveryReport
from common.errors import ApexpsError, InvalidParameter

__all__ = ["BrokerCore", "OpenReport"]

log = structlog.get_logger(__name__)

_COMPACT = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}


@dataclass(frozen=True)
class OpenReport:
    journal: RecoveryReport
    topics: int
    subscriptions: int
    access_entries: int
    links: LinkRecoveryReport | None = None


class BrokerCore:
    def __init__(self, config: KafkaConfig, codec: Codec | None = None,
                 robust: RobustConfig | None = None) -> None:
        self.config = config
        self.codec = codec or default_codec()
        self.robust = robust or RobustConfig()
        self._producer: KafkaProducer | None = None
        #: the link log's own producer, lingering (`KafkaConfig.link_linger_ms`)
        self._link_producer: KafkaProducer | None = None
        self._registries: tuple[Registry[Any], ...] = ()

    def kafka_topics(self) -> dict[str, tuple[int, dict[str, str]]]:
        """Every Kafka topic apexps owns, with partitions and configs (docs/architecture.md)."""
        c = self.config
        return {
            c.topic("journal"): (c.journal_partitions, {
                "cleanup.policy": "delete", "retention.ms": str(c.journal_retention_ms)}),
            c.topic("sources"): (1, _COMPACT),
            c.topic("topics"): (1, _COMPACT),
            c.topic("subscriptions"): (1, _COMPACT),
            c.topic("access"): (1, _COMPACT),
            c.topic("holds"): (1, _COMPACT),
            # What each link seq carried (broker/robust/links.py), kept for gap fill.
            c.topic("links"): (c.link_partitions, {
                "cleanup.policy": "delete", "retention.ms": str(c.link_retention_ms)}),
            c.topic("linkindex"): (1, _COMPACT),
            # The current image and deltas of every data item (broker/robust/items.py).
            c.topic("items"): (1, _COMPACT),
            # How far the journal is on subscriber links (broker/robust/fanout.py).
            c.topic("fanout"): (1, _COMPACT),
            # How far each subscriber answered `ok` on its link (broker/robust/acks.py).
            c.topic("acks"): (1, _COMPACT),
        }

    def open(self) -> OpenReport:
        ensure_topics(self.config, self.kafka_topics())
        self._producer = KafkaProducer(self.config)
        p, c, k = self._producer, self.codec, self.config
        self.journal = Journal(k, p, c)
        self.topics: Registry[Topic] = Registry(
            k, p, c, role="topics", schema="topic_record", from_avro=Topic.from_avro)
        self.subscriptions: Registry[Subscription] = Registry(
            k, p, c, role="subscriptions", schema="subscription_record",
            from_avro=Subscription.from_avro)
        self.access: Registry[AccessEntry] = Registry(
            k, p, c, role="access", schema="access_entry", from_avro=AccessEntry.from_avro)
        self.holds: Registry[HeldData] = Registry(
            k, p, c, role="holds", schema="held_data", from_avro=HeldData.from_avro)
        #: Closed with the core: a refreshed registry holds a Kafka consumer.
        self._registries = (self.topics, self.subscriptions, self.access, self.holds)
        self.holds.load()
        # The link log (and its checkpoints) on a producer of its own that lingers: no delivery
        # waits for a link record, so its produces need not be one Kafka request each, as the
        # journal's must (a publication's `ok` and its forwarding wait for those).
        self._link_producer = KafkaProducer(k, **{"linger.ms": k.link_linger_ms})
        self.links = LinkLog(k, self._link_producer, c, bits=self.robust.seq_bits,
                             max_gap=self.robust.max_gap)
        # Recovered (and from then on written) only by the broker that serves the live path:
        # `BrokerApp` calls `items.recover()`; tools that open the core leave it alone.
        self.items = ItemStore(k, p, c)
        self.fanout = FanoutMarks(k, p, c)
        self.acks = AckLog(k, p, c)
        report = OpenReport(self.journal.recover(), self.topics.load(),
                            self.subscriptions.load(), self.access.load(), self.links.recover())
        log.info("broker core open", bootstrap=k.bootstrap, namespace=k.namespace,
                 topics=report.topics, subscriptions=report.subscriptions,
                 access_entries=report.access_entries)
        return report

    def serve_reports_on(self, loop: ReportLoop) -> bool:
        """Serve the producers' delivery reports on `loop`'s thread (call it there) instead of
        their poll threads (broker/report_pipe.py); False where this process cannot."""
        served = [p.serve_reports_on(loop)  # each of them, not just until one says no
                  for p in (self._producer, self._link_producer) if p is not None]
        return all(served)

    def close(self) -> None:
        """Close what `open` made; idempotent. Stop whatever refreshes the registries first
        (`AccessControl.stop_following`): a refresh after this raises."""
        for registry in self._registries:
            registry.close()
        if self._producer is not None:
            try:
                self.items.close()  # a no-op unless this process recovered the items
            except ApexpsError as exc:
                log.warning("items not checkpointed at close; the next start replays more",
                            error=str(exc))
            if self._link_producer is not None:  # its flush: the link records still queued
                self._link_producer.close()
                self._link_producer = None
            self._producer.close()
            self._producer = None

    # The pubsub service owns the operations; these keep the registries honest.

    def create_topic(self, name: str, *, owner: str | None = None,
                     description: str | None = None) -> Topic:
        validate_topic(name)
        if name in self.topics:
            raise InvalidParameter(f"topic {name!r} already exists")
        return self.topics.put(Topic(name=name, created_at=now_ms(), owner=owner,
                                     description=description))

    def delete_topic(self, name: str) -> None:
        validate_topic(name)
        if not self.topics.delete(name):
            raise InvalidParameter(f"topic {name!r} does not exist")
