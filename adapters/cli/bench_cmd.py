"""`apexps bench journal`: the benchmarks that live under ops/bench, from the CLI."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

BENCHES = {
    "journal": ("ops.bench.bench_journal", "journal appends vs raw confluent-kafka produce"),
    "selectors": ("ops.bench.bench_selectors", "selector evaluation, index and Spark matching"),
    "beep": ("ops.bench.bench_beep", "BEEP frame parser throughput"),
    "apex": ("ops.bench.bench_apex", "APEX data->ok round trips through a live ApexServer"),
    "pubsub": ("ops.bench.bench_pubsub", "publish->deliver via apex=pubsub vs raw Kafka"),
}


def _run(args: argparse.Namespace) -> int:
    module = importlib.import_module(BENCHES[args.which][0])
    return int(module.main(args.rest))


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="run a benchmark and print figures against raw Kafka",
                       description="Run one of the benchmarks under ops/bench. Arguments after "
                                   "the name go to the benchmark (try `apexps bench journal -h`).")
    p.add_argument("which", choices=sorted(BENCHES), help="; ".join(
        f"{k}: {v[1]}" for k, v in sorted(BENCHES.items())))
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=_run)
