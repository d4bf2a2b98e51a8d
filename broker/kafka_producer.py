"""apexps's Kafka producer: idempotent, `acks=all`, its delivery reports on a poll thread or an
event loop; the checkpoint book's Kafka port built on it; and the warm-up of a fresh Kafka.

With broker/kafka_io.py (configuration, positions, admin calls, reads) the only modules that talk
to confluent-kafka (the lint rules hold every other module to that).

Producer: idempotent, `acks=all`, so a delivery report without error means the record is in
every in-sync replica and will not be duplicated by librdkafka's own retries. A background thread
calls `poll()` so delivery callbacks run promptly whatever the caller does (confluent-kafka's
`examples/producer.py` calls `poll(0)` after each produce for the same reason), until an event
loop takes the reports over (`serve_reports_on`, broker/report_pipe.py: one wake-up per report
instead of two). `BufferError` (local queue full) is backpressure: wait for deliveries and
retry, up to a deadline. `soon` splits a checkpoint round into the loop's turns
(broker/checkpoints.py).

`warm` does to a fresh Kafka what the broker's first minute would (its first producer id, its
first consumer group), so the local Kafka is warm before it says it is ready.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any, Protocol

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Producer as _RdProducer
from confluent_kafka import version as confluent_version
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from broker.kafka_io import (
    KafkaConfig,
    Position,
    StoredRecord,
    partition_count,
    read_partition,
)
from broker.report_pipe import ReportPipe
from common.errors import JournalUnavailable

__all__ = [
    "DEFAULT_LINGER_MS",
    "Delivery",
    "DeliveryCallback",
    "KafkaCheckpoints",
    "KafkaProducer",
    "ReportLoop",
    "producer_conf",
    "warm",
]

log = structlog.get_logger(__name__)

#: No lingering: librdkafka still batches whatever queues up while requests are in flight, and
#: measured here a 2 ms linger put ~6 ms on every quiet-time append (p50 0.5 ms -> 5.9 ms,
#: produce+delivery report, one local broker), which is the publish->deliver latency.
DEFAULT_LINGER_MS = 0
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
        #: set while the poll thread is parked: it serves no report until rescued or stalled
        self._parked = threading.Event()
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
        # The poll thread may be inside a poll (up to its 50 ms), serving whatever report comes
        # meanwhile on its own thread: "from now on" starts once it has parked. Once, at start.
        self._parked.wait(REPORT_STALL_S)
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
                self._parked.set()
                self._rescue.wait(REPORT_STALL_S / 2)
                continue
            # No loop serves (none took over, or it is blocked: a wait for Kafka on its
            # thread that no `produce_sync` announced): serve here, as before it took over.
            self._parked.clear()
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


#: Records the warm-up produces and fetches back (`warm`), about two seconds' worth. 400 left
#: the JIT's first compiles of the produce path to the first paced load: on a fresh Kafka with
#: only C1 (`-XX:TieredStopAtLevel=1`), W2's first run read p99 21 and 28 ms after 400, 10.6
#: and 5.3 ms after 3,000 (bench_peers --systems plain --workloads W2, 2026-11-27).
WARM_RECORDS = 3000
#: Produces it keeps in flight: one request at a time or a few, as a paced broker sends them,
#: not the large batches of a flat-out load, which take other paths through Kafka.
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
