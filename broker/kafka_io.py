"""The one module that talks to confluent-kafka.

Everything else in apexps sees typed configuration (`KafkaConfig`), positions (`Position`) and a
few operations: produce with a durability callback, read a partition range, create topics.

Producer: idempotent, `acks=all`, so a delivery report without error means the record is in
every in-sync replica and will not be duplicated by librdkafka's own retries. A background thread
calls `poll()` so delivery callbacks run promptly whatever the caller does (confluent-kafka's
`examples/producer.py` calls `poll(0)` after each produce for the same reason), until an event
loop takes the reports over (`serve_reports_on`, broker/report_pipe.py: one wake-up per report
instead of two). `BufferError` (local queue full) is backpressure: wait for deliveries and
retry, up to a deadline.

Admin: topic creation, listing, and `drop_namespace` for throwaway namespaces. `warm` does to a
fresh Kafka what the broker's first minute would (its first producer id, its first consumer
group), so the local Kafka is warm before it says it is ready.

Reads: an assigned (never subscribed, never committing) consumer, bounded by the high watermark
taken when the read starts, so a read always ends. `read_partition` makes a consumer per read,
for one-off reads; `PartitionReader` keeps one for reads repeated for ever (a registry's refresh).

Why one module of this length: it is the one place confluent-kafka is imported (the lint
rules hold every other module to that), so the producer, the reads, the admin calls and the
warm-up live together behind typed functions. What is not Kafka's is kept out: the record
writer (`journal_writer.py`), the codec, the checkpoint book. What grew it past 700 lines
this round is settings, not logic: the link log's lingering producer (`link_linger_ms`) and a
tail's fetch wait and size, each with the measurement that chose it beside it; past 900, the
producer's hand-over of its delivery reports to an event loop (`serve_reports_on`, with the
parked poll thread's rescue), whose ctypes half is broker/report_pipe.py, and `soon`, which
splits a checkpoint round into the loop's turns (broker/checkpoints.py). The producer is the
next thing to leave, as a module of its own, once the lint rule names two modules.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, Protocol

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Producer as _RdProducer
from confluent_kafka import version as confluent_version
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from broker.report_pipe import ReportPipe
from common.errors import JournalUnavailable, KafkaNotFound

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "Delivery",
    "KafkaCheckpoints",
    "KafkaConfig",
    "KafkaProducer",
    "PartitionReader",
    "Position",
    "StoredRecord",
    "Tail",
    "answers",
    "ensure_topics",
    "partition_count",
    "producer_conf",
    "read_partition",
    "warm",
    "watermarks",
]

log = structlog.get_logger(__name__)

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: How long an append may wait for Kafka before the publisher is told 421 (retry later).
DEFAULT_DELIVERY_TIMEOUT_MS = 30_000
#: No lingering: librdkafka still batches whatever queues up while requests are in flight, and
#: measured here a 2 ms linger put ~6 ms on every quiet-time append (p50 0.5 ms -> 5.9 ms,
#: produce+delivery report, one local broker), which is the publish->deliver latency.
DEFAULT_LINGER_MS = 0
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
#: How often a producer whose reports the loop serves polls anyway: its after-poll hooks'
#: cadence (the poll thread's timeout before), and a bound on a report whose wake-up was lost.
REPORT_TICK_S = 0.05
#: A loop that has not served its producer's reports for this long is blocked (a wait on its
#: thread that no `produce_sync` announced: none in apexps, which waits for Kafka in worker
#: threads): the parked poll thread serves them until it serves again. Long enough that a
#: loaded machine's scheduling does not move reports off the loop.
REPORT_STALL_S = 1.0
#: librdkafka's own partitioner picks the partition (RD_KAFKA_PARTITION_UA).
_ANY_PARTITION = -1


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


DeliveryCallback = Callable[[Exception | None, Position | None], None]


class Delivery:
    """What becomes of one produced record: subclasses add slots for what they need to know
    and implement `delivered` and `failed`, which run on the thread serving reports (the poll
    thread, or the event loop's once it took them over) or on a thread inside `flush`.

    The instance itself is the record's librdkafka delivery callback. A record in flight thus
    costs one small object: no closure, no partial and its argument tuple. That matters more
    than it seems: with tens of thousands of records in flight, every container object is
    something the garbage collector walks again and again."""

    __slots__ = ()

    def delivered(self, partition: int, offset: int) -> None:
        """The record is durable at `offset` of `partition`."""
        raise NotImplementedError

    def failed(self, error: JournalUnavailable) -> None:
        """The record is not in Kafka and never will be (from this produce)."""
        raise NotImplementedError

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            self.delivered(msg.partition(), msg.offset())
        else:
            self.failed(_failure(err))


def producer_conf(config: KafkaConfig, **overrides: Any) -> dict[str, Any]:
    """The librdkafka settings of apexps's producer (the benchmark gives raw Kafka the same)."""
    return config.client_conf(
        **{
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": DEFAULT_LINGER_MS,
            "compression.type": "lz4",
            "delivery.timeout.ms": config.delivery_timeout_ms,
            "queue.buffering.max.messages": 500_000,
            **overrides,
        }
    )


def _failure(err: KafkaError) -> JournalUnavailable:
    return JournalUnavailable(f"kafka did not take the record: {err.str()}")


def _report(on_delivery: DeliveryCallback, err: KafkaError | None, msg: Any) -> None:
    if err is not None:
        on_delivery(_failure(err), None)
    else:
        on_delivery(None, Position(msg.partition(), msg.offset()))


class ReportLoop(Protocol):
    """What `KafkaProducer.serve_reports_on` needs of an event loop (asyncio's has it)."""

    def add_reader(self, fd: int, callback: Callable[[], object]) -> object: ...

    def remove_reader(self, fd: int) -> object: ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Any: ...

    def call_soon(self, callback: Callable[[], object]) -> Any: ...

    def call_soon_threadsafe(self, callback: Callable[[], object]) -> object: ...


class KafkaProducer:
    """Idempotent acks=all producer. Its delivery reports are served by a background poll
    thread, or, once `serve_reports_on(loop)` took them over, on the event loop's thread
    (broker/report_pipe.py); the poll thread then waits parked, woken only to serve reports
    while the loop's thread itself waits for Kafka (a full local queue, `produce_sync`)."""

    def __init__(self, config: KafkaConfig, **overrides: Any) -> None:
        self._client_id = str(config.extra.get("client.id") or overrides.get("client.id")
                               or f"apexps-{uuid.uuid4().hex[:12]}")
        overrides["client.id"] = self._client_id
        self._producer = _RdProducer(producer_conf(config, error_cb=self._on_error, **overrides))
        self._config = config
        self._closed = threading.Event()
        self._polled = threading.Event()
        #: set while the loop's thread waits for Kafka: the parked poll thread serves meanwhile
        self._rescue = threading.Event()
        self._after_poll: list[Callable[[], None]] = []
        self._loop: ReportLoop | None = None
        self._loop_thread: int | None = None
        self._pipe: ReportPipe | None = None
        self._tick: Any = None
        self._served_at = 0.0
        self._thread = threading.Thread(target=self._poll_loop, name="kafka-poll", daemon=True)
        self._thread.start()

    @staticmethod
    def _on_error(err: KafkaError) -> None:
        # librdkafka retries transient errors itself; a fatal one (e.g. fenced) ends the producer.
        if err.fatal():
            log.error("kafka producer fatal error", error=str(err))
        else:
            log.debug("kafka client error", error=str(err))

    def add_after_poll(self, hook: Callable[[], None]) -> None:
        """Run `hook` after each poll (used to batch checkpoints): on the thread that served
        the reports, and at least every `REPORT_TICK_S` while the producer is open."""
        self._after_poll.append(hook)

    def soon(self, work: Callable[[], None]) -> bool:
        """Queue `work` for the next turn of the loop that serves the reports and say True, if
        this is that loop's thread; False (the caller runs it now) on any other: a long piece
        of Python split into turns this way stalls none of the loop's connections."""
        loop = self._loop
        if loop is None or not self._waiting_thread_is_the_loop():
            return False
        loop.call_soon(work)
        return True

    def serve_reports_on(self, loop: ReportLoop) -> bool:
        """Serve delivery reports (and the after-poll hooks) on `loop`'s thread from now on;
        call it on that thread. False, and nothing changes, where the process cannot
        (broker/report_pipe.py says when)."""
        if self._pipe is not None:
            return True
        pipe = ReportPipe.open(self._producer, self._client_id, str(confluent_version()))
        if pipe is None:
            return False
        self._loop, self._loop_thread = loop, threading.get_ident()
        self._served_at, self._pipe = time.monotonic(), pipe
        loop.add_reader(pipe.fd, self._serve)
        self._tick = loop.call_later(REPORT_TICK_S, self._on_tick)
        self._serve()  # whatever the poll thread left
        return True

    def _serve(self) -> None:
        pipe = self._pipe
        if pipe is None:
            return
        self._served_at = time.monotonic()
        pipe.drain()
        self._poll(0)

    def _on_tick(self) -> None:
        if self._loop is not None and not self._closed.is_set():
            self._serve()
            self._tick = self._loop.call_later(REPORT_TICK_S, self._on_tick)

    def _poll(self, timeout_s: float) -> None:
        try:
            self._producer.poll(timeout_s)
        except Exception:  # a raising delivery callback must not end all delivery reports
            log.exception("delivery callback failed")
        self._polled.set()
        for hook in self._after_poll:
            try:
                hook()
            except Exception:  # a hook must never stop delivery callbacks
                log.exception("after-poll hook failed")

    def _poll_loop(self) -> None:
        while not self._closed.is_set():
            if self._pipe is not None and not self._rescue.is_set() \
                    and time.monotonic() - self._served_at < REPORT_STALL_S:
                self._rescue.wait(REPORT_STALL_S / 2)
                continue
            # No loop serves (none took over, or it is blocked: a wait for Kafka on its
            # thread that no `produce_sync` announced): serve here, as before it took over.
            self._poll(0.05)

    def _waiting_thread_is_the_loop(self) -> bool:
        """Whether the caller is the thread that serves reports: then it must not wait for a
        report without waking the poll thread to serve them meanwhile."""
        return self._pipe is not None and threading.get_ident() == self._loop_thread

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        on_delivery: DeliveryCallback | Delivery,
        *,
        partition: int | None = None,
    ) -> None:
        """Queue one record; `on_delivery` runs on the poll thread once Kafka has it (or not).

        Raises JournalUnavailable if Kafka refuses the record outright (then nothing is
        queued and `on_delivery` never runs)."""
        report = on_delivery if isinstance(on_delivery, Delivery) else partial(_report,
                                                                               on_delivery)
        part = _ANY_PARTITION if partition is None else partition
        try:
            self._producer.produce(topic, value, key, part, report)
        except BufferError:
            self._produce(topic, key, value, part, report)
        except KafkaException as exc:
            raise JournalUnavailable(f"kafka refused the record: {exc}") from exc

    def produce_many(self, topic: str,
                     records: Iterable[tuple[bytes | None, bytes, int, Delivery]],
                     ) -> list[tuple[Delivery, JournalUnavailable]]:
        """Queue `(key, value, partition, delivery)` records in order. Returns those Kafka
        refused outright, with why: they are not queued and their `delivery` never runs."""
        refused: list[tuple[Delivery, JournalUnavailable]] = []
        produce = self._producer.produce
        for key, value, part, delivery in records:
            try:
                produce(topic, value, key, part, delivery)
            except BufferError:
                try:
                    self._produce(topic, key, value, part, delivery)
                except JournalUnavailable as exc:
                    refused.append((delivery, exc))
            except Exception as exc:  # whatever it was, this record is not queued
                refused.append((delivery, JournalUnavailable(f"kafka refused the record: {exc}")))
        return refused

    def _produce(self, topic: str, key: bytes | None, value: bytes | None, partition: int,
                 report: Callable[[KafkaError | None, Any], None]) -> None:
        deadline = 0.0
        rescued = False
        while True:
            try:
                self._producer.produce(topic, value, key, partition, report)
                if rescued:
                    self._rescue.clear()
                return
            except BufferError:
                # The local queue is full: that is backpressure. Wait for the poll thread to
                # serve deliveries rather than serve them here, where the caller may hold a
                # lock a delivery callback wants (the poll thread itself serves them).
                now = time.monotonic()
                if not deadline:
                    deadline = now + self._config.delivery_timeout_ms / 1000
                elif now > deadline:
                    raise JournalUnavailable("kafka producer queue stayed full") from None
                if threading.current_thread() is self._thread:
                    self._producer.poll(0.05)
                else:
                    if self._waiting_thread_is_the_loop():
                        rescued = True
                        self._rescue.set()
                    self._polled.clear()
                    self._polled.wait(0.1)
            except KafkaException as exc:
                raise JournalUnavailable(f"kafka refused the record: {exc}") from exc

    def produce_sync(self, topic: str, key: bytes | None, value: bytes | None,
                     *, partition: int | None = None) -> Position:
        """Produce and wait for the delivery report."""
        done = threading.Event()
        result: list[Any] = []

        def on_delivery(err: Exception | None, pos: Position | None) -> None:
            result.append(err or pos)
            done.set()

        self.produce(topic, key, value, on_delivery, partition=partition)
        rescue = self._waiting_thread_is_the_loop()
        if rescue:
            self._rescue.set()
        try:
            if not done.wait(self._config.delivery_timeout_ms / 1000 + 5):
                raise JournalUnavailable("no delivery report from kafka in time")
        finally:
            if rescue:
                self._rescue.clear()
        outcome = result[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome  # type: ignore[no-any-return]

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for every queued record; returns how many are still undelivered."""
        return int(self._producer.flush(timeout_s))

    def close(self, timeout_s: float = 30.0) -> None:
        remaining = self.flush(timeout_s)
        if remaining:
            log.warning("closing with undelivered records", count=remaining)
        self._closed.set()
        self._rescue.set()
        self._thread.join()
        self._stop_serving()
        # Without this the librdkafka handle lives on until it is collected, reconnecting (and
        # logging each refusal) if Kafka goes first, as `apexps up` stops it on Ctrl-C.
        close = getattr(self._producer, "close", None)  # older confluent-kafka: none, freed by GC
        if close is not None:
            close()

    def _stop_serving(self) -> None:
        pipe, loop = self._pipe, self._loop
        if pipe is None or loop is None:
            return
        self._pipe = self._loop = None
        if self._tick is not None:
            self._tick.cancel()

        pipe.detach()  # now, from any thread: the producer's close must find no queue held

        def stop() -> None:
            loop.remove_reader(pipe.fd)
            pipe.close()

        if threading.get_ident() == self._loop_thread:
            stop()
            return
        try:
            loop.call_soon_threadsafe(stop)
        except RuntimeError:  # the loop is closed: nothing watches the pipe any more
            pipe.close()


#: Records the warm-up produces and fetches back (`warm`).
WARM_RECORDS = 400
#: Produces it keeps in flight: enough requests for the JIT to compile Kafka's produce and fetch
#: paths, in about a second.
WARM_IN_FLIGHT = 4
WARM_TOPIC = "_apexps.warmup"


def warm(bootstrap: str, records: int = WARM_RECORDS) -> None:
    """Do to a fresh Kafka what the broker's first minute would, before calling it ready.

    Measured on fresh JVMs (ops/bench/bench_kafka_gc.py, with --cold and without; a loaded
    machine, so only the large differences count): the first idempotent producer after a start
    is refused its producer id ("Coordinator load in progress") and retries; a consumer's first
    group coordinator lookup creates `__consumer_offsets` (its first record came after 1.3-4.2 s
    cold, 0.26-0.41 s warmed); the JVM's produce path is still interpreted (the 2nd-10th produce
    of a probe: up to 24-33 ms on G1 cold, 7-14 warmed, against a steady 0.8-1.8 ms); and the
    heap is at -Xms, grown by the first load's collections. So: a producer with the broker's
    settings (idempotent, acks=all) appends `records` to a topic of its own a few at a time, and
    a consumer with a group, assigned to it (as the broker's readers are), fetches them back.

    Not warmed here, because it is per client, not per JVM: every new idempotent producer
    waits 0.5-1 s for its producer id before its first record is acknowledged, also on a
    long-running Kafka (librdkafka retries the request on a timer when no connection is up yet
    at creation). The broker's own start writes to Kafka before it listens, which covers it:
    its first publication measured 12-55 ms, the fifth 1-2 ms.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.create_topics([NewTopic(WARM_TOPIC, 1, 1, config={"retention.ms": "60000"})]
                            )[WARM_TOPIC].result(30)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise
    producer = _RdProducer(producer_conf(KafkaConfig(bootstrap=bootstrap, namespace="warm")))
    done = [0]

    def delivered(err: object, msg: object) -> None:
        done[0] += 1

    began = time.monotonic()
    for i in range(records):
        while i - done[0] >= WARM_IN_FLIGHT:
            producer.poll(1.0)
        producer.produce(WARM_TOPIC, b"w" * 512, on_delivery=delivered)
    producer.flush(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "apexps-warm",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(WARM_TOPIC, 0, 0)])
    fetched = 0
    while fetched < records and time.monotonic() - began < 60:
        fetched += len(consumer.consume(records, timeout=1.0))
    consumer.close()
    log.info("kafka warmed", records=records, fetched=fetched,
             seconds=round(time.monotonic() - began, 2))



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


class KafkaCheckpoints:
    """A log's checkpoint book on Kafka (the port of broker.checkpoints.CheckpointBook): its
    records go to partition 0 of the compacted `book_topic` through the broker's producer; its
    tails are read from `log_topic`."""

    def __init__(self, config: KafkaConfig, producer: KafkaProducer, book_topic: str,
                 log_topic: str) -> None:
        self.config = config
        self.producer = producer
        self.book_topic = book_topic
        self.log_topic = log_topic

    def write(self, key: bytes, value: bytes | None,
              done: Callable[[Exception | None], None]) -> None:
        self.producer.produce(self.book_topic, key, value,
                              lambda err, _pos: done(err), partition=0)

    def later(self, step: Callable[[], None]) -> bool:
        return self.producer.soon(step)

    def read_checkpoints(self) -> Iterator[tuple[bytes, bytes | None]]:
        for rec in read_partition(self.config, self.book_topic, 0):
            if rec.key is not None:
                yield rec.key, rec.value

    def partitions(self) -> int:
        return partition_count(self.config, self.log_topic)

    def read_tail(self, partition: int, start: int | None,
                  end: int | None = None) -> Iterator[StoredRecord]:
        return read_partition(self.config, self.log_topic, partition, start, end)
