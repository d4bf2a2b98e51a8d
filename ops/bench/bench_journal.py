"""Journal append throughput and latency next to raw confluent-kafka, same Kafka, same run.

    .venv/bin/python -m ops.bench.bench_journal [--bootstrap HOST:PORT] [--records N]

Without --bootstrap it starts a throwaway local Kafka. Both sides produce 512-byte values with
the same producer settings (idempotent, acks=all, linger 2 ms, lz4); latency is enqueue ->
delivery report, i.e. until the record is durable. The target (issue 2) is journal throughput
>= 0.5x raw.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from broker.core import BrokerCore
from broker.kafka_io import DEFAULT_LINGER_MS, KafkaConfig, ensure_topics
from broker.records import Publication

PAYLOAD = 512


def _pct(lat: list[float], q: float) -> float:
    return statistics.quantiles(lat, n=100)[int(q) - 1] * 1000 if len(lat) > 1 else 0.0


def _run(n: int, send: Callable[[int, Callable[[], None]], None]) -> tuple[float, list[float]]:
    lat: list[float] = []
    done = threading.Event()
    t0 = time.perf_counter()
    for i in range(n):
        start = time.perf_counter()

        def cb(start: float = start) -> None:
            lat.append(time.perf_counter() - start)
            if len(lat) == n:
                done.set()

        send(i, cb)
    if not done.wait(300):
        raise SystemExit("benchmark: deliveries did not complete in 300 s")
    return n / (time.perf_counter() - t0), lat


def bench_raw(bootstrap: str, n: int) -> tuple[float, list[float]]:
    topic = f"bench.raw.{uuid.uuid4().hex[:8]}"
    ensure_topics(KafkaConfig(bootstrap=bootstrap), {topic: (3, {})})
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": DEFAULT_LINGER_MS, "compression.type": "lz4",
                  "queue.buffering.max.messages": 500_000})
    stop = threading.Event()

    def poller() -> None:  # the same background-poll shape the journal uses
        while not stop.is_set():
            p.poll(0.05)

    th = threading.Thread(target=poller, daemon=True)
    th.start()
    value = b"x" * PAYLOAD

    def send(i: int, cb: Callable[[], None]) -> None:
        p.produce(topic, value, f"src{i % 3}".encode(), on_delivery=lambda e, m: cb())

    try:
        return _run(n, send)
    finally:
        p.flush(30)
        stop.set()
        th.join()


def bench_journal(bootstrap: str, n: int) -> tuple[float, list[float]]:
    core = BrokerCore(KafkaConfig(bootstrap=bootstrap, namespace=f"bench{uuid.uuid4().hex[:8]}"))
    core.open()
    content = b"x" * PAYLOAD
    pubs = [Publication(topic="bench.quote", source=f"src{k}@example.com", content=content)
            for k in range(3)]

    def send(i: int, cb: Callable[[], None]) -> None:
        core.journal.append(pubs[i % 3], lambda e, r: cb())

    try:
        return _run(n, send)
    finally:
        core.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="an existing Kafka (default: start a throwaway one)")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; best kept")
    args = ap.parse_args(argv)
    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from ops.kafka_local import LocalKafka

        kafka = LocalKafka(Path(tempfile.mkdtemp(prefix="apexps-bench-")))
        bootstrap = kafka.start().bootstrap
    try:
        results: dict[str, tuple[float, list[float]]] = {}
        for r in range(args.rounds):
            for name, fn in (("raw confluent-kafka", bench_raw), ("apexps journal", bench_journal)):
                print(f"round {r + 1}/{args.rounds}: {name} x {args.records} ...",
                      file=sys.stderr, flush=True)
                got = fn(bootstrap, args.records)
                if name not in results or got[0] > results[name][0]:
                    results[name] = got
        print(f"\n{args.records} records of {PAYLOAD} B, acks=all, idempotent, best of "
              f"{args.rounds}\n")
        print(f"{'':22}{'records/s':>12}{'p50 ms':>10}{'p99 ms':>10}")
        for name, (rate, lat) in results.items():
            print(f"{name:22}{rate:>12,.0f}{_pct(lat, 50):>10.2f}{_pct(lat, 99):>10.2f}")
        ratio = results["apexps journal"][0] / results["raw confluent-kafka"][0]
        print(f"\njournal / raw throughput: {ratio:.2f}x   (target >= 0.50x)")
    finally:
        if kafka is not None:
            kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
