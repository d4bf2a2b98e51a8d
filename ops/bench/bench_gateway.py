"""What the web gateway costs: publish -> browser-side receipt through SSE, and the gateway's
CPU per delivered message.

Run: `.venv/bin/python -m ops.bench.bench_gateway --bootstrap HOST:PORT [--clients 50]
[--seconds 20] [--idle 0] [--resources]` (default bootstrap: $APEXPS_BOOTSTRAP; no Kafka is
started here).

A broker (`apexps broker`) and a gateway (`apexps gateway`) run as processes of their own on
that Kafka. This process plays the browsers: `--clients` SSE clients, each with one
subscription to a topic of its own made by POST /subscriptions, and one APEX publisher that
sends each topic one message per second (its send time in the content), spread evenly over the
second. A client's receipt time minus the send time is the latency (same clock: one machine).
`--idle` opens that many idle TCP connections to the gateway first and keeps them for the run.
The gateway's CPU (utime + stime from /proc) over the measured window, divided by the messages
the clients received, is its CPU per message (the broker's is printed beside it). Every client
checks its ids rise (link seqs: heartbeats leave holes), so nothing arrives twice or out of
order. The first `--warmup` seconds are not measured.

`--resources` measures resource watches instead (issue 22's Performance: the event draft's
SubscribeGateway): one topic, and client k watches the resource `TOPIC/item-k` for `modified`
(POST /subscriptions with resource, events, expires); the publisher first publishes an image of
every item (so each watch's current-state Notify has something, and is not measured), then
updates each item once per second. What a client times is its `notify` events: the send time is
the content of the Notify's newest version.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from adapters.cli import heap
from adapters.client.pubsub_client import PubsubClient
from broker.records import PublishType

from ._stage_report import report

ROOT = Path(__file__).resolve().parents[2]
PUBLISHING = 64
APEXPS = [sys.executable, "-m", "adapters.cli.main", "--log-level", "warning"]


async def _start(*args: str, stages: Path | None = None
                 ) -> tuple[asyncio.subprocess.Process, str]:
    cmd = APEXPS if stages is None else [
        sys.executable, "-m", "ops.bench._stages", str(stages), *APEXPS[3:]]
    proc = await asyncio.create_subprocess_exec(*cmd, *args, cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    return proc, (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().split()[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class _Client:
    topic: str
    #: the message-id this client watches (--resources), None for a topic subscription
    item: str | None = None
    latencies: list[float] = field(default_factory=list)
    last: int = 0
    broken: int = 0
    #: send time (the key) -> receipt time, ns (--stages)
    received: dict[str, int] = field(default_factory=dict)


async def _follow(http: aiohttp.ClientSession, url: str, client: _Client,
                  measuring: asyncio.Event, ready: asyncio.Event) -> None:
    body: dict[str, object] = {"topic": client.topic}
    if client.item is not None:
        body = {"resource": f"{client.topic}/{client.item}", "events": ["modified"],
                "expires": 3600}
    async with http.post(f"{url}/subscriptions", json=body) as r:
        sub = await r.json()
        assert r.status == 201, sub
    async with http.get(sub["events"], timeout=aiohttp.ClientTimeout(total=None)) as r:
        ready.set()
        async for raw in r.content:
            line = raw.decode()
            if line.startswith("id: "):
                seq = int(line[4:])
                if seq <= client.last:  # heartbeats leave holes; a repeat is a bug
                    client.broken += 1
                client.last = seq
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if "versions" in data:  # a Notify: the newest version is what was sent
                    if data["current"] or not data["versions"]:
                        continue  # the watch's current state, not a change
                    sent = int(data["versions"][-1]["content"])
                else:
                    sent = int(data["content"])
                if measuring.is_set():
                    now = time.time_ns()
                    client.latencies.append((now - sent) / 1e6)
                    client.received[str(sent)] = now


async def _publish(pub: PubsubClient, targets: list[tuple[str, str | None]],
                   stop: asyncio.Event, acked: list[int], oks: dict[str, int]) -> int:
    """Each (topic, message-id) once a second, spread over the second; up to PUBLISHING
    publications in flight, so the rate does not hang on one Kafka acknowledgement at a time.
    With a message-id, an update of that item that gives the publisher no implicit watch.
    `acked[0]` counts the publications the broker has acknowledged (held durably); `oks`
    gets each one's send time (its content) -> the time of its `ok`, ns."""
    loop = asyncio.get_running_loop()
    step, sent, start = 1.0 / len(targets), 0, loop.time()
    slots = asyncio.Semaphore(PUBLISHING)
    flying: set[asyncio.Task[None]] = set()

    async def one(topic: str, item: str | None) -> None:
        sent = str(time.time_ns())
        try:
            if item is None:
                await pub.publish(topic, sent.encode())
            else:
                await pub.publish(topic, sent.encode(), "text/plain",
                                  publish_type=PublishType.UPDATE, message_id=item,
                                  implicit=False)
            acked[0] += 1
            oks[sent] = time.time_ns()
        finally:
            slots.release()

    while not stop.is_set():
        for k, (topic, item) in enumerate(targets):
            due = start + sent // len(targets) + k * step
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            task = asyncio.create_task(one(topic, item))
            flying.add(task)
            task.add_done_callback(flying.discard)
            sent += 1
    await asyncio.gather(*flying)
    return sent


async def main(args: argparse.Namespace) -> None:
    ns = f"bench{uuid.uuid4().hex[:8]}"
    stages = None if args.stages is None else Path(args.stages)
    if stages is not None:
        stages.mkdir(parents=True, exist_ok=True)
        for old in stages.glob("*.stages"):
            old.unlink()
    broker, apex = await _start("broker", "--bootstrap", args.bootstrap, "--namespace", ns,
                                "--listen", "127.0.0.1:0",
                                stages=None if stages is None else stages / "broker.stages")
    port = int(apex.rpartition(":")[2])
    gateway, url = await _start("gateway", "--listen", "127.0.0.1:0", "--broker",
                                f"127.0.0.1:{port}",
                                stages=None if stages is None else stages / "gateway.stages")
    url = url.rstrip("/")
    idle = []
    try:
        for _ in range(args.idle):
            host, gw_port = url.removeprefix("http://").split(":")
            idle.append(await asyncio.open_connection(host, int(gw_port)))
        pub = await PubsubClient.connect("127.0.0.1", port, "bench@example.com")
        if args.resources:
            await pub.create_topic("bench.res")
            clients = [_Client("bench.res", f"item-{k}") for k in range(args.clients)]
            for c in clients:  # each item exists before it is watched
                await pub.publish(c.topic, b"0", "text/plain", publish_type=PublishType.IMAGE,
                                  message_id=c.item, implicit=False)
        else:
            clients = [_Client(f"bench.g{k}") for k in range(args.clients)]
            for c in clients:
                await pub.create_topic(c.topic)
        measuring, stop = asyncio.Event(), asyncio.Event()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            readies = [asyncio.Event() for _ in clients]
            followers = [asyncio.create_task(_follow(http, url, c, measuring, r))
                         for c, r in zip(clients, readies, strict=True)]
            try:
                await _all_ready(readies, followers)
            except BaseException:
                for task in followers:
                    task.cancel()
                await asyncio.gather(*followers, return_exceptions=True)
                raise
            # what stands for 1,000 browsers must not stall them all at once: its heap is
            # frozen as the servers' are (adapters/cli/heap.py), and its pauses are printed
            heap.settle()
            pauses = _gc_pauses(measuring)
            acked: list[int] = [0]
            oks: dict[str, int] = {}
            lags: list[float] = []
            lagging = asyncio.create_task(_loop_lag(lags, measuring))
            publishing = asyncio.create_task(
                _publish(pub, [(c.topic, c.item) for c in clients], stop, acked, oks))
            await asyncio.sleep(args.warmup)
            measuring.set()
            cpu0, t0 = _cpu_seconds(gateway.pid), time.monotonic()
            broker0, own0 = _cpu_seconds(broker.pid), time.process_time()
            acked0 = acked[0]
            await asyncio.sleep(args.seconds)
            measuring.clear()
            cpu = _cpu_seconds(gateway.pid) - cpu0
            broker_cpu = _cpu_seconds(broker.pid) - broker0
            own_cpu = time.process_time() - own0
            published = acked[0] - acked0
            elapsed = time.monotonic() - t0
            stop.set()
            await publishing
            lagging.cancel()
            gc.callbacks.remove(pauses.timed)
            for task in followers:
                task.cancel()
        await pub.close()
        lat = sorted(x for c in clients for x in c.latencies)
        n = len(lat)
        q = statistics.quantiles(lat, n=100) if n >= 2 else [float("nan")] * 99
        what = "resource watches (notify)" if args.resources else "topic subscriptions"
        print(f"clients {args.clients} {what}  idle connections {args.idle}  window"
              f" {elapsed:.1f} s")
        print(f"published {published} ({published / elapsed:.0f}/s acknowledged by the broker)")
        print(f"received {n} ({n / elapsed:.0f}/s, {args.clients}/s asked)  out of order or"
              " repeated:"
              f" {sum(c.broken for c in clients)}")
        print(f"publish -> SSE receipt: p50 {q[49]:.1f} ms  p99 {q[98]:.1f} ms"
              f"  max {lat[-1] if lat else float('nan'):.1f} ms")
        print(f"gateway CPU: {cpu:.2f} s over the window = {cpu / max(n, 1) * 1e6:.0f} µs"
              " per message")
        print(f"broker CPU: {broker_cpu:.2f} s = {broker_cpu / max(n, 1) * 1e6:.0f} µs per"
              f" message; load average {os.getloadavg()[0]:.1f}")
        # this process is the publisher and every client: when it is short of CPU, so is the
        # measurement (a slow reader looks like a slow gateway)
        print(f"bench (publisher + clients) CPU: {own_cpu:.2f} s = {own_cpu / elapsed:.2f} of a"
              f" core; its event loop's lag p50 {_pct(lags, 50):.1f} ms p99"
              f" {_pct(lags, 99):.1f} ms max {max(lags, default=float('nan')):.1f} ms;"
              f" gc pauses > 1 ms: {len(pauses.over_1ms)}, max"
              f" {max(pauses.over_1ms, default=0):.1f} ms")
        if stages is not None:
            await asyncio.sleep(1)  # the probes write twice a second
            seen = {k: {"ok": t} for k, t in oks.items()}
            for c in clients:
                for k, t in c.received.items():
                    seen.setdefault(k, {})["received"] = t
            for line in report(stages, seen):
                print(line)
    finally:
        for _, writer in idle:
            writer.close()
        for proc in (gateway, broker):
            proc.terminate()
            await proc.wait()


async def _all_ready(readies: list[asyncio.Event], followers: list[asyncio.Task[None]]) -> None:
    """Until every client's stream is open; a client that failed before (its POST refused,
    its connection lost) fails the run with its error, rather than leave it waiting."""
    waiting = [asyncio.ensure_future(r.wait()) for r in readies]
    try:
        pending: set[asyncio.Future[Any]] = {*waiting, *followers}
        deadline = asyncio.get_running_loop().time() + 300
        while any(not w.done() for w in waiting):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise TimeoutError(f"{sum(not w.done() for w in waiting)} clients not ready")
            done, pending = await asyncio.wait(pending, timeout=left,
                                               return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task in followers:
                    task.result()  # raises what the client met
                    raise RuntimeError("a client's stream ended before the run")
    finally:
        for w in waiting:
            w.cancel()


def _pct(xs: list[float], p: int) -> float:
    return sorted(xs)[min(len(xs) - 1, len(xs) * p // 100)] if xs else float("nan")


async def _loop_lag(lags: list[float], measuring: asyncio.Event) -> None:
    """How late a 10 ms timer fires on this process's loop, while measuring: a late loop reads
    the clients' streams late, and its lag is added to every latency it measures."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        if measuring.is_set():
            lags.append((time.perf_counter() - t - 0.01) * 1e3)


@dataclass
class _Pauses:
    measuring: asyncio.Event
    over_1ms: list[float] = field(default_factory=list)
    started: float = 0.0

    def timed(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.measuring.is_set() and (took := time.perf_counter() - self.started) > 1e-3:
            self.over_1ms.append(took * 1e3)


def _gc_pauses(measuring: asyncio.Event) -> _Pauses:
    pauses = _Pauses(measuring)
    gc.callbacks.append(pauses.timed)
    return pauses


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default=os.environ.get("APEXPS_BOOTSTRAP"),
                   required=os.environ.get("APEXPS_BOOTSTRAP") is None)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--idle", type=int, default=0)
    p.add_argument("--resources", action="store_true",
                   help="each client watches one resource (TOPIC/item-k, modified)")
    p.add_argument("--stages", metavar="DIR",
                   help="time each step of a Notify's path (ops/bench/_stages.py) into DIR")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(_args()))
