"""What any Spark audit of a namespace must at least do, timed beside the bare read (issue 19).

Issue 19 asks the audit of 1,000,000 journal records to run at >= 0.5x the rate of a bare
spark-sql-kafka `count()` of the same topics. This probe times, in one session on the same kept
history (`python -m ops.bench.bench_audit --records N --keep` leaves one), the steps no audit
design can skip, each as one Spark action:

1. the bare read: `count()` of the journal's and the links topic's raw Kafka rows (the
   yardstick);
2. the journal decoded in the JVM (from_avro), projected to what every check needs (source,
   source seq, its Kafka position), every column hashed (a `count()` would let Spark prune the
   decode away);
3. the link log decoded and exploded to one row per link record, hashed the same way;
4. both decoded and joined on the journal position (what a link carried against what the
   journal holds), the rows counted where one side is missing or the link's source and seq
   disagree with the journal's: the smallest reconciliation there is, with no per-source
   order, no selector, no token, no lifetime, no report;
5. step 4 and the per-source continuity check (each source's seqs sorted, every step of one
   checked) over one decode of the journal kept in memory, as the audit keeps it: the two
   checks the issue names first, and nothing else;
6. the same two checks by hash aggregation and no sort: each source's distinct seqs against
   their span, and each link's carried (position, source, seq) fingerprinted against its
   topic's messages; a disagreement would then be located by step 5's sorts for that source
   or link alone.

The first run of each step (`cold`) pays its plan's code generation and the JIT, as each plan of
an audit does; the medians are of the runs after it. Each step's ratio to the bare read is the
best an audit that does that much could reach. If step 4 is already under 0.5x, no audit that
reads and decodes both topics and reconciles them does better in Spark on this machine,
whatever its plan; if it is well over, the audit's own plans are what hold it. `answer` is what
each step found: the rows read, and for the checks the faults (0 on a clean history).

    python -m ops.bench.probe_audit_floor --bootstrap HOST:PORT --namespace NS [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from broker.kafka_io import KafkaConfig
from broker.spark.journal_reader import decode_journal
from broker.spark.readers import decode_links
from broker.spark.source import kafka_source
from ops.bench.bench_spark_decode import _timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=os.environ.get("APEXPS_BOOTSTRAP"), required=False,
                    help="the Kafka holding the history (default: $APEXPS_BOOTSTRAP)")
    ap.add_argument("--namespace", required=True,
                    help="a history bench_audit --keep left (it prints its namespace)")
    ap.add_argument("--runs", type=int, default=3, help="rounds of all six steps (default 3)")
    args = ap.parse_args(argv)
    if not args.bootstrap:
        ap.error("no Kafka: pass --bootstrap or set APEXPS_BOOTSTRAP")
    from pyspark.sql import functions as F

    from adapters.local.spark import local_session

    spark = local_session(app_name="probe-audit-floor", master="local[2]",
                          conf={"spark.ui.showConsoleProgress": "false"})
    config = KafkaConfig(bootstrap=args.bootstrap, namespace=args.namespace)
    journal_raw = kafka_source(spark, config, "journal")
    links_raw = kafka_source(spark, config, "links")

    def journal() -> Any:
        return (decode_journal(journal_raw, python_fallback=False)
                .select("source", "source_seq", "kafka_partition", "kafka_offset"))

    def links() -> Any:
        return (decode_links(links_raw, python_fallback=False)
                .select("link", "journal_partition", "journal_offset",
                        F.col("source").alias("l_source"), F.col("source_seq").alias("l_seq")))

    def reconcile(decoded: Any = None) -> int:
        j = ((journal() if decoded is None else decoded)
             .withColumnRenamed("kafka_partition", "p").withColumnRenamed("kafka_offset", "o")
             .withColumn("_j", F.lit(True)))
        lk = (links().filter(F.col("journal_offset").isNotNull())
              .withColumnRenamed("journal_partition", "p").withColumnRenamed(
                  "journal_offset", "o").withColumn("_l", F.lit(True)))
        both = j.join(lk, ["p", "o"], "full_outer")
        # a link's source and seq checked against the journal's: every decoded column is read
        wrong = (F.col("_j").isNull() | F.col("_l").isNull()
                 | ~F.col("source").eqNullSafe(F.col("l_source"))
                 | ~F.col("source_seq").eqNullSafe(F.col("l_seq")))
        return int(both.filter(wrong).count())

    def read(frame: Any) -> int:
        """Every column of `frame` read (a bare `count()` would let Spark skip the decode);
        the rows."""
        row = frame.agg(F.max(F.xxhash64(*frame.columns)), F.count("*").alias("n")).first()
        return int(row["n"])

    def both_checks() -> int:
        """The join, and each source's seqs contiguous (the check the issue names first),
        over one decode of the journal kept in memory, as the audit keeps it."""
        from pyspark.sql import Window

        kept = journal().persist()
        try:
            prev = F.lag("source_seq").over(Window.partitionBy("source").orderBy("source_seq"))
            stepped = kept.withColumn("_prev", prev)
            holes = stepped.filter(F.col("source_seq") != F.col("_prev") + 1).count()
            return int(holes) + reconcile(kept)
        finally:
            kept.unpersist()

    def by_aggregates() -> int:
        """Both checks by hash aggregation, no sort: each source's seqs counted, their
        duplicates and their span (a hole is span - distinct), and each link's carried
        (position, source, seq) fingerprinted against its topic's journal messages' (this
        history's links: bench-sK carries topic tK). A mismatch would then be located by the
        sorts above, for that source or link only."""
        cols = ("kafka_partition", "kafka_offset", "source", "source_seq")
        kept = (decode_journal(journal_raw, python_fallback=False)
                .select("topic", *cols).persist())
        try:
            seqs = kept.groupBy("source", "source_seq").agg(F.count("*").alias("c"))
            per = seqs.groupBy("source").agg(
                F.sum("c").alias("n"), F.count("*").alias("d"), F.min("source_seq").alias("lo"),
                F.max("source_seq").alias("hi"))
            bad_sources = per.filter((F.col("n") != F.col("d"))
                                     | (F.col("hi") - F.col("lo") + 1 != F.col("d"))).count()

            def prints(frame: Any, key: Any, *on: str) -> Any:
                h = F.xxhash64(*on)
                return frame.groupBy(key.alias("k")).agg(
                    F.count("*").alias("n"), F.sum(F.pmod(h, F.lit(2_147_483_647))).alias("a"),
                    F.sum(F.pmod(h, F.lit(2_147_483_629))).alias("b"))

            want = prints(kept, F.col("topic"), *cols)
            carried = (links().filter(F.col("journal_offset").isNotNull())
                       .select(F.regexp_replace("link", "^bench-s", "t").alias("topic"),
                               F.col("journal_partition").alias("kafka_partition"),
                               F.col("journal_offset").alias("kafka_offset"),
                               F.col("l_source").alias("source"),
                               F.col("l_seq").alias("source_seq")))
            got = prints(carried, F.col("topic"), *cols)
            both = want.join(got, ["k"], "full_outer")
            return int(bad_sources) + int(both.filter(~(
                want["n"].eqNullSafe(got["n"]) & want["a"].eqNullSafe(got["a"])
                & want["b"].eqNullSafe(got["b"]))).count())
        finally:
            kept.unpersist()

    steps: list[tuple[str, Callable[[], object]]] = [
        ("bare count() of both topics", lambda: int(journal_raw.count() + links_raw.count())),
        ("journal decoded, projected", lambda: read(journal())),
        ("links decoded, exploded", lambda: read(links())),
        ("both, joined on the position", reconcile),
        ("that, and per-source continuity", both_checks),
        ("both checks by aggregation", by_aggregates),
    ]
    n = journal_raw.count()
    print(f"warming: {n:,} journal records, {links_raw.count():,} links-topic rows",
          file=sys.stderr, flush=True)
    # the first run of each plan pays its code generation and the JIT, as an audit's plans do
    cold, found = {}, {}
    for name, run in steps:
        start = time.perf_counter()
        found[name] = run()
        cold[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name, _ in steps}
    for r in range(args.runs):
        for name, run in steps:
            times[name].append(_timed(run))
        print(f"round {r + 1} of {args.runs} done", file=sys.stderr, flush=True)
    bare = sorted(times[steps[0][0]])[len(times[steps[0][0]]) // 2]
    print(f"\n{n:,} journal records, Spark local[2], median of {args.runs}\n")
    print(f"{'':32}{'seconds':>9}{'journal rec/s':>15}{'x the bare read':>17}{'cold s':>9}"
          f"{'answer':>10}   runs")
    for name, _ in steps:
        med = sorted(times[name])[len(times[name]) // 2]
        runs = " ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:32}{med:>9.2f}{n / med:>15,.0f}{bare / med:>16.2f}x{cold[name]:>9.2f}"
              f"{found[name]:>10,}   {runs}")
    print(f"\nload average {os.getloadavg()}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
