"""Kafka's configuration, positions, admin calls and reads: with broker/kafka_producer.py, the
only modules that talk to confluent-kafka.

Everything else in apexps sees typed configuration (`KafkaConfig`), positions (`Position`) and a
few operations: produce with a durability callback (kafka_producer), read a partition range,
create topics.

Admin: topic creation, listing, and `drop_namespace` for throwaway namespaces; `answers` and
`cluster_size` for whoever must know whether a Kafka is there and how large.

Reads: an assigned (never subscribed, never committing) consumer, bounded by the high watermark
taken when the read starts, so a read always ends. `read_partition` makes a consumer per read,
for one-off reads; `PartitionReader` keeps one for reads repeated for ever (a registry's refresh);
`Tail` follows a partition as it grows (the journal follower, the registries' watchers).

The producer, its delivery reports, the checkpoint book's Kafka port and the warm-up are
broker/kafka_producer.py: they grew this module past 900 lines, and nothing here needs them.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from common.errors import JournalUnavailable, KafkaNotFound

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "KafkaConfig",
    "PartitionReader",
    "Position",
    "StoredRecord",
    "Tail",
    "answers",
    "ensure_topics",
    "partition_count",
    "read_partition",
    "watermarks",
]

log = structlog.get_logger(__name__)

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: How long an append may wait for Kafka before the publisher is told 421 (retry later).
DEFAULT_DELIVERY_TIMEOUT_MS = 30_000
#: The link log's producer lingers: nothing waits on a link record but the fan-out's durable
#: mark (and the rare catch-up or snapshot sent only once durable), so its records may gather
#: into fewer, larger produce requests, each of which wakes Kafka's network, request and
#: replica threads. Measured (robust, 1,000 msg/s, the link producer's requests per message
#: from librdkafka's stats, load 3.5-12, 2026-11-26): linger 0: 0.43-0.93; 10 ms: 0.051-0.094;
#: 20 ms: 0.039-0.051. 10 ms takes most of the gain at half the durable mark's delay of 20.
LINK_LINGER_MS = 10
#: How long Kafka may hold a tail's fetch while nothing arrives (see `Tail`).
TAIL_FETCH_WAIT_MS = 100
#: How long a read waits for Kafka (leadership moving, a restart) before JournalUnavailable.
KAFKA_WAIT_S = 30.0


@dataclass(frozen=True)
class KafkaConfig:
    """Where the journal lives and how apexps talks to it.

    bootstrap: `HOST:PORT[,HOST:PORT…]` of any Kafka cluster.
    namespace: prefix of every Kafka topic apexps owns (`NAMESPACE.journal`, …), so several
        independent brokers (or tests) can share one cluster.
    journal_partitions: partitions of the journal topic, fixed at creation (a source always
        maps to the same partition).
    replication: replication factor of new topics; None picks min(3, brokers in the cluster).
    journal_retention_ms: how long journal records are kept (-1: forever).
    link_partitions: partitions of the links topic (what each link seq carried), fixed at
        creation (a link always maps to the same partition). One by default: a fan-out turn
        then writes one Kafka record for all its links (broker/robust/links.py packs them per
        partition), and at paced rates each produce costs librdkafka ~300 µs of CPU whatever
        it carries; one partition takes far more than one broker's fan-out produces.
    link_retention_ms: the link retention window: how long what each link seq carried is kept
        for gap fill; older ranges are refused with 569 and repaired by source.
    link_linger_ms: how long the link log's own producer (broker/core.py) waits to gather
        records into one produce request (`LINK_LINGER_MS`). Deliveries are sent before their
        link records are durable (docs/robust-binding.md §2.5), so this delays only the
        durable mark, the clean stop's flush and what is sent once durable (catch-ups,
        snapshots).
    extra: further librdkafka settings (e.g. security.protocol, sasl.*) for every client.
    """

    bootstrap: str = DEFAULT_BOOTSTRAP
    namespace: str = "apexps"
    journal_partitions: int = 3
    replication: int | None = None
    journal_retention_ms: int = 30 * 24 * 3600 * 1000
    link_partitions: int = 1
    link_retention_ms: int = 24 * 3600 * 1000
    link_linger_ms: int = LINK_LINGER_MS
    delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS
    extra: dict[str, str] = field(default_factory=dict)

    def topic(self, role: str) -> str:
        return f"{self.namespace}.{role}"

    def client_conf(self, **overrides: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, **self.extra}
        conf.update(overrides)
        return conf


class Position(NamedTuple):
    """Kafka coordinates of one stored record."""

    partition: int
    offset: int


class StoredRecord(NamedTuple):
    position: Position
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


def _admin(config: KafkaConfig) -> AdminClient:
    return AdminClient(config.client_conf())


def answers(bootstrap: str, timeout_s: float = 5.0) -> bool:
    """True if a Kafka broker at `bootstrap` answers (DescribeCluster: its brokers)."""
    # A plain TCP connect first: librdkafka would log every refused connection to stderr.
    host, _, port = bootstrap.split(",", maxsplit=1)[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError:
        return False
    # Not a metadata request for every topic: on a cluster shared by many test namespaces
    # (13,400 topics, 2026-11-26) its answer took 3-6 s, past the 3 s socket timeout, and a
    # healthy Kafka looked dead; DescribeCluster answered in 0.17 s.
    # log_level 4: a handle destroyed with an event still on its background queue logs a
    # BGQUEUE line at info, which would reach a command's stderr before its own error.
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000,
                         "log_level": 4})
    try:
        cluster = admin.describe_cluster(request_timeout=timeout_s).result(timeout=timeout_s)
    except Exception:  # librdkafka raises KafkaException for every failure here
        return False
    return bool(cluster.nodes)


def cluster_size(config: KafkaConfig, timeout_s: float = 10.0) -> int:
    try:
        md = _admin(config).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaNotFound(
            f"no Kafka answers at {config.bootstrap}: start one with `apexps kafka start` "
            "or pass --bootstrap HOST:PORT"
        ) from exc
    return len(md.brokers)


def ensure_topics(config: KafkaConfig, specs: dict[str, tuple[int, dict[str, str]]]) -> None:
    """Create the missing topics among `specs` (name → (partitions, configs))."""
    admin = _admin(config)
    try:
        existing = set(admin.list_topics(timeout=10).topics)
    except KafkaException as exc:
        raise KafkaNotFound(f"no Kafka answers at {config.bootstrap}: {exc}") from exc
    replication = config.replication or min(3, cluster_size(config))
    new = [
        NewTopic(name, num_partitions=parts, replication_factor=replication, config=conf)
        for name, (parts, conf) in specs.items()
        if name not in existing
    ]
    if not new:
        return
    for name, fut in admin.create_topics(new, operation_timeout=30).items():
        try:
            fut.result()
            log.info("kafka topic created", topic=name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise JournalUnavailable(f"could not create kafka topic {name}: {exc}") from exc
    _await_leaders(admin, [t.topic for t in new])


def _await_leaders(admin: AdminClient, topics: list[str], timeout_s: float = 30.0) -> None:
    """New topics answer NOT_LEADER until their partitions have elected leaders."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=10)
        if all(
            t in md.topics and md.topics[t].partitions
            and all(p.leader >= 0 for p in md.topics[t].partitions.values())
            for t in topics
        ):
            return
        time.sleep(0.1)  # metadata has no change notification to await
    raise JournalUnavailable(f"kafka topics {topics} have no leader after {timeout_s}s")


def existing_topics(config: KafkaConfig, timeout_s: float = 10.0) -> set[str]:
    """The names of every topic the cluster has (asking for all: a metadata request naming a
    topic may create it where the cluster auto-creates topics)."""
    return set(_admin(config).list_topics(timeout=timeout_s).topics)


def drop_namespace(config: KafkaConfig, *, wait: bool = False, timeout_s: float = 10.0) -> int:
    """Delete every topic of `config`'s namespace (and of namespaces named after it, such as an
    audit's damaged copy); how many. For throwaway namespaces (tests, benchmarks): Kafka holds a
    file descriptor per segment, and a Kafka that keeps every run's ~15 partitions runs out of
    them (this machine caps a process at 20,000). `wait`: until Kafka has deleted them. A
    Kafka that does not answer has nothing to delete: 0."""
    admin = _admin(config)
    try:
        names = [t for t in admin.list_topics(timeout=timeout_s).topics
                 if t.startswith(config.namespace)]
    except KafkaException:
        return 0
    if names:
        futures = admin.delete_topics(names, operation_timeout=timeout_s if wait else 0)
        if wait:
            for future in futures.values():
                future.result()
    return len(names)


def partition_count(config: KafkaConfig, topic: str) -> int:
    md = _admin(config).list_topics(topic, timeout=10)
    meta = md.topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise JournalUnavailable(f"kafka topic {topic} does not exist")
    return len(meta.partitions)


def _consumer(config: KafkaConfig, **overrides: Any) -> Consumer:
    return Consumer(
        config.client_conf(
            **{
                "group.id": f"apexps-reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 10,
                **overrides,
            }
        )
    )


def _watermarks(c: Consumer, topic: str, partition: int,
                wait_s: float = KAFKA_WAIT_S) -> tuple[int, int]:
    # Right after a topic is created or Kafka restarts, leadership may still be moving.
    deadline = time.monotonic() + wait_s
    while True:
        timeout = min(10.0, max(0.1, deadline - time.monotonic()))
        try:
            got = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
            if got is not None:  # documented to mean a timeout; seen as _TIMED_OUT instead
                return int(got[0]), int(got[1])
            err = KafkaError(KafkaError._TIMED_OUT)
        except KafkaException as exc:
            err = exc.args[0]
            if not err.retriable() and err.code() not in _LEADER_MOVING:
                raise JournalUnavailable(f"kafka offsets of {topic}[{partition}]: {err}") from exc
        if time.monotonic() > deadline:
            raise JournalUnavailable(f"kafka offsets of {topic}[{partition}]: {err}")
        time.sleep(0.1)


_LEADER_MOVING = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                  KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT)


def watermarks(config: KafkaConfig, topic: str, partition: int) -> tuple[int, int]:
    c = _consumer(config)
    try:
        return _watermarks(c, topic, partition)
    finally:
        c.close()


def offset_for_time(config: KafkaConfig, topic: str, partition: int, ts_ms: int) -> int:
    """The first offset whose timestamp is ≥ ts_ms (the high watermark if none is)."""
    c = _consumer(config)
    try:
        (tp,) = c.offsets_for_times([TopicPartition(topic, partition, ts_ms)], timeout=10)
        if tp.offset < 0:
            return _watermarks(c, topic, partition)[1]
        return int(tp.offset)
    finally:
        c.close()


def read_partition(
    config: KafkaConfig,
    topic: str,
    partition: int,
    start: int | None = None,
    end: int | None = None,
    *,
    batch: int = 1000,
) -> Iterator[StoredRecord]:
    """Records of one partition from `start` (None: the beginning) up to `end` (exclusive;
    None: the high watermark when the read starts). Always terminates."""
    c = _consumer(config)
    try:
        low, high = _watermarks(c, topic, partition)
        stop = high if end is None else min(end, high)
        first = low if start is None else max(start, low)
        yield from _read_range(c, topic, partition, first, stop, batch=batch)
    finally:
        c.close()


def _read_range(c: Consumer, topic: str, partition: int, first: int, stop: int, *,
                batch: int) -> Iterator[StoredRecord]:
    """Records at offsets [first, stop) through `c`, which this assigns to the partition."""
    if first >= stop:
        return
    c.assign([TopicPartition(topic, partition, first)])
    idle_deadline = time.monotonic() + 30
    at = first
    while True:
        # consume() returns once it has `batch` messages or the timeout passed: near the
        # end of the range fewer than `batch` are left, and waiting 0.5 s for the rest
        # stalled every bounded read; there the wait is short and the loop asks again.
        msgs = c.consume(batch, timeout=0.5 if stop - at > batch else 0.01)
        if not msgs:
            # Offsets can be missing (compaction) at the very end of the range.
            (pos,) = c.position([TopicPartition(topic, partition)])
            if pos.offset >= stop:
                return
            if time.monotonic() > idle_deadline:
                raise JournalUnavailable(f"reading {topic}[{partition}] stalled before {stop}")
            continue
        idle_deadline = time.monotonic() + 30
        for m in msgs:
            if m.error() is not None:
                raise JournalUnavailable(f"reading {topic}[{partition}]: {m.error()}")
            off: int = m.offset() or 0  # None only for error events, handled above
            if off >= stop:
                return
            yield StoredRecord(Position(partition, off), m.key(), m.value(), m.timestamp()[1])
            if off + 1 >= stop:
                return
            at = off + 1


class PartitionReader:
    """Bounded reads of one topic's partitions, asked again and again, through one consumer.

    `read_partition` makes a librdkafka client per read: four or five threads, a bootstrap and
    a broker connection, metadata and ApiVersions, then a close. For a caller that looks every
    second (the access follower) that was a new client a second for ever, in this process and
    in Kafka's JVM. This keeps one consumer and its connection; looking costs one watermark
    request (`cached=False`: asked of the partition leader over that connection).

    Between reads the consumer is assigned nothing, so it fetches nothing: an assigned idle
    consumer would send Kafka a fetch every `fetch.wait.max.ms` (10 ms here) for ever.

    The consumer is made on first use. After any failure it is closed and the next call makes a
    new one, so nothing a failure leaves behind (a fatal error, a half-done read) outlives it;
    while Kafka is away that is one client per failed call, each after `wait_s` of trying.
    Generic errors (lost connections) go to a callback that logs them, not into the records a
    later read returns. Not thread-safe: one caller at a time.
    """

    def __init__(self, config: KafkaConfig, topic: str, *, wait_s: float = KAFKA_WAIT_S) -> None:
        self.topic = topic
        self.wait_s = wait_s
        self._config = config
        self._c: Consumer | None = None
        self._closed = False

    def _consumer(self) -> Consumer:
        if self._closed:
            raise RuntimeError(f"the reader of {self.topic} is closed")
        if self._c is None:
            self._c = _consumer(self._config, error_cb=self._on_error)
        else:
            # Serve callbacks queued while idle (errors from a Kafka restart, say), so they
            # neither pile up nor wait for the next read. Nothing is assigned: no records.
            self._c.poll(0)
        return self._c

    def _on_error(self, err: KafkaError) -> None:
        # librdkafka reconnects by itself; a fatal error surfaces from the next call, which
        # then fails and makes way for a new consumer.
        if err.fatal():
            log.error("kafka reader fatal error", topic=self.topic, error=str(err))
        else:
            log.debug("kafka reader error", topic=self.topic, error=str(err))

    def _drop(self) -> None:
        c, self._c = self._c, None
        if c is not None:
            try:
                c.close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("kafka reader close", topic=self.topic, error=str(exc))

    def watermarks(self, partition: int) -> tuple[int, int]:
        """(low, high) of `partition` now; JournalUnavailable if Kafka does not say in time."""
        try:
            return _watermarks(self._consumer(), self.topic, partition, self.wait_s)
        except (JournalUnavailable, KafkaException) as exc:
            self._drop()
            if isinstance(exc, JournalUnavailable):
                raise
            raise JournalUnavailable(f"kafka offsets of {self.topic}[{partition}]: {exc}") from exc

    def read(self, partition: int, start: int | None = None, end: int | None = None, *,
             batch: int = 1000) -> list[StoredRecord]:
        """Records of `partition` in [start, end) as `read_partition` reads them (None: the
        watermarks now), all at once: the consumer is unassigned again before this returns."""
        if start is None or end is None:
            low, high = self.watermarks(partition)
            start = low if start is None else max(start, low)
            end = high if end is None else min(end, high)
        c = self._consumer()
        try:
            return list(_read_range(c, self.topic, partition, start, end, batch=batch))
        except (JournalUnavailable, KafkaException) as exc:
            self._drop()
            if isinstance(exc, JournalUnavailable):
                raise
            raise JournalUnavailable(f"reading {self.topic}[{partition}]: {exc}") from exc
        finally:
            if self._c is not None:
                try:
                    self._c.unassign()
                except KafkaException:
                    self._drop()  # whatever state it is in, the next call starts afresh

    def close(self) -> None:
        """Close the consumer; idempotent. Reading afterwards raises RuntimeError."""
        self._closed = True
        self._drop()


class Tail:
    """Follow every partition of `topic` from its current end (or from `start` offsets), for
    live fan-out: `poll()` returns what arrived, waiting at most `timeout_s` for the first.

    Assigned, never subscribed and never committing: where a follower resumes is its owner's
    business (the journal is the record). By default a fetch is answered as soon as a record
    arrives (`fetch.min.bytes` 1), however long it may wait: so the wait is long
    (`TAIL_FETCH_WAIT_MS`), and an idle tail asks Kafka ten times a second rather than 500
    (measured: produce→tail p50 ~1 ms either way; the follower's idle CPU 3% of a core -> 0.4%,
    and Kafka's spent answering it). That is bench_peers's raw-Kafka subscriber; the journal
    follower, off the critical path, asks for more bytes (broker/pubsub/follower.py).
    """

    def __init__(self, config: KafkaConfig, topic: str,
                 start: dict[int, int] | None = None, *,
                 fetch_wait_ms: int = TAIL_FETCH_WAIT_MS, fetch_min_bytes: int = 1) -> None:
        """`fetch_wait_ms`, `fetch_min_bytes`: Kafka answers a fetch once it has that many
        bytes for it or has waited that long; the defaults answer at the first record."""
        self._c = Consumer(config.client_conf(**{
            "group.id": f"apexps-tail-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": fetch_wait_ms,
            "fetch.min.bytes": fetch_min_bytes,
        }))
        parts = partition_count(config, topic)
        offsets = {p: _watermarks(self._c, topic, p)[1] for p in range(parts)}
        offsets.update(start or {})
        self.start = dict(offsets)
        self._c.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])

    def poll(self, max_records: int = 1000, timeout_s: float = 0.2) -> list[StoredRecord]:
        # Wait for one record, then take what is already fetched: `consume(n, timeout)` alone
        # waits for all n or the whole timeout in some librdkafka versions
        # (confluent-kafka-python#407), which would put the timeout on every delivery.
        first = self._c.poll(timeout_s)
        if first is None:
            return []
        out: list[StoredRecord] = []
        for m in [first, *self._c.consume(max_records - 1, timeout=0)]:
            if m.error() is not None:
                log.warning("journal tail", error=str(m.error()))
                continue
            out.append(StoredRecord(Position(m.partition() or 0, m.offset() or 0), m.key(),
                                    m.value(), m.timestamp()[1]))
        return out

    def close(self) -> None:
        self._c.close()
