"""Journal append throughput and latency next to raw confluent-kafka, same Kafka, same run.

    .venv/bin/python -m ops.bench.bench_journal [--bootstrap HOST:PORT] [--records N]
        [--rounds R] [--batch B]

Without --bootstrap it starts a throwaway local Kafka. Four runs alternate, each on a topic of
its own with 3 partitions:

- raw produce: confluent-kafka's `Producer.produce` per record, a callback per record;
- journal append: `Journal.append` per record, a callback per record;
- raw produce_batch: B records at a time through `Producer.produce_batch` (one call per
  partition), one shared delivery callback that counts the batch down;
- journal append_many: `Journal.append_many` with B publications at a time (what the pubsub
  service hands over from one event-loop tick), one callback per batch.

On equal terms: the raw producer gets apexps's own producer settings (`producer_conf`:
idempotent, acks=all, linger 2 ms, lz4), and produces the very bytes the journal writes for
these publications (a 512-byte content in a journal record, about 590 bytes), with the same
keys to the same partitions. Latency is enqueue -> delivery report, i.e. until the record is
durable. "CPU us/rec" is this process's CPU time (every thread, librdkafka's included) per
record: on a shared machine it moves less than the rates do. The target (docs/performance.md) is
journal throughput >= 0.5x raw.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from confluent_kafka import Producer

from broker.codec import default_codec
from broker.core import BrokerCore
from broker.journal_writer import DataRecordWriter
from broker.kafka_io import KafkaConfig, ensure_topics
from broker.kafka_producer import producer_conf
from broker.records import Publication, now_ms

PAYLOAD = 512
SOURCES = 3
PARTITIONS = 3

#: send(first, count, done): queue records first..first+count-1; call done(k) as k complete.
Sender = Callable[[int, int, Callable[[int], None]], None]


class Result(NamedTuple):
    rate: float
    latencies: list[float]
    cpu_us: float


def _pct(lat: list[float], q: float) -> float:
    return statistics.quantiles(lat, n=100)[int(q) - 1] * 1000 if len(lat) > 1 else 0.0


def _publications() -> list[Publication]:
    content = b"x" * PAYLOAD
    return [Publication(topic="bench.quote", source=f"src{k}@example.com", content=content)
            for k in range(SOURCES)]


def _run(n: int, batch: int, send: Sender) -> Result:
    lat: list[float] = []
    done = threading.Event()
    t0, c0 = time.perf_counter(), time.process_time()
    for first in range(0, n, batch):
        start = time.perf_counter()

        def cb(k: int, start: float = start) -> None:
            lat.extend([time.perf_counter() - start] * k)
            if len(lat) == n:
                done.set()

        send(first, min(batch, n - first), cb)
    if not done.wait(300):
        raise SystemExit("benchmark: deliveries did not complete in 300 s")
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Result(n / elapsed, lat, cpu / n * 1e6)


def _raw(bootstrap: str, n: int, batch: int) -> Result:
    config = KafkaConfig(bootstrap=bootstrap)
    topic = f"bench.raw.{uuid.uuid4().hex[:8]}"
    ensure_topics(config, {topic: (PARTITIONS, {})})
    p = Producer(producer_conf(config))
    stop = threading.Event()

    def poller() -> None:  # the same background-poll shape the journal uses
        while not stop.is_set():
            p.poll(0.05)

    th = threading.Thread(target=poller, daemon=True)
    th.start()
    # The bytes the journal writes for the same publications, keyed and partitioned alike.
    writer = DataRecordWriter(default_codec())
    records = []
    for pub in _publications():
        key = pub.source.encode()
        records.append((writer.encode(pub, 1000, now_ms()), key, zlib.crc32(key) % PARTITIONS))

    def send_one(first: int, count: int, cb: Callable[[int], None]) -> None:
        value, key, part = records[first % SOURCES]
        p.produce(topic, value, key, part, lambda e, m: cb(1))

    def send_batch(first: int, count: int, cb: Callable[[int], None]) -> None:
        # raw Kafka's best batched shape: produce_batch per partition, one shared callback
        left = [count]

        def one(err: object, msg: object) -> None:  # only the poll thread calls it
            left[0] -= 1
            if not left[0]:
                cb(count)

        by_part: dict[int, list[dict[str, object]]] = {}
        for i in range(first, first + count):
            value, key, part = records[i % SOURCES]
            by_part.setdefault(part, []).append({"value": value, "key": key})
        for part, msgs in by_part.items():
            if p.produce_batch(topic, msgs, partition=part, on_delivery=one) != len(msgs):
                raise SystemExit("benchmark: raw produce_batch refused records")

    # Out of the timed window, as for the journal: the idempotent producer's id, the topic's
    # metadata and the connection.
    value, key, part = records[0]
    p.produce(topic, value, key, part)
    p.flush(30)
    try:
        return _run(n, batch, send_batch if batch > 1 else send_one)
    finally:
        p.flush(30)
        stop.set()
        th.join()


def bench_raw(bootstrap: str, n: int, batch: int) -> Result:
    del batch  # the per-record baseline
    return _raw(bootstrap, n, 1)


def bench_raw_batch(bootstrap: str, n: int, batch: int) -> Result:
    return _raw(bootstrap, n, batch)


def _open_core(bootstrap: str) -> BrokerCore:
    core = BrokerCore(KafkaConfig(bootstrap=bootstrap, namespace=f"bench{uuid.uuid4().hex[:8]}",
                                  journal_partitions=PARTITIONS))
    core.open()
    # Out of the timed window, as for raw Kafka: producer id, metadata, connection.
    core.journal.append_sync(Publication(topic="bench.warmup", source="warmup@example.com",
                                         content=b"x" * PAYLOAD))
    return core


def bench_append(bootstrap: str, n: int, batch: int) -> Result:
    del batch
    core = _open_core(bootstrap)
    pubs = _publications()

    def send(first: int, count: int, cb: Callable[[int], None]) -> None:
        core.journal.append(pubs[first % SOURCES], lambda e, r: cb(1))

    try:
        return _run(n, 1, send)
    finally:
        core.close()


def bench_append_many(bootstrap: str, n: int, batch: int) -> Result:
    core = _open_core(bootstrap)
    pubs = _publications()
    cycle = [pubs[i % SOURCES] for i in range(batch + SOURCES)]

    def send(first: int, count: int, cb: Callable[[int], None]) -> None:
        offset = first % SOURCES
        core.journal.append_many(cycle[offset:offset + count], lambda results: cb(len(results)))

    try:
        return _run(n, batch, send)
    finally:
        core.close()


RAW, RAW_BATCH = "raw produce", "raw produce_batch"
APPEND, APPEND_MANY = "journal append", "journal append_many"
RUNS: dict[str, Callable[[str, int, int], Result]] = {
    RAW: bench_raw,
    APPEND: bench_append,
    RAW_BATCH: bench_raw_batch,
    APPEND_MANY: bench_append_many,
}
#: (journal run, raw run it is measured against)
RATIOS = [(APPEND, RAW), (APPEND_MANY, RAW), (APPEND_MANY, RAW_BATCH)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="an existing Kafka (default: start a throwaway one)")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; best kept")
    ap.add_argument("--batch", type=int, default=100,
                    help="publications per append_many call (default: %(default)s)")
    args = ap.parse_args(argv)
    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from adapters.local.kafka import LocalKafka

        kafka = LocalKafka(Path(tempfile.mkdtemp(prefix="apexps-bench-")))
        bootstrap = kafka.start().bootstrap
    runs = dict(RUNS)
    if not hasattr(Producer, "produce_batch"):  # confluent-kafka < 2.12
        print("raw produce_batch needs confluent-kafka >= 2.12; skipping it", file=sys.stderr)
        del runs[RAW_BATCH]
    try:
        results: dict[str, Result] = {}
        for r in range(args.rounds):
            for name, fn in runs.items():
                print(f"round {r + 1}/{args.rounds}: {name} x {args.records} ...",
                      file=sys.stderr, flush=True)
                got = fn(bootstrap, args.records, args.batch)
                if name not in results or got.rate > results[name].rate:
                    results[name] = got
        print(f"\n{args.records} records ({PAYLOAD} B content), acks=all, idempotent, "
              f"append_many batches of {args.batch}, best of {args.rounds}\n")
        print(f"{'':22}{'records/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'CPU us/rec':>12}")
        for name, res in results.items():
            print(f"{name:22}{res.rate:>12,.0f}{_pct(res.latencies, 50):>10.2f}"
                  f"{_pct(res.latencies, 99):>10.2f}{res.cpu_us:>12.1f}")
        print()
        for mine, theirs in RATIOS:
            if theirs not in results:
                continue
            ratio = results[mine].rate / results[theirs].rate
            print(f"{mine} / {theirs}: {ratio:.2f}x   (target >= 0.50x)")
    finally:
        if kafka is not None:
            kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
