"""Would a second broker process move W1 on this machine? (issue 21)

W1 is bound by the broker's event-loop thread (docs/bench-peers.md, "Where W1's broker waits").
This probe runs bench_peers' W1 (or W3) two ways, alternated: as bench_peers does, one broker
serving the publisher and the subscribers; and split, the publisher on broker A and the
subscribers on broker B, a second broker process on the same namespace, which reads A's
publications through its journal follower. It prints each run's rate and the CPU each process
spent per message, so the question is answered by where the CPU went, not by the rate alone.

    python -m ops.bench.probe_split_brokers --bootstrap HOST:PORT [--system plain|robust]
        [--workload W1|W3] [--pairs 2] [--messages 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from ops.bench import bench_peers
from ops.bench.bench_pubsub import ROOT, _cpu_seconds, _listener_pid


def _run(args: argparse.Namespace, kafka_pid: int | None, split: bool) -> dict[str, float]:
    a = bench_peers._Broker(args.system, args.bootstrap)
    b: subprocess.Popen[str] | None = None
    try:
        subscribers_at = a.address
        if split:
            b = subprocess.Popen(
                [sys.executable, "-m", "ops.bench.bench_pubsub", "--serve", "--bootstrap",
                 args.bootstrap, "--namespace", a.namespace,
                 *(["--plain"] if args.system == "plain" else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True)
            assert b.stdout is not None
            subscribers_at = b.stdout.readline().strip()
            if not subscribers_at:
                raise SystemExit("broker B did not start")
        here = [sys.executable, "-m", "ops.bench.bench_peers", "--system", args.system,
                "--workload", args.workload, "--messages", str(args.messages), "--rate",
                str(args.rate), "--seconds", str(args.seconds), "--window", str(args.window)]
        subs_out, pub_out = (Path(a.scratch.name) / name for name in ("subs", "pub"))
        subs = subprocess.Popen([*here, "--address", subscribers_at, "--as-subscribers",
                                 "--out", str(subs_out)], stdout=subprocess.PIPE, cwd=ROOT,
                                text=True)
        assert subs.stdout is not None
        if subs.stdout.readline().strip() != "ready":
            raise SystemExit("the subscribers failed to start")
        bench_peers._drain(subs.stdout)
        pids = [p for p in (a.pid, b.pid if b else None) if p is not None]
        before = [_cpu_seconds(p) for p in pids]
        kafka_before = _cpu_seconds(kafka_pid) if kafka_pid else 0.0
        pub = subprocess.run([*here, "--address", a.address, "--as-publisher", "--out",
                              str(pub_out)], capture_output=True, text=True, cwd=ROOT,
                             check=False)
        if pub.returncode or subs.wait():
            raise SystemExit(f"the run failed: {pub.stderr[-2000:]}")
        spent = [_cpu_seconds(p) - was for p, was in zip(pids, before, strict=True)]
        kafka = _cpu_seconds(kafka_pid) - kafka_before if kafka_pid else None
        sent = bench_peers.plan(args.workload, args)[0]
        got = bench_peers.figures(sent, json.loads(pub_out.read_text()),
                                  json.loads(subs_out.read_text()), sum(spent), kafka)
        for name, cpu in zip("AB", spent, strict=False):
            got[f"cpu_broker_{name}_us"] = cpu / sent * 1e6
        return got
    finally:
        if b is not None:
            assert b.stdin is not None
            b.stdin.close()  # the broker process ends when its stdin does
            b.wait(timeout=120)
        a.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=os.environ.get("APEXPS_BOOTSTRAP"),
                    help="a running Kafka nobody runs tests against (default: "
                         "$APEXPS_BOOTSTRAP)")
    ap.add_argument("--system", choices=("plain", "robust"), default="plain")
    ap.add_argument("--workload", choices=("W1", "W3"), default="W1")
    ap.add_argument("--pairs", type=int, default=2, help="alternated pairs (default 2)")
    ap.add_argument("--messages", type=int, default=20_000)
    args = ap.parse_args(argv)
    if not args.bootstrap:
        ap.error("no Kafka: pass --bootstrap or set APEXPS_BOOTSTRAP")
    args.rate, args.seconds, args.window = 1_000, 10, 256  # bench_peers' defaults
    kafka_pid = _listener_pid(args.bootstrap)
    cores = os.cpu_count() or 1
    print(f"{args.workload} {args.system}, {args.messages:,} messages, {cores} CPUs")
    for _ in range(args.pairs):
        for split in (False, True):
            f = _run(args, kafka_pid, split)
            per = {k: f[k] for k in f if k.startswith("cpu_")}
            whole = ("cpu_publisher_us", "cpu_subscribers_us", "cpu_broker_us", "cpu_kafka_us")
            busy = sum(f.get(k, 0.0) for k in whole) * f["rate"] / 1e6
            cpu = ", ".join(f"{k[4:-3]} {v:.0f}" for k, v in per.items())
            print(f"{'split' if split else 'one  '}  {f['rate']:>9,.0f} msgs/s  p50 "
                  f"{f['p50_ms']:6.1f} ms  CPU µs/msg: {cpu}  (cores busy {busy:.2f} of "
                  f"{cores})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
