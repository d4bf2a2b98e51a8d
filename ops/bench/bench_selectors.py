"""Selector benchmarks: (a) one selector on stored fields, (b) SubscriptionIndex, (c) Spark.

    .venv/bin/python -m ops.bench.bench_selectors [--no-spark] [--spark-rows N]
    apexps bench selectors

(a) evaluates the draft's 3-predicate JMS selector on the draft quote's stored fields.
(b) fills a SubscriptionIndex with N subscriptions, 90% of them `symbol = 'Sddd' AND
    net-change-pct > x` over 1,000 symbols, and 10% with no equality predicate
    (`mK > x AND mK < y` over 200 optional metrics, of which each message carries 4), then
    pushes random quote messages' stored fields through `match`, on one core. Twice: with
    "unique" selectors (random thresholds: no two subscriptions share a selector, the worst
    case) and "shared" ones (thresholds from a menu of 21 percents and 10 ranges, so popular
    selectors repeat, and the index evaluates each distinct one once).
(c) filters a generated DataFrame of fields maps with one compiled selector in Spark local[2].
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

from broker import selectors
from broker.selectors import SubscriptionIndex

DRAFT_JMS = ("symbol IN ('XMPL', 'TEST', 'SMPL') AND "
             "(net-change-pct > 5.0 OR net-change-pct < -5.0)")
TARGET_EVALS, TARGET_INDEX_100K = 200_000, 5_000
N_SYMBOLS, N_METRICS, METRICS_PER_MESSAGE = 1_000, 200, 4


def bench_single(seconds: float = 1.0) -> float:
    sel = selectors.compile("JMS", DRAFT_JMS)
    # Three predicates evaluated: the OR's first branch is false, the second is reached.
    fields = {"symbol": ["XMPL"], "net-change-pct": ["-10.0"], "last-trade": ["11.0"],
              "issue-name": ["Example, Inc."], "topic": ["equity.quote.service"]}
    assert sel.matches_fields(fields)
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(10_000):
            sel.matches_fields(fields)
        n += 10_000
    return n / elapsed


def _subscription(rng: random.Random, i: int, shared: bool) -> selectors.Selector:
    # shared: thresholds from a menu (whole percents, tens), so selectors repeat across
    # subscribers as popular ones do; otherwise every selector is distinct.
    if i % 10:
        pct = rng.randrange(-10, 11) if shared else round(rng.uniform(-10, 10), 2)
        return selectors.compile(
            "JMS", f"symbol = 'S{rng.randrange(N_SYMBOLS):03d}' AND net-change-pct > {pct}")
    k = rng.randrange(N_METRICS)
    low = 10 * rng.randrange(10) if shared else round(rng.uniform(0, 100), 1)
    return selectors.compile("JMS", f"m{k} > {low} AND m{k} < {low + 10}")


def _message(rng: random.Random) -> dict[str, list[str]]:
    fields = {"symbol": [f"S{rng.randrange(N_SYMBOLS):03d}"],
              "net-change-pct": [f"{rng.uniform(-10, 10):.2f}"],
              "last-trade": [f"{rng.uniform(1, 100):.2f}"]}
    for k in rng.sample(range(N_METRICS), METRICS_PER_MESSAGE):
        fields[f"m{k}"] = [f"{rng.uniform(0, 100):.1f}"]
    return fields


def bench_index(size: int, shared: bool, messages: int = 2_000) -> tuple[float, float]:
    """(messages/s, mean matches per message) for an index of `size` subscriptions."""
    rng = random.Random(size)
    index: SubscriptionIndex[tuple[str, int]] = SubscriptionIndex()
    for i in range(size):
        index.add((f"subscriber-{i % 97}", i), _subscription(rng, i, shared))
    batch = [_message(rng) for _ in range(messages)]
    matched = 0
    start = time.perf_counter()
    for fields in batch:
        matched += len(index.match(fields))
    elapsed = time.perf_counter() - start
    return messages / elapsed, matched / messages


def bench_spark(rows: int) -> float:
    from adapters.local.spark import local_session

    # No Kafka connector: this figure reads a generated DataFrame, not a topic.
    spark = local_session(app_name="bench-selectors", with_kafka=False)
    try:
        df = spark.range(rows).selectExpr(
            "map('symbol', array(concat('S', lpad(cast(id % 1000 AS STRING), 3, '0'))),"
            " 'net-change-pct', array(cast(round(rand(7) * 20 - 10, 2) AS STRING)),"
            " 'last-trade', array(cast(round(rand(8) * 100, 2) AS STRING))) AS fields"
        ).cache()
        df.count()  # materialize, so the timing is the matching alone
        sel = selectors.compile("JMS", "symbol IN ('S001', 'S002', 'S003') AND "
                                       "(net-change-pct > 5.0 OR net-change-pct < -5.0)")
        start = time.perf_counter()
        df.filter(sel.to_spark("fields")).count()
        elapsed = time.perf_counter() - start
        df.unpersist()
        return rows / elapsed
    finally:
        spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_selectors", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-spark", action="store_true", help="skip figure (c)")
    parser.add_argument("--spark-rows", type=int, default=2_000_000)
    args = parser.parse_args(argv)

    rows: list[tuple[str, str, str]] = []
    rows.append(("(a) single selector, evaluations/s", f"{bench_single():,.0f}",
                 f">= {TARGET_EVALS:,}"))
    for shared in (False, True):
        for size in (1_000, 10_000, 100_000):
            rate, mean = bench_index(size, shared)
            target = f">= {TARGET_INDEX_100K:,}" if size == 100_000 else "-"
            label = "shared" if shared else "unique"
            rows.append((f"(b) {size:,} subs, {label} selectors, msgs/s ({mean:.1f} hits/msg)",
                         f"{rate:,.0f}", target))
    if not args.no_spark:
        rows.append((f"(c) Spark local[2] filter, rows/s ({args.spark_rows:,} rows)",
                     f"{bench_spark(args.spark_rows):,.0f}", "-"))
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'measured':>12}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>12}  {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
