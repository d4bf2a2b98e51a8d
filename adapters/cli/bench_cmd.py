"""`apexps bench journal`: the benchmarks that live under ops/bench, from the CLI.

The benchmarks are scripts of the checkout, not part of the installed package (product code
never imports ops/): this runs `python -m ops.bench.NAME` in the checkout apexps was installed
from (the parent of adapters.local.provision.OPS_DIR), and says so when there is none.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from adapters.local.provision import OPS_DIR

BENCHES = {
    "journal": ("ops.bench.bench_journal", "journal appends vs raw confluent-kafka produce"),
    "selectors": ("ops.bench.bench_selectors", "selector evaluation, index and Spark matching"),
    "beep": ("ops.bench.bench_beep", "BEEP frame parser throughput"),
    "apex": ("ops.bench.bench_apex", "APEX data->ok round trips through a live ApexServer"),
    "pubsub": ("ops.bench.bench_pubsub", "publish->deliver via apex=pubsub vs raw Kafka"),
    "content": ("ops.bench.bench_content",
                "content ingest per message; fan-out with selector vs topic subscriptions"),
    "spark": ("ops.bench.bench_spark_decode",
              "journal decode in Spark: spark-avro vs a Python UDF vs a bare Kafka read"),
}


def _run(args: argparse.Namespace) -> int:
    if not (OPS_DIR / "bench").is_dir():
        print(f"apexps: the benchmarks are in a checkout's ops/bench, and {OPS_DIR / 'bench'} is"
              " not there: install apexps from a checkout (pip install -e) or set APEXPS_OPS_DIR",
              file=sys.stderr)
        return 1
    module = BENCHES[args.which][0]
    return subprocess.run([sys.executable, "-m", module, *args.rest],
                          cwd=OPS_DIR.parent, check=False).returncode


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="run a benchmark and print figures against raw Kafka",
                       description="Run one of the benchmarks under ops/bench. Arguments after "
                                   "the name go to the benchmark (try `apexps bench journal -h`).")
    p.add_argument("which", choices=sorted(BENCHES), help="; ".join(
        f"{k}: {v[1]}" for k, v in sorted(BENCHES.items())))
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=_run)
