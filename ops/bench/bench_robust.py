"""What robust delivery costs: sequencing overhead, gap repair time, heartbeats on idle links.

Run: `.venv/bin/python -m ops.bench.bench_robust [--bootstrap HOST:PORT] [--seconds 10]`
(without --bootstrap a throwaway local Kafka is started).

Three measurements, each against real Kafka and the real BEEP wire (docs/performance.md has
the targets and the latest figures):

1. Sequencing overhead. The broker runs in its own process twice, once on the plain topic path
   (`BrokerApp(sequenced=False)`) and once sequenced (link seqs, link log in Kafka), with the same
   10 subscribers and publisher processes as `bench_pubsub`; flat-out deliveries/s and paced
   p50/p99 publish→deliver latency of each, the overhead of sequencing (target ≤ 20%), and raw
   confluent-kafka's end-to-end rate in the same run for scale.
2. Gap repair. A link carries `--gap` messages (10,000); a subscriber then asks for all of them
   again by link range (`gap linkfrom=1 linkto=N`) and by source (`repair` with after=0): the
   time from the request to the last refilled item and the 250 reply (target < 1 s each). The
   subscriber runs in a process of its own. Twice: warm (the broker keeps what its journal
   follower read lately, broker/recent.py, as a running broker does) and cold (it keeps
   nothing, as right after a restart: every record is read back from Kafka).
3. Heartbeats. A broker process with `--idle-links` (1,000) idle links at the default
   heartbeat interval: its CPU time per second and the heartbeats/s it sends, against the same
   process with no links.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from adapters.apex.batch_codec import DEFAULT_BATCH
from ops.bench import _profile as profiled
from ops.bench.bench_pubsub import DOMAIN, ROOT, SIZE, TOPIC, _case, _create_topic, _raw

SUBSCRIBERS = 10
PACED_RATE = 200


# --- 1. sequencing overhead ---------------------------------------------------------------


def _broker(bootstrap: str, *extra: str) -> tuple[subprocess.Popen[str], int]:
    server = subprocess.Popen(
        [sys.executable, "-m", "ops.bench.bench_pubsub", "--serve", "--bootstrap", bootstrap,
         "--namespace", f"bench{uuid.uuid4().hex[:8]}", *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True)
    assert server.stdout is not None
    return server, int(server.stdout.readline())


def _stop(server: subprocess.Popen[str]) -> None:
    assert server.stdin is not None
    server.stdin.close()
    server.wait(timeout=120)


def _overhead(bootstrap: str, seconds: float, window: int) -> None:
    raw = _raw(bootstrap, seconds, 0)
    print(f"raw confluent-kafka, one producer and one consumer: {raw['msgs_per_s']:,.0f} msgs/s",
          flush=True)
    results: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    for mode, extra in (("plain", ("--plain",)), ("sequenced", ())):
        server, port = _broker(bootstrap, *extra)
        try:
            _create_topic(port)
            paced = _case(port, SUBSCRIBERS, seconds, PACED_RATE, 1, DEFAULT_BATCH)
            flat = _case(port, SUBSCRIBERS, seconds, 0, window, DEFAULT_BATCH)
        finally:
            _stop(server)
        results[mode] = (paced, flat)
        print(f"{mode:>9}: flat out {flat['deliveries_per_s']:,.0f} deliveries/s"
              f" ({flat['msgs_per_s']:,.0f} msgs/s to {SUBSCRIBERS} subscribers,"
              f" {flat['msgs_per_s'] / raw['msgs_per_s']:.2f}x raw);"
              f" paced {PACED_RATE}/s p50 {paced['p50']:.1f} ms p99 {paced['p99']:.1f} ms"
              f"{'' if paced['complete'] and flat['complete'] else ' INCOMPLETE'}", flush=True)
    (p_paced, p_flat), (s_paced, s_flat) = results["plain"], results["sequenced"]
    cost = 1 - s_flat["deliveries_per_s"] / p_flat["deliveries_per_s"]
    print(f"sequencing overhead: {cost:+.0%} deliveries/s (target ≤ 20%);"
          f" paced p99 {s_paced['p99'] - p_paced['p99']:+.1f} ms", flush=True)


# --- 2. gap repair ------------------------------------------------------------------------


def _append(app: object, topic: str, count: int, source: str) -> None:
    from adapters.app import BrokerApp
    from broker.records import Publication
    from common.errors import JournalUnavailable

    assert isinstance(app, BrokerApp)
    body = b"x" * SIZE
    for start in range(0, count, 1000):
        done = threading.Event()
        failed: list[object] = []

        def settled(results: Sequence[object], done: threading.Event = done,
                    failed: list[object] = failed) -> None:
            failed.extend(r for r in results if isinstance(r, JournalUnavailable))
            done.set()

        app.core.journal.append_many(
            [Publication(topic, source, body) for _ in range(start, min(start + 1000, count))],
            settled)
        if not done.wait(120) or failed:
            raise SystemExit("journal append failed")


async def _repairs(bootstrap: str, count: int, cold: bool = False) -> None:
    """The broker here; the subscriber in a process of its own (`_repair_subscriber`), so the
    two do not share a GIL and the time is what a separate subscriber would see."""
    from adapters.app import BrokerApp
    from broker.kafka_io import KafkaConfig
    from broker.recent import DEFAULT_RECENT_BYTES
    from broker.robust.config import RobustConfig

    config = KafkaConfig(bootstrap=bootstrap, namespace=f"bench{uuid.uuid4().hex[:8]}")
    robust = RobustConfig(heartbeat_ms=600_000, max_gap=max(count, 10_000))
    # cold: nothing of the journal kept in memory (broker/recent.py), as right after a
    # restart: every refill and catch-up reads Kafka back
    async with BrokerApp(config, domain=DOMAIN, robust=robust,
                         recent_bytes=0 if cold else DEFAULT_RECENT_BYTES) as app:
        sub = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ops.bench.bench_robust", "--as-repair-subscriber",
            "--port", str(app.port), "--gap", str(count), cwd=ROOT,
            stdout=asyncio.subprocess.PIPE)
        assert sub.stdout is not None
        if (await asyncio.wait_for(sub.stdout.readline(), 120)).strip() != b"ready":
            raise SystemExit("the repair subscriber failed to start")
        await asyncio.to_thread(_append, app, TOPIC, count, f"pub@{DOMAIN}")
        out, _ = await asyncio.wait_for(sub.communicate(), 600)
    print(out.decode().strip(), flush=True)


async def _repair_subscriber(port: int, count: int) -> None:
    from adapters.client.pubsub_client import Delivered, PubsubClient

    source, link = f"pub@{DOMAIN}", "bench-gap"
    jade = await PubsubClient.connect("127.0.0.1", port, f"jade@{DOMAIN}", timeout=120)
    await jade.create_topic(TOPIC)
    await jade.subscribe(TOPIC, 3600, link=link)
    events = jade.events()
    print("ready", flush=True)
    live = 0
    while live < count:
        if isinstance(await asyncio.wait_for(anext(events), 120), Delivered):
            live += 1

    async def refilled(request: asyncio.Future[object]) -> tuple[float, int]:
        began, got = time.perf_counter(), 0
        async with asyncio.timeout(120):  # one deadline: a wait_for per message is a task each
            while got < count:
                if isinstance(await anext(events), Delivered):
                    got += 1
            await request
        return time.perf_counter() - began, got

    took, got = await refilled(asyncio.ensure_future(jade.gap(link, 1, count)))
    print(f"gap fill by link range, {got:,} messages: {took * 1e3:,.0f} ms"
          f" ({got / took:,.0f} msgs/s; target < 1 s)", flush=True)
    took, got = await refilled(asyncio.ensure_future(jade.repair(link, [(source, 0)])))
    print(f"repair by source, {got:,} messages: {took * 1e3:,.0f} ms"
          f" ({got / took:,.0f} msgs/s; target < 1 s)", flush=True)
    await jade.close()


# --- 3. heartbeats ------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _heartbeats(bootstrap: str, links: int, seconds: float) -> None:
    from adapters.client.pubsub_client import LinkEvent, PubsubClient
    from broker.robust.config import DEFAULT_HEARTBEAT_MS

    server, port = _broker(bootstrap)
    try:
        def busy() -> float:
            before = _cpu_seconds(server.pid)
            time.sleep(seconds)  # measuring a steady state over a window, not awaiting
            return (_cpu_seconds(server.pid) - before) / seconds

        idle = await asyncio.to_thread(busy)
        client = await PubsubClient.connect("127.0.0.1", port, f"idle@{DOMAIN}",
                                            link_events=True)
        for i in range(links):
            await client.create_topic(f"idle.t{i}")
            await client.subscribe(f"idle.t{i}", 3600, link=f"idle-{i}")
        beats = 0

        async def count() -> None:
            nonlocal beats
            async for event in client.events():
                if isinstance(event, LinkEvent) and event.stamp.kind == "heartbeat":
                    beats += 1

        counter = asyncio.create_task(count())
        await asyncio.to_thread(time.sleep, DEFAULT_HEARTBEAT_MS / 1000)  # one interval in
        beats = 0
        loaded = await asyncio.to_thread(busy)
        rate = beats / seconds
        counter.cancel()
        await client.close()
    finally:
        _stop(server)
    extra = loaded - idle
    print(f"heartbeats, {links:,} idle links at {DEFAULT_HEARTBEAT_MS:,} ms:"
          f" {rate:,.0f} heartbeats/s received; broker CPU {idle:.1%} with no links,"
          f" {loaded:.1%} with them ({extra:+.1%} of one core,"
          f" {extra / max(rate, 1) * 1e6:,.0f} µs per heartbeat)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--bootstrap", help="an existing Kafka (default: start a throwaway one)")
    ap.add_argument("--seconds", type=float, default=10.0, help="per phase (default: 10)")
    ap.add_argument("--window", type=int, default=64,
                    help="publications in flight in the flat-out phase (default: 64)")
    ap.add_argument("--gap", type=int, default=10_000, help="messages to repair (10,000)")
    ap.add_argument("--idle-links", type=int, default=1_000, help="idle links (1,000)")
    ap.add_argument("--only", choices=("overhead", "repair", "heartbeats"),
                    help="run one measurement")
    ap.add_argument("--as-repair-subscriber", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.as_repair_subscriber:
        profiled.run(_repair_subscriber(args.port, args.gap),
                     profile=bool(os.environ.get("PROFILE_SUBSCRIBER")))
        return 0
    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from adapters.local.kafka import LocalKafka

        kafka = LocalKafka(Path(tempfile.mkdtemp(prefix="apexps-bench-")))
        bootstrap = kafka.start().bootstrap
    try:
        print(f"robust delivery, {SIZE}-octet messages, {os.cpu_count()} CPUs,"
              f" Kafka {bootstrap}", flush=True)
        if args.only in (None, "overhead"):
            _overhead(bootstrap, args.seconds, args.window)
        if args.only in (None, "repair"):
            print("warm (the broker keeps what its follower read lately):", flush=True)
            profiled.run(_repairs(bootstrap, args.gap))
            print("cold (every read from Kafka, as right after a restart):", flush=True)
            profiled.run(_repairs(bootstrap, args.gap, cold=True))
        if args.only in (None, "heartbeats"):
            profiled.run(_heartbeats(bootstrap, args.idle_links, args.seconds))
    finally:
        if kafka is not None:
            kafka.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
