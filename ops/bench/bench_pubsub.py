"""Publish→deliver through the apex=pubsub service, next to raw confluent-kafka, same Kafka.

Run: `.venv/bin/python -m ops.bench.bench_pubsub [--bootstrap HOST:PORT] [--seconds 10]`
(without --bootstrap a throwaway local Kafka is started).

Set-up: the broker (`adapters.app.BrokerApp`: journal, follower, APEX server) runs in its own
process; the subscribers (10, then 100 `PubsubClient`s) in another, the publisher in a third, so
no two share a GIL. Messages are 512 octets whose first bytes carry the send time; a subscriber's
latency is its receive time minus that (one machine, one clock).

Two phases per subscriber count:
* paced: the publisher sends 1,000 msgs/s (each awaited: `ok` means durable) for `--seconds`;
  p50/p99 publish→deliver latency is the figure the target names (p99 < 20 ms, 10 subscribers);
* flat out: the publisher keeps `--window` publications in flight; the rate at which messages
  reach subscribers (messages/s, and deliveries/s = messages x subscribers).

Raw: a confluent-kafka producer (idempotent, acks=all, same linger) and one consumer on a
topic of the same Kafka, paced at 1,000 msgs/s and flat out; its end-to-end message rate is the
ratio's denominator (target: pubsub ≥ 0.25x raw). Beside each subscriber count, raw again with
as many consumers as subscribers, each reading every record: Kafka alone doing the same fan-out,
which is the fairer yardstick for both the latency and the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from ops.bench import _profile as profiled

SIZE = 512
#: Publications one paced publisher keeps unanswered at most (BeepConfig's default limit of
#: pending MSGs per channel is 64; a publisher that exceeds it is cut off by the broker).
MAX_IN_FLIGHT = 32
TOPIC = "bench.quotes"
DOMAIN = "bench.example"
ROOT = Path(__file__).resolve().parents[2]


def _stamp(seq: int) -> bytes:
    head = struct.pack(">dQ", time.time(), seq)
    return head + b"x" * (SIZE - len(head))


def _age_ms(body: bytes) -> float:
    sent: float = struct.unpack(">d", body[:8])[0]
    return (time.time() - sent) * 1e3


def _pcts(lat: list[float]) -> tuple[float, float]:
    if len(lat) < 2:
        return float("nan"), float("nan")
    cuts = statistics.quantiles(lat, n=100)
    return cuts[49], cuts[98]


# --- processes ----------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> None:
    from adapters.app import BrokerApp
    from adapters.cli import heap, logs
    from broker.kafka_io import KafkaConfig

    logs.configure("warning", json=True)

    async def run() -> None:
        config = KafkaConfig(bootstrap=args.bootstrap, namespace=args.namespace)
        async with BrokerApp(config, domain=DOMAIN, sequenced=not args.plain) as app:
            heap.settle()  # as `apexps up` does
            print(app.port, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    profiled.run(run(), profile=args.profile)


def _subscribers(args: argparse.Namespace) -> None:
    from adapters.client.pubsub_client import Delivered, PubsubClient

    async def one(i: int, ready: asyncio.Queue[int], out: list[list[float]]) -> None:
        client = await PubsubClient.connect("127.0.0.1", args.port, f"s{i}@{DOMAIN}")
        await client.subscribe(TOPIC, 3600, batch=args.batch or None)
        ready.put_nowait(i)
        lat: list[float] = []
        out.append(lat)
        async for event in client.events():
            if isinstance(event, Delivered):
                if event.content[:1] == b"!":
                    break
                lat.append(_age_ms(event.content))
        await client.close()

    began = 0.0

    async def run() -> list[list[float]]:
        nonlocal began
        ready: asyncio.Queue[int] = asyncio.Queue()
        out: list[list[float]] = []
        tasks = [asyncio.create_task(one(i, ready, out)) for i in range(args.subscribers)]
        for _ in tasks:
            await ready.get()
        print("ready", flush=True)
        began = time.process_time()
        await asyncio.gather(*tasks)
        return out

    per_sub = profiled.run(run(), profile=args.profile)
    json.dump({"latencies": per_sub, "cpu": time.process_time() - began}, sys.stdout)


def _publisher(args: argparse.Namespace) -> None:
    from adapters.client.pubsub_client import PubsubClient

    async def run() -> dict[str, float]:
        client = await PubsubClient.connect("127.0.0.1", args.port, f"pub@{DOMAIN}")
        cpu_began = time.process_time()
        sent, began = 0, time.perf_counter()
        stop = began + args.seconds
        if args.rate:
            # Paced: a publication leaves every 1/rate s whether or not earlier ones were
            # answered yet (APEX lets a channel carry several MSGs; replies come in order).
            gap = 1.0 / args.rate
            inflight: set[asyncio.Task[None]] = set()
            window = asyncio.Semaphore(MAX_IN_FLIGHT)
            late = 0

            async def one(body: bytes) -> None:
                try:
                    await client.publish(TOPIC, body)
                finally:
                    window.release()

            while time.perf_counter() < stop:
                if window.locked():
                    late += 1  # the broker is behind: this one waits, the pace slips
                await window.acquire()
                task = asyncio.create_task(one(_stamp(sent)))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                sent += 1
                ahead = began + sent * gap - time.perf_counter()
                if ahead > 0:
                    await asyncio.sleep(ahead)  # pacing the load, not waiting for an event
            await asyncio.gather(*inflight)
            if late:
                print(f"paced publisher waited for the broker {late} times", file=sys.stderr)
        else:
            async def worker() -> None:
                nonlocal sent
                while time.perf_counter() < stop:
                    await client.publish(TOPIC, _stamp(sent))
                    sent += 1
            await asyncio.gather(*(worker() for _ in range(args.window)))
        elapsed = time.perf_counter() - began
        cpu = time.process_time() - cpu_began
        await client.publish(TOPIC, b"!" + b"x" * (SIZE - 1))  # end marker
        await client.close()
        return {"sent": sent, "elapsed": elapsed, "cpu": cpu, "cpu_all": time.process_time()}

    json.dump(profiled.run(run()), sys.stdout)


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc), or of the whole machine
    (all CPUs, from /proc/stat, host steal excluded: see `_steal_seconds`) for None; 0 where
    /proc is missing."""
    try:
        if pid is None:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
            busy = sum(int(f) for f in fields[:7]) - int(fields[3]) - int(fields[4])
            return busy / os.sysconf("SC_CLK_TCK")
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _steal_seconds() -> float:
    """CPU seconds the hypervisor gave the machine's virtual CPUs to others (/proc/stat's
    `steal`; 0 on bare metal or where /proc is missing). On a shared VM this decides the
    figures: while the host steals, every process here is slower, the bare floor included."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        return int(fields[7]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _figure(us: float, pid: int | None) -> str:
    return f"{us:,.0f} µs" if pid else "? µs (its process was not found)"


def _listener_pid(bootstrap: str) -> int | None:
    """The process listening on the first `HOST:PORT` of `bootstrap` (Linux /proc: the socket's
    inode in /proc/net/tcp, then whose fd it is), so Kafka's own CPU can be told apart from
    whatever else runs; None where that cannot be found."""
    try:
        port = int(bootstrap.split(",", maxsplit=1)[0].rpartition(":")[2])
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                    return int(proc.name)
            except OSError:
                continue
    except (OSError, ValueError, IndexError):
        pass
    return None


def _case(port: int, subscribers: int, seconds: float, rate: int, window: int,
          batch: int, broker_pid: int | None = None,
          kafka_pid: int | None = None) -> dict[str, float]:
    """One phase; with `broker_pid`, also the CPU each part spent per message sent: the broker,
    the publisher, the subscribers' process, Kafka's JVM (with `kafka_pid`), the rest of the
    machine (whatever else runs) and what the host stole from the VM. Every figure counts
    from the moment all subscribers are subscribed: their start-up (imports, connecting,
    subscribing: half a second of CPU or more in the subscribers' process, and in the broker
    and Kafka, which record ten subscriptions and their links' resets) would otherwise be much
    of what a paced phase shows per message. The publisher's figure includes its own start-up
    only where it says so (`rest` counts it)."""
    here = [sys.executable, "-m", "ops.bench.bench_pubsub", "--port", str(port), "--batch",
            str(batch)]
    profile = ["--profile"] if os.environ.get("PROFILE_SUBSCRIBERS") else []
    subs = subprocess.Popen([*here, "--as-subscribers", "--subscribers", str(subscribers),
                             *profile],
                            stdout=subprocess.PIPE, cwd=ROOT, text=True)
    assert subs.stdout is not None
    if subs.stdout.readline().strip() != "ready":
        raise SystemExit("subscriber process failed to start")
    machine_before, broker_before = _cpu_seconds(None), _cpu_seconds(broker_pid)
    kafka_before = _cpu_seconds(kafka_pid) if kafka_pid else 0.0
    steal_before = _steal_seconds()
    pub = subprocess.run([*here, "--as-publisher", "--seconds", str(seconds), "--rate", str(rate),
                          "--window", str(window)], capture_output=True, text=True, cwd=ROOT,
                         timeout=seconds + 300, check=False)
    if pub.returncode:
        raise SystemExit(f"publisher failed: {pub.stderr[-2000:]}")
    sent = json.loads(pub.stdout)
    if "waited" in pub.stderr:  # the pace slipped: say so beside the figures
        print(f"  ({pub.stderr.strip().splitlines()[-1]})", flush=True)
    out, _ = subs.communicate(timeout=seconds + 300)
    report = json.loads(out.splitlines()[-1])
    per_sub: list[list[float]] = report["latencies"]
    lat = [x for sub in per_sub for x in sub]
    p50, p99 = _pcts(lat)
    delivered = min(len(s) for s in per_sub)
    n = max(1, sent["sent"])
    broker = _cpu_seconds(broker_pid) - broker_before if broker_pid else 0.0
    kafka = _cpu_seconds(kafka_pid) - kafka_before if kafka_pid else 0.0
    rest = (_cpu_seconds(None) - machine_before - broker - kafka - sent["cpu_all"]
            - report["cpu"])
    steal = _steal_seconds() - steal_before
    return {"sent": sent["sent"], "msgs_per_s": delivered / sent["elapsed"],
            "deliveries_per_s": len(lat) / sent["elapsed"], "p50": p50, "p99": p99,
            "complete": float(all(len(s) == sent["sent"] for s in per_sub)),
            "cpu_broker_us": broker / n * 1e6, "cpu_publisher_us": sent["cpu"] / n * 1e6,
            "cpu_subscribers_us": report["cpu"] / n * 1e6, "cpu_rest_us": rest / n * 1e6,
            "steal_us": steal / n * 1e6, "steal_share": steal / (os.cpu_count() or 1)
            / max(sent["elapsed"], 1e-9),
            "cpu_kafka_us": kafka / n * 1e6}


_WARM_UP = b"warm-up"


def _raw(bootstrap: str, seconds: float, rate: int, kafka_pid: int | None = None,
         consumers: int = 1) -> dict[str, float]:
    """Produce to a fresh topic and read it back with `consumers` consumers, each of which
    reads every record (as many as the subscribers, for the fan-out comparison)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from broker.kafka_io import KafkaConfig, ensure_topics
    from broker.kafka_producer import DEFAULT_LINGER_MS

    topic = f"rawbench{uuid.uuid4().hex[:8]}"
    ensure_topics(KafkaConfig(bootstrap=bootstrap), {topic: (1, {})})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": DEFAULT_LINGER_MS})
    lats: list[list[float]] = [[] for _ in range(consumers)]
    done = threading.Event()
    warm = [threading.Event() for _ in range(consumers)]

    def consume(i: int) -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-{i}",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 2})
        consumer.assign([TopicPartition(topic, 0, 0)])
        lat = lats[i]
        while not done.is_set():
            # poll for one, then take what is fetched: consume(n, t) alone may wait out t
            first = consumer.poll(0.1)
            if first is None:
                continue
            for m in [first, *consumer.consume(999, 0)]:
                if m.error() is None:
                    value = m.value() or b""
                    if value == _WARM_UP:
                        warm[i].set()
                        continue
                    lat.append(_age_ms(value))
        consumer.close()
    readers = [threading.Thread(target=consume, args=(i,)) for i in range(consumers)]
    for reader in readers:
        reader.start()
    # One message through first, so that neither the producer's idempotence handshake nor the
    # consumers' first fetch weighs on the measured ones, as on the pubsub side, where the
    # broker's Kafka clients run and the subscribers are subscribed before the publisher starts.
    producer.produce(topic, _WARM_UP)
    producer.flush(60)
    if not all(w.wait(60) for w in warm):
        done.set()
        raise SystemExit("raw: the warm-up message did not come back within 60 s")
    kafka_before = _cpu_seconds(kafka_pid) if kafka_pid else 0.0
    sent, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        try:
            producer.produce(topic, _stamp(sent))
        except BufferError:  # librdkafka's queue is full: let deliveries drain, then retry
            producer.poll(0.01)
            continue
        sent += 1
        producer.poll(0)
        if rate:
            ahead = began + sent / rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
    producer.flush(60)
    deadline = time.monotonic() + 60
    while min(len(lat) for lat in lats) < sent and time.monotonic() < deadline:
        time.sleep(0.01)
    elapsed = time.perf_counter() - began
    kafka = _cpu_seconds(kafka_pid) - kafka_before if kafka_pid else 0.0
    done.set()
    for reader in readers:
        reader.join()
    p50, p99 = _pcts([x for lat in lats for x in lat])
    delivered = sum(len(lat) for lat in lats)
    # consumers still behind at the deadline: the rate is what they read meanwhile, as on the
    # pubsub side, which says INCOMPLETE then too
    return {"sent": sent, "msgs_per_s": min(len(lat) for lat in lats) / elapsed,
            "deliveries_per_s": delivered / elapsed, "p50": p50, "p99": p99,
            "complete": float(all(len(lat) >= sent for lat in lats)),
            "cpu_kafka_us": kafka / max(1, sent) * 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--bootstrap", help="an existing Kafka (default: start a throwaway one)")
    ap.add_argument("--seconds", type=float, default=10.0, help="per phase (default: 10)")
    ap.add_argument("--window", type=int, default=64,
                    help="publications in flight in the flat-out phase (default: 64)")
    ap.add_argument("--subscriber-counts", default="10,100")
    ap.add_argument("--paced-rate", type=int, default=1000,
                    help="msgs/s of the paced phase (default: 1000, the target's rate)")
    ap.add_argument("--batch", type=int, default=1024,
                    help="subscribers take live data packed up to N per data (robust-binding"
                         " §5.4); 0: one data per message (default: 1024)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the broker process; its top functions go to stderr")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--as-subscribers", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--as-publisher", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--namespace", default="", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--subscribers", type=int, default=10, help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        _serve(args)
        return 0
    if args.as_subscribers:
        _subscribers(args)
        return 0
    if args.as_publisher:
        _publisher(args)
        return 0

    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from adapters.local.kafka import LocalKafka

        kafka = LocalKafka(Path(tempfile.mkdtemp(prefix="apexps-bench-")))
        bootstrap = kafka.start().bootstrap
    try:
        print(f"publish→deliver, {SIZE}-octet messages, {args.seconds:g} s per phase,"
              f" {os.cpu_count()} CPUs, Kafka {bootstrap}, sequenced links, live data"
              f" {f'packed up to {args.batch} per data' if args.batch else 'one per data'}")
        kafka_pid = _listener_pid(bootstrap)
        raw_paced = _raw(bootstrap, args.seconds, args.paced_rate, kafka_pid)
        raw_flat = _raw(bootstrap, args.seconds, 0, kafka_pid)
        print(f"raw confluent-kafka: paced {args.paced_rate:,}/s p50 {raw_paced['p50']:.2f} ms p99"
              f" {raw_paced['p99']:.2f} ms, Kafka {_figure(raw_paced['cpu_kafka_us'], kafka_pid)}"
              f" per message; flat out {raw_flat['msgs_per_s']:,.0f} msgs/s"
              f"{'' if raw_flat['complete'] else ' INCOMPLETE'}, Kafka"
              f" {_figure(raw_flat['cpu_kafka_us'], kafka_pid)} per message", flush=True)
        for count in (int(c) for c in args.subscriber_counts.split(",")):
            namespace = f"bench{uuid.uuid4().hex[:8]}"
            server = subprocess.Popen(
                [sys.executable, "-m", "ops.bench.bench_pubsub", "--serve", "--bootstrap",
                 bootstrap, "--namespace", namespace, *(["--profile"] if args.profile else [])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, cwd=ROOT, text=True)
            assert server.stdout is not None and server.stdin is not None
            port = int(server.stdout.readline())
            try:
                _create_topic(port)
                paced = _case(port, count, args.seconds, args.paced_rate, 1, args.batch,
                              server.pid, kafka_pid)
                flat = _case(port, count, args.seconds, 0, args.window, args.batch,
                             server.pid, kafka_pid)
            finally:
                server.stdin.close()
                server.wait(timeout=120)
            # The same job done by Kafka alone: as many consumers as subscribers, each reading
            # every record (one process, as the subscribers are), paced and flat out.
            fan_paced = _raw(bootstrap, args.seconds, args.paced_rate, consumers=count)
            fan_flat = _raw(bootstrap, args.seconds, 0, consumers=count)
            ratio = flat["msgs_per_s"] / raw_flat["msgs_per_s"]
            fan_ratio = flat["msgs_per_s"] / fan_flat["msgs_per_s"]
            print(f"{count:>3} subscribers: paced {args.paced_rate:,}/s p50 {paced['p50']:.2f} ms"
                  f" p99"
                  f" {paced['p99']:.2f} ms (target p99 < 20 ms at 10)"
                  f"{'' if paced['complete'] else ' INCOMPLETE'}; flat out"
                  f" {flat['msgs_per_s']:,.0f} msgs/s = {flat['deliveries_per_s']:,.0f}"
                  f" deliveries/s, p99 {flat['p99']:.1f} ms; ratio to raw {ratio:.2f}x"
                  f" (target ≥ 0.25x){'' if flat['complete'] else ' INCOMPLETE'}", flush=True)
            print(f"      raw confluent-kafka with {count} consumers (the same fan-out): paced"
                  f" {args.paced_rate:,}/s p50 {fan_paced['p50']:.2f} ms p99"
                  f" {fan_paced['p99']:.2f} ms; flat out {fan_flat['msgs_per_s']:,.0f} msgs/s ="
                  f" {fan_flat['deliveries_per_s']:,.0f} deliveries/s"
                  f"{'' if fan_flat['complete'] else ' INCOMPLETE'}; pubsub's rate is"
                  f" {fan_ratio:.2f}x of it", flush=True)
            for name, phase in (("paced", paced), ("flat out", flat)):
                print(f"      CPU per message, {name}: broker {phase['cpu_broker_us']:,.0f} µs,"
                      f" publisher {phase['cpu_publisher_us']:,.0f} µs, {count} subscribers"
                      f" {phase['cpu_subscribers_us']:,.0f} µs, Kafka"
                      f" {_figure(phase['cpu_kafka_us'], kafka_pid)}, rest of the machine"
                      f" {phase['cpu_rest_us']:,.0f} µs; host steal"
                      f" {phase['steal_us']:,.0f} µs ({phase['steal_share']:.0%} of the"
                      f" CPUs)", flush=True)
    finally:
        if kafka is not None:
            kafka.stop()
    return 0


def _create_topic(port: int) -> None:
    from adapters.client.pubsub_client import PubsubClient

    async def run() -> None:
        client = await PubsubClient.connect("127.0.0.1", port, f"admin@{DOMAIN}")
        await client.create_topic(TOPIC)
        await client.close()

    profiled.run(run())


if __name__ == "__main__":
    raise SystemExit(main())
