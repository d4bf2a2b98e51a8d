"""What the web gateway costs: publish -> browser-side receipt through SSE, and the gateway's
CPU per delivered message.

Run: `.venv/bin/python -m ops.bench.bench_gateway --bootstrap HOST:PORT [--clients 50]
[--seconds 20] [--idle 0] [--resources] [--client-procs N] [--stages DIR]` (default bootstrap:
$APEXPS_BOOTSTRAP; no Kafka is started here).

A broker (`apexps broker`) and a gateway (`apexps gateway`) run as processes of their own on
that Kafka. The benchmark plays the browsers: `--clients` SSE clients, each with one
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

`--client-procs N` runs the clients in N processes of their own, not in this one (the
publisher's): browsers are separate machines, and one loop for 1,000 of them makes each of its
stalls a stall of every Notify in flight (ops/bench/_sse_clients.py says what was measured).
`--stages DIR` runs the broker and the gateway under ops/bench/_stages.py and prints where a
Notify's time goes, step by step, for all and for the slowest 1 %, with each process's
event-loop lag and garbage-collection pauses (ops/bench/_stage_report.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from adapters.client.pubsub_client import PubsubClient
from broker.records import PublishType

from ._sse_clients import Client, Readers, loop_lag, pct
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
            clients = [Client("bench.res", f"item-{k}") for k in range(args.clients)]
            for c in clients:  # each item exists before it is watched
                await pub.publish(c.topic, b"0", "text/plain", publish_type=PublishType.IMAGE,
                                  message_id=c.item, implicit=False)
        else:
            clients = [Client(f"bench.g{k}") for k in range(args.clients)]
            for c in clients:
                await pub.create_topic(c.topic)
        stop = asyncio.Event()
        opening = time.monotonic()
        readers = await Readers.start(url, clients, args.client_procs)
        opened = time.monotonic() - opening
        try:
            acked: list[int] = [0]
            oks: dict[str, int] = {}
            lags: list[tuple[int, float]] = []
            lagging = asyncio.create_task(loop_lag(lags))
            publishing = asyncio.create_task(
                _publish(pub, [(c.topic, c.item) for c in clients], stop, acked, oks))
            await asyncio.sleep(args.warmup)
            cpu0, t0, w0 = _cpu_seconds(gateway.pid), time.monotonic(), time.time_ns()
            broker0, own0 = _cpu_seconds(broker.pid), readers.cpu()
            acked0 = acked[0]
            await asyncio.sleep(args.seconds)
            cpu = _cpu_seconds(gateway.pid) - cpu0
            broker_cpu = _cpu_seconds(broker.pid) - broker0
            own_cpu = readers.cpu() - own0
            published = acked[0] - acked0
            elapsed, w1 = time.monotonic() - t0, time.time_ns()
            stop.set()
            await publishing
            lagging.cancel()
        finally:
            seen = await readers.stop()
        await pub.close()
        received = {k: t for k, t in seen.received.items() if w0 <= t < w1}
        lat = sorted((t - int(k)) / 1e6 for k, t in received.items())
        n = len(lat)
        q = statistics.quantiles(lat, n=100) if n >= 2 else [float("nan")] * 99
        what = "resource watches (notify)" if args.resources else "topic subscriptions"
        print(f"clients {args.clients} {what}  idle connections {args.idle}  window"
              f" {elapsed:.1f} s  (every stream open {opened:.1f} s after the first POST)")
        print(f"published {published} ({published / elapsed:.0f}/s acknowledged by the broker)")
        print(f"received {n} ({n / elapsed:.0f}/s, {args.clients}/s asked)  out of order or"
              f" repeated: {seen.broken}")
        print(f"publish -> SSE receipt: p50 {q[49]:.1f} ms  p99 {q[98]:.1f} ms"
              f"  max {lat[-1] if lat else float('nan'):.1f} ms")
        print(f"gateway CPU: {cpu:.2f} s over the window = {cpu / max(n, 1) * 1e6:.0f} µs"
              " per message")
        print(f"broker CPU: {broker_cpu:.2f} s = {broker_cpu / max(n, 1) * 1e6:.0f} µs per"
              f" message; load average {os.getloadavg()[0]:.1f}")
        # when the clients are short of CPU or stall, so is the measurement (a slow reader
        # looks like a slow gateway): their CPU, and every loop's lag and GC pauses
        own_lags = [ms for t, ms in lags if w0 <= t < w1]
        their_lags = [ms for t, ms in seen.lags if w0 <= t < w1]
        their_gc = [ms for t, ms in seen.gc if w0 <= t < w1]
        where = ("in this process" if not args.client_procs
                 else f"in {args.client_procs} processes of their own")
        print(f"bench: clients {where}; publisher + clients CPU {own_cpu:.2f} s ="
              f" {own_cpu / elapsed:.2f} of a core; publisher's loop lag p99"
              f" {pct(own_lags, 99):.1f} ms max {max(own_lags, default=float('nan')):.1f} ms;"
              f" clients' loop lag p99 {pct(their_lags, 99):.1f} ms max"
              f" {max(their_lags, default=float('nan')):.1f} ms; their gc pauses > 1 ms:"
              f" {len(their_gc)}, max {max(their_gc, default=0):.1f} ms")
        if stages is not None:
            await asyncio.sleep(1)  # the probes write twice a second
            stamps = {k: {"ok": t} for k, t in oks.items()}
            for k, t in received.items():
                stamps.setdefault(k, {})["received"] = t
            for line in report(stages, stamps, (w0, w1)):
                print(line)
    finally:
        for _, writer in idle:
            writer.close()
        for proc in (gateway, broker):
            proc.terminate()
            await proc.wait()


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
    p.add_argument("--client-procs", type=int, default=0, metavar="N",
                   help="spread the clients over N processes of their own (ops/bench/"
                        "_sse_clients.py: browsers are separate machines); 0: in this one")
    p.add_argument("--stages", metavar="DIR",
                   help="time each step of a Notify's path (ops/bench/_stages.py) into DIR")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(_args()))
