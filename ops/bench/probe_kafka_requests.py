"""How many Kafka requests the broker's own clients send per message, at a paced rate.

Run: `.venv/bin/python -m ops.bench.probe_kafka_requests --bootstrap HOST:PORT [--plain]
[--messages 3000] [--rate 1000]`

Kafka's CPU per message at a paced rate is mostly its wake-ups: each produce request and each
fetch answer wakes its network, request-handler and (for acks=all) replica threads, whatever it
carries. This counts them where they are sent: a `BrokerApp` in this process, on a fresh
namespace, every librdkafka client of it reporting its statistics (`statistics.interval.ms`,
through `KafkaConfig.extra`), one publisher and one subscriber (a link of its own unless
`--plain`) on loopback. It prints, per client (named by its type and the topics it served),
Produce and Fetch requests per message published, over the paced stretch only, with the p50
publish → receipt latency and this process's CPU per message (broker and both clients, which
share the event loop), split by thread (Python threads by name, librdkafka's by its own names
summed per kind), to see which thread a change moved. A count, unlike a CPU figure, hardly
moves with the machine's load; the counts of 2026-11-26 are in docs/bench-peers.md ("Kafka's
work per message").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, PubsubClient
from broker.kafka_io import KafkaConfig, drop_namespace

#: client name -> (its type, the topics it served, requests sent by request type)
_Stats = dict[str, tuple[str, list[str], dict[str, int]]]


def _collector(into: _Stats) -> Any:
    def stats(payload: str) -> None:
        got = json.loads(payload)
        sent: dict[str, int] = {}
        for broker in got.get("brokers", {}).values():
            for kind, n in broker.get("req", {}).items():
                sent[kind] = sent.get(kind, 0) + n
        into[got["name"]] = (got["type"], sorted(got.get("topics", {})), sent)
    return stats


def _threads_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, summed by name: a Python thread's
    name, else the OS name (librdkafka's `rdk:main`, `rdk:broker1`…, digits dropped)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        name = names.get(int(task.name)) or comm.rstrip("0123456789")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


async def _run(args: argparse.Namespace) -> None:
    seen: _Stats = {}
    # librdkafka takes a callable for stats_cb: `extra` is typed for strings only
    extra: dict[str, Any] = {"statistics.interval.ms": "200", "stats_cb": _collector(seen)}
    config = KafkaConfig(bootstrap=args.bootstrap, namespace=f"reqs{uuid.uuid4().hex[:8]}",
                         extra=extra)
    n = args.messages
    try:
        async with BrokerApp(config, sequenced=not args.plain) as app:
            pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
            sub = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com")
            await pub.create_topic("q.reqs")
            lats: list[float] = []
            done = asyncio.Event()

            def on(d: Delivered) -> None:
                lats.append(time.time() - float(d.content))
                if len(lats) >= n:
                    done.set()
            sub.deliver_to(on)
            await sub.subscribe("q.reqs", 600, link=None if args.plain else "reqs-link")
            await asyncio.sleep(1)  # a stats report covering the set-up, then the count starts
            before = {name: dict(v[2]) for name, v in seen.items()}
            cpu, began, threads = time.process_time(), time.time(), _threads_cpu()
            tasks = []
            for i in range(n):
                due = began + i / args.rate
                if due > time.time():
                    await asyncio.sleep(due - time.time())  # pacing the load
                tasks.append(asyncio.create_task(pub.publish("q.reqs", f"{due}".encode())))
            await asyncio.gather(*tasks)
            await done.wait()
            cpu_us = (time.process_time() - cpu) / n * 1e6
            by_thread = {k: (v - threads.get(k, 0.0)) / n * 1e6
                         for k, v in _threads_cpu().items()}
            await asyncio.sleep(1)  # the stats report that covers the end
            for c in (pub, sub):
                await c.close()
    finally:
        drop_namespace(config)
    lats.sort()
    print(f"{'plain' if args.plain else 'robust'}: {n} messages at {args.rate}/s, p50"
          f" {lats[n // 2] * 1e3:.2f} ms, this process {cpu_us:.0f} µs CPU per message")
    print("  CPU µs per message by thread: " + ", ".join(
        f"{k} {v:.0f}" for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1]) if v >= 1))
    for name, (kind, topics, sent) in sorted(seen.items()):
        was = before.get(name, {})
        per = {k: (v - was.get(k, 0)) / n for k, v in sent.items()
               if k in ("Produce", "Fetch") and v > was.get(k, 0)}
        if per:
            served = ",".join(t.split(".", 1)[1] for t in topics)
            print(f"  {kind} [{served}]: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in sorted(per.items())) + " per message")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--plain", action="store_true", help="a plain subscription (default: a link)")
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--rate", type=int, default=1000)
    args = ap.parse_args()
    from adapters.cli import logs

    logs.configure("warning", json=True)  # a log line per operation would be most of the CPU
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
