"""The audit end to end on local[2] against a bare spark-sql-kafka read of the same topics.

    .venv/bin/python -m ops.bench.bench_audit [--bootstrap HOST:PORT] [--records N]

Writes N journal records and the link records of 10 subscriptions to a fresh namespace
directly (the broker's record codecs, one confluent-kafka producer; no BEEP, no broker): ten
topics, N/10 messages each from 100 sources, and ten subscribers each subscribed to one topic
over a link, so every message is delivered once and the links hold N DATA records (packed 64
to a Kafka record, as the link log packs a fan-out turn) after each link's RESET. The history
is clean: contiguous source seqs, every expected message on its link in order.

Then, in one Spark local[2] session:
- count:  `count()` of the raw Kafka rows of the journal and the links topics (spark-sql-kafka
  only: the floor any audit sits on);
- audit:  `apexps audit` in this process (the same session), end to end: read, decode,
  reconcile, write findings, summary.json and report.html;
and prints both times, the audit's rate against the count's (the issue's target: >= 0.5x), and
the decode rate native (spark-avro) against the Python UDF (ops/bench/bench_spark_decode.py's
timing of the same journal). The namespace's topics are deleted at the end: the Kafka may be
shared. Without --bootstrap (or APEXPS_BOOTSTRAP) a throwaway local Kafka is started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.codec import default_codec
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, drop_namespace
from broker.records import Publication, PublishType, Subscription, SubscriptionState
from broker.spark.journal_reader import decode_journal
from broker.spark.source import kafka_source
from ops.bench.bench_spark_decode import _python_decode

SUBSCRIPTIONS = 10
SOURCES = 100
#: link records per link_batch (the link log's packs are one fan-out turn's records)
PACK = 64
T0 = 1_764_000_000_000
BITS = 32


def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                     "compression.type": "lz4", "enable.idempotence": True})


def _send(producer: Any, topic: str, value: bytes, key: bytes, partition: int) -> None:
    while True:
        try:
            producer.produce(topic, value, key, partition=partition)
            return
        except BufferError:
            producer.poll(0.1)


def fill(config: KafkaConfig, n: int) -> dict[str, int]:
    """Write the history (see the module doc); returns what was written."""
    core = BrokerCore(config)
    core.open()  # creates the namespace's topics with the broker's settings
    try:
        for k in range(SUBSCRIPTIONS):
            core.subscriptions.put(Subscription(
                subscriber=f"s{k}@example.com", subscription_id=f"sub{k}", topic=f"t{k}",
                duration_s=0, state=SubscriptionState.ACTIVE, created_at=T0 - 60_000,
                link_id=f"bench-s{k}", originator=f"s{k}@example.com"))
    finally:
        core.close()
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": config.bootstrap}).list_topics(timeout=30)
    journal_parts = len(meta.topics[config.topic("journal")].partitions)
    link_parts = len(meta.topics[config.topic("links")].partitions)
    codec = default_codec()
    producer = _producer(config.bootstrap)
    journal = config.topic("journal")
    # The offset each journal record gets: a fresh topic, one idempotent producer, explicit
    # partitions, so offsets are 0, 1, 2, ... per partition in produce order.
    next_offset = [0] * journal_parts
    seqs = [0] * SOURCES
    pending: list[list[dict[str, Any]]] = [[] for _ in range(SUBSCRIPTIONS)]
    ordinals = [0] * SUBSCRIPTIONS
    links = config.topic("links")
    link_records = 0

    def link_record(k: int, kind: str, **extra: Any) -> dict[str, Any]:
        rec = {"link": f"bench-s{k}", "ordinal": ordinals[k], "epoch": 0, "epoch_start": 0,
               "bits": BITS, "kind": kind, "journal_partition": None, "journal_offset": None,
               "source": None, "source_seq": None, "owner": None, "writer": 1,
               "recorded_at": T0, "snapshot": False, **extra}
        ordinals[k] += 1
        return rec

    def flush_link(k: int) -> None:
        link = f"bench-s{k}"
        _send(producer, links, codec.encode("link_batch", {"records": pending[k]}),
              link.encode(), zlib.crc32(link.encode()) % link_parts)
        pending[k] = []

    for k in range(SUBSCRIPTIONS):
        pending[k].append(link_record(k, "RESET", owner=f"s{k}@example.com"))
    for i in range(n):
        s, k = i % SOURCES, (i // SOURCES) % SUBSCRIPTIONS
        source = f"p{s}@example.com"
        seqs[s] += 1
        at = T0 + i
        pub = Publication(topic=f"t{k}", source=source,
                          content=b"<quote>" + b"x" * 190 + b"</quote>",
                          publish_type=PublishType.UPDATE, message_id=f"m{i % 500}")
        # the partition librdkafka's default partitioner (consistent_random: crc32 of the
        # key) gives the source, as the broker's journal producer would
        part = zlib.crc32(source.encode()) % journal_parts
        _send(producer, journal, codec.encode("journal_record", pub.to_avro(seqs[s], at)),
              source.encode(), part)
        offset, next_offset[part] = next_offset[part], next_offset[part] + 1
        pending[k].append(link_record(k, "DATA", journal_partition=part, journal_offset=offset,
                                      source=source, source_seq=seqs[s], recorded_at=at + 2))
        link_records += 1
        if len(pending[k]) >= PACK:
            flush_link(k)
        producer.poll(0)
    for k in range(SUBSCRIPTIONS):
        if pending[k]:
            flush_link(k)
    if producer.flush(300) != 0:
        raise RuntimeError("kafka did not take every benchmark record")
    return {"journal": n, "link_records": link_records + SUBSCRIPTIONS}


def _timed(run: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def _audit(apexps: Callable[[list[str]], int | None], argv: list[str]) -> int | None:
    """`apexps audit` in this process (its session is this one): its exit status."""
    try:
        return apexps(argv)
    except SystemExit as exc:  # argparse and some commands exit instead of returning
        return int(exc.code or 0)


class JvmCounters:
    """What the audit costs the JVM besides its rows (`--stages`): Spark jobs, stages and
    tasks it ran (the status tracker), classes Spark generated and compiled (Janino:
    CodegenMetrics), HotSpot's JIT time, and the JVM's CPU by thread kind from /proc (the
    compiler threads, GC, the executors' task threads, the rest: the driver's planning and
    py4j). Read before and after the audit; the difference is the audit's."""

    _KINDS = (("C2 compiler", "C2 Compiler"), ("C1 compiler", "C1 Compiler"),
              ("tasks", "Executor task"), ("GC", "GC Thread"), ("GC", "G1 "))

    def __init__(self, spark: Any) -> None:
        self._spark, self._jvm = spark, spark._jvm
        self._pid = int(self._jvm.java.lang.ProcessHandle.current().pid())
        self.before = self._read()

    def _threads(self) -> dict[str, float]:
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for task in Path(f"/proc/{self._pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:  # the thread ended
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick
            kind = next((k for k, prefix in self._KINDS if name.startswith(prefix)), "other")
            out[kind] = out.get(kind, 0.0) + cpu
        return out

    def _read(self) -> dict[str, float]:
        tracker = self._spark.sparkContext.statusTracker()
        jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(None)]
        stages = [tracker.getStageInfo(s) for job in jobs if job for s in job.stageIds]
        codegen = self._jvm.org.apache.spark.metrics.source.CodegenMetrics
        out = {"jobs": len(jobs),
               "stages": sum(1 for s in stages if s and s.numTasks >= 0),
               "tasks": sum(s.numCompletedTasks for s in stages if s),
               "generated classes": codegen.METRIC_COMPILATION_TIME().getCount(),
               "JIT s": self._jvm.java.lang.management.ManagementFactory
               .getCompilationMXBean().getTotalCompilationTime() / 1000}
        cpu = self._threads()
        out["JVM CPU s"] = sum(cpu.values())
        out.update({f"CPU {k} s": v for k, v in cpu.items()})
        return out

    def print(self) -> None:
        after = self._read()
        print("\nThe audit's JVM (after - before):")
        for key in sorted(set(after) | set(self.before), key=lambda k: (k.startswith("CPU"), k)):
            diff = after.get(key, 0) - self.before.get(key, 0)
            shown = f"{diff:>10,.1f}" if key.endswith(" s") else f"{diff:>10,.0f}"
            print(f"  {key:<22}{shown}")


class ActionTimer:
    """Seconds per Spark action (`--stages`): every collect/first/count/write the process runs,
    named by the apexps line that ran it, so the stage that holds an audit's time shows."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float]] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> ActionTimer:
        from pyspark.sql import DataFrame, DataFrameWriter

        frame: Any = DataFrame
        try:  # pyspark 4: the classic (non-Connect) class holds the methods
            from pyspark.sql.classic.dataframe import DataFrame as Classic

            frame = Classic
        except ImportError:
            pass
        for owner, names in ((frame, ("collect", "first", "count", "toLocalIterator")),
                             (DataFrameWriter, ("parquet", "save"))):
            for name in names:
                self._wrap(owner, name)
        return self

    def _wrap(self, owner: Any, name: str) -> None:
        import traceback

        original = getattr(owner, name)
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(timer, "_inside", False):  # first() calls collect(): time the outer
                return original(*args, **kwargs)
            frames = [f for f in traceback.extract_stack()[:-1]
                      if "/pyspark/" not in f.filename and "bench_audit" not in f.filename]
            where = (f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?")
            timer._inside = True  # type: ignore[attr-defined]
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timer._inside = False  # type: ignore[attr-defined]
                timer.rows.append((where, name, time.perf_counter() - start))

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)

    def print(self) -> None:
        total = sum(s for _, _, s in self.rows)
        print(f"\nSpark actions of the audit ({len(self.rows)}, {total:.1f} s):")
        for where, name, seconds in self.rows:
            print(f"  {seconds:8.2f} s  {name:<10} {where}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=os.environ.get("APEXPS_BOOTSTRAP"),
                    help="an existing Kafka (default: $APEXPS_BOOTSTRAP, else a throwaway one)")
    ap.add_argument("--records", type=int, default=10_000,
                    help="journal records (the issue's figure: 1000000)")
    ap.add_argument("--keep", action="store_true", help="keep the namespace's topics")
    ap.add_argument("--stages", action="store_true",
                    help="print the seconds of each Spark action the audit runs, and what it "
                         "cost the JVM (jobs, stages, generated classes, JIT, CPU by thread)")
    ap.add_argument("--namespace", metavar="NS",
                    help="audit this namespace as it is (one a --keep run left), instead of "
                         "writing a fresh one: --records must be what it holds; kept after")
    ap.add_argument("--audit-only", action="store_true",
                    help="skip the decode comparison (native against the Python UDF: a minute "
                         "at 1,000,000) for A/B runs of the audit; its session is then colder")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting of the session (A/B runs: spark.sql.codegen.*, "
                         "spark.driver.extraJavaOptions=-XX:...); repeatable")
    args = ap.parse_args(argv)
    from adapters.cli import logs

    logs.configure("warning", json=False)  # the filler's BrokerCore: only its troubles
    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from adapters.local.kafka import LocalKafka

        kafka = LocalKafka(Path(tempfile.mkdtemp(prefix="apexps-bench-")))
        bootstrap = kafka.start().bootstrap
    config = KafkaConfig(bootstrap=bootstrap,
                         namespace=args.namespace or f"bench{uuid.uuid4().hex[:8]}")
    keep = args.keep or args.namespace is not None
    try:
        if args.namespace is None:
            print(f"writing {args.records} journal records and their links ...",
                  file=sys.stderr, flush=True)
            wrote_s, written = _timed(lambda: fill(config, args.records))
            print(f"written in {wrote_s:.1f} s: {written}", file=sys.stderr, flush=True)
        print(f"namespace {config.namespace}", file=sys.stderr, flush=True)
        from adapters.cli.main import main as apexps
        from adapters.local.spark import local_session

        spark = local_session(app_name="bench-audit", master="local[2]",
                              conf={"spark.ui.showConsoleProgress": "false",
                                    **dict(c.split("=", 1) for c in args.conf)})
        journal, links = kafka_source(spark, config, "journal"), kafka_source(spark, config,
                                                                               "links")
        rows = journal.count() + links.count()  # (warms the session and the connector)
        count_s, _ = _timed(lambda: journal.count() + links.count())
        native_s = python_s = float("nan")
        if not args.audit_only:
            native_s, _ = _timed(lambda: decode_journal(journal, python_fallback=False)
                                 .write.format("noop").mode("overwrite").save())
            python_s, _ = _timed(lambda: _python_decode(journal).write.format("noop")
                                 .mode("overwrite").save())
        out = Path(tempfile.mkdtemp(prefix="apexps-bench-audit-"))
        print("auditing ...", file=sys.stderr, flush=True)
        timer = ActionTimer()
        jvm = JvmCounters(spark) if args.stages else None
        with timer if args.stages else contextlib.nullcontext():
            audit_s, code = _timed(lambda: _audit(apexps, [
                "--log-level", "warning", "audit", "--bootstrap", bootstrap,
                "--namespace", config.namespace, "--master", "local[2]", "--out", str(out)]))
        summary = json.loads((out / "summary.json").read_text())
        n = args.records
        print(f"\n{n:,} journal records, {rows - n:,} link-topic rows "
              f"({SUBSCRIPTIONS} subscriptions), Spark local[2]\n")
        print(f"{'':34}{'seconds':>9}{'journal rec/s':>15}")
        print(f"{'bare count() of both topics':34}{count_s:>9.2f}{n / count_s:>15,.0f}")
        print(f"{'apexps audit, end to end':34}{audit_s:>9.2f}{n / audit_s:>15,.0f}")
        print(f"\naudit / bare count: {count_s / audit_s:.2f}x the rate (target >= 0.5x); "
              f"audit {'within' if audit_s <= 60 else 'over'} the 60 s target")
        print(f"journal decode: native {n / native_s:,.0f} rec/s, Python UDF "
              f"{n / python_s:,.0f} rec/s ({python_s / native_s:.2f}x)")
        print(f"audit exit {code}; clean={summary.get('clean')}; counts="
              f"{ {k: v for k, v in summary.get('counts', {}).items() if v} }; report "
              f"{out / 'report.html'}")
        if jvm is not None:
            timer.print()
            jvm.print()
        if args.conf:
            print("JVM options:", spark._jvm.java.lang.management.ManagementFactory
                  .getRuntimeMXBean().getInputArguments().toString())
        print(f"load average {os.getloadavg()}")
        spark.stop()
    finally:
        if not keep:
            drop_namespace(config, wait=True, timeout_s=30)
        if kafka is not None:
            kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
