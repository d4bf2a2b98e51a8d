"""Which collector for the local Kafka, and what a fresh Kafka is slow at: the measurements.

Run: `.venv/bin/python -m ops.bench.bench_kafka_gc [--collectors G1,ZGC,Shenandoah]
[--jits C1,tiered] [--runs 3] [--rounds 1]` (needs the bench extra, as bench_peers does).

For each collector and each JIT mode (adapters.local.kafka.JITS), in `--rounds` alternating
rounds, it starts a throwaway local Kafka (`LocalKafka(gc=..., jit=...)`), then:
* times the first `--probe` produces on the fresh JVM, one at a time, each from `produce` to
  its delivery report with the broker's producer settings (idempotent, acks=all), then one
  consumer's first fetch of them: where a cold start's milliseconds go (the idempotent
  producer's InitProducerId and the topic's metadata come with the first produce, the JIT's
  work with the first hundreds);
* runs bench_peers' W2 on apexps plain `--runs` times (the first run is the first load the JVM
  has seen beside the probe), with its slowest half-seconds (`--timeline`);
* reads the JVM's stop-the-world time from its gc.log: every safepoint, whichever the
  collector (ZGC's and Shenandoah's pauses are safepoints too, and G1's young pauses).
It prints one block per Kafka; nothing is asserted (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from adapters.local.kafka import COLLECTORS, JITS, LocalKafka
from ops.bench.bench_peers import SLOW_LABEL
from ops.bench.bench_pubsub import ROOT

#: `Safepoint "G1CollectForAllocation", Time since last: …, Total: 123456 ns`
_SAFEPOINT = re.compile(r'Safepoint "([^"]+)".*Total: (\d+) ns')
_RUN = re.compile(r"run (\d+) W2 plain: .*p50_ms ([\d.,]+), p99_ms ([\d.,]+).*"
                  r"cpu_broker_us ([\d.,]+).*cpu_kafka_us ([\d.,]+)")
#: safepoint operations a collector asks for (the rest: the VM's own, e.g. "Cleanup",
#: "ICBufferFull", whose time is mostly threads being slow to stop on a busy machine)
_GC_OPS = re.compile(r"G1|Z[A-Z]|Shenandoah|GC|Collect")


def safepoints(lines: Iterable[str]) -> list[tuple[str, float]]:
    """(operation, ms) of each safepoint a JDK 17 `-Xlog:safepoint` log records."""
    found = []
    for line in lines:
        m = _SAFEPOINT.search(line)
        if m:
            found.append((m.group(1), int(m.group(2)) / 1e6))
    return found


def pause_summary(pauses: Sequence[float]) -> str:
    if not pauses:
        return "no safepoints"
    ordered = sorted(pauses)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"{len(pauses)} safepoints, total {sum(pauses):.1f} ms, mean"
            f" {statistics.mean(pauses):.2f} ms, p99 {p99:.2f} ms, max {ordered[-1]:.2f} ms")


def _probe(bootstrap: str, count: int) -> list[str]:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    from broker.kafka_io import KafkaConfig
    from broker.kafka_producer import producer_conf

    topic = f"probe-{uuid.uuid4().hex[:8]}"
    began = time.perf_counter()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    created = time.perf_counter() - began
    producer = Producer(producer_conf(KafkaConfig(bootstrap=bootstrap, namespace="probe")))
    times = []
    done: list[float] = []

    def delivered(err: object, msg: object) -> None:
        done.append(time.perf_counter())

    for i in range(count):
        done.clear()
        t0 = time.perf_counter()
        producer.produce(topic, b"x" * 512, key=str(i).encode(), on_delivery=delivered)
        while not done:
            producer.poll(1.0)
        times.append((done[0] - t0) * 1e3)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10})
    t0 = time.perf_counter()
    consumer.subscribe([topic])
    first = consumer.poll(30.0)
    fetched = (time.perf_counter() - t0) * 1e3
    consumer.close()
    tail = times[count // 2:]
    return [f"  create topic {created * 1e3:.0f} ms; produce->delivery: first {times[0]:.1f} ms,"
            f" 2nd-10th max {max(times[1:10], default=0):.1f} ms, first {count // 2} mean"
            f" {statistics.mean(times[:count // 2]):.2f} ms, last {len(tail)} median"
            f" {statistics.median(tail):.2f} ms",
            f"  a new consumer's first record (group join, metadata, fetch): {fetched:.0f} ms"
            f"{'' if first is not None else ' (none came)'}"]


def _w2(bootstrap: str, runs: int, seconds: float) -> tuple[list[tuple[float, ...]], list[str]]:
    out = subprocess.run(
        [sys.executable, "-m", "ops.bench.bench_peers", "--bootstrap", bootstrap, "--systems",
         "plain", "--workloads", "W2", "--runs", str(runs), "--seconds", str(seconds),
         "--timeline"],
        capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode:
        print(f"  bench_peers failed: {out.stderr[-1500:]}", flush=True)
    slow = [line.strip() for line in out.stdout.splitlines() if SLOW_LABEL in line]
    return [tuple(float(m.group(k).replace(",", "")) for k in (2, 3, 4, 5))
            for m in _RUN.finditer(out.stdout)], slow


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--collectors", default=",".join(COLLECTORS))
    ap.add_argument("--jits", default=",".join(JITS), help="the JIT modes to compare")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the whole comparison, alternating (default: 1)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--probe", type=int, default=200, help="produces timed after the start")
    ap.add_argument("--cold", action="store_true",
                    help="skip LocalKafka's warm-up (kafka_producer.warm): see what it saves")
    args = ap.parse_args(argv)
    collectors, jits = args.collectors.split(","), args.jits.split(",")
    for name, chosen, allowed in (("collectors", collectors, COLLECTORS), ("jits", jits, JITS)):
        if not chosen or set(chosen) - set(allowed):
            ap.error(f"--{name}: among {','.join(allowed)}")
    if args.runs < 1 or args.rounds < 1:
        ap.error("--runs and --rounds must be at least 1")
    for _, gc, jit in itertools.product(range(args.rounds), collectors, jits):
        with tempfile.TemporaryDirectory(prefix=f"apexps-gc-{gc}-") as data:
            kafka = LocalKafka(Path(data), gc=gc, jit=jit)
            t0 = time.perf_counter()
            state = kafka.start(warm_up=not args.cold)
            try:
                cold = " (cold: no warm-up)" if args.cold else ""
                print(f"{gc}, JIT {jit}{cold}: ready in {time.perf_counter() - t0:.1f} s",
                      flush=True)
                before = len(safepoints((Path(data) / "logs" / "gc.log").open()))
                for line in _probe(state.bootstrap, args.probe):
                    print(line, flush=True)
                runs, slow = _w2(state.bootstrap, args.runs, args.seconds)
                print("  W2 plain by run, p50/p99 ms (broker/Kafka CPU µs per message): "
                      + ", ".join(f"{p50:.2f}/{p99:.1f} ({broker:.0f}/{jvm:.0f})"
                                  for p50, p99, broker, jvm in runs), flush=True)
                for line in slow:
                    print(f"    {line}", flush=True)
                pauses = safepoints((Path(data) / "logs" / "gc.log").open())[before:]
                gc_ms = [ms for op, ms in pauses if _GC_OPS.search(op)]
                print(f"  after the start, the collector's: {pause_summary(gc_ms)}")
                print("  the VM's other safepoints: "
                      + pause_summary([ms for op, ms in pauses if not _GC_OPS.search(op)]))
                worst = sorted(pauses, key=lambda p: -p[1])[:3]
                print("  longest: " + ", ".join(f"{op} {ms:.1f} ms" for op, ms in worst),
                      flush=True)
            finally:
                kafka.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
