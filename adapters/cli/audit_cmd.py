"""`apexps audit`: reconcile the journal and the link log over a window, and say what is wrong.

    apexps audit [--from T] [--to T] [--topic T] [--subscriber E] [--message SOURCE:SEQ]
                 --out DIR [--bootstrap H:P] [--namespace NS] [--master URL] [--margin S]

Reads apexps's Kafka topics with Spark (`local[2]`, or `--master URL`), runs the reconciliation
(broker/spark/audit/), and writes to DIR: `findings/` (Parquet, one row per finding),
`summary.json`, `report.html` (adapters/audit/report.py) and, with `--message`, `message.json`
(the table it prints). Exit 0 when the audit is clean, 1 with findings, 2 for bad usage, 3 when
Kafka or Spark cannot be reached.

The window. `--from`/`--to` bound the journal (earliest, latest, Spark's offsets JSON, or an ISO
time: broker/spark/source.py). A message appended just before `--to` may be sent a little
after it, so the link log is read from a second before the window's first record to `--margin`
seconds past its last (to its end when `--to` is not given): a delivery later than that is
reported missing. The registries (subscriptions, access) are read whole: they are the history
the decisions replay. docs/audit.md has the rules.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

from adapters.cli.paths import default_data_dir, kafka_bootstrap
from broker.kafka_io import KafkaConfig, answers, existing_topics
from broker.spark.audit.job import DEFAULT_EDGE_MS
from common.errors import KafkaNotFound

__all__ = ["register"]

log = structlog.get_logger("apexps.audit")

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
#: How far past the window's last record the link log is read by default (seconds).
DEFAULT_MARGIN_S = 60.0
#: How far before the window's first record (clock skew between the broker's producers).
_SKEW = timedelta(seconds=1)
_ROLES = ("journal", "links", "subscriptions", "access", "topics", "acks")


class _Progress:
    """Stages and rows read: one rewritten line on a terminal, log lines otherwise."""

    def __init__(self, stages: int) -> None:
        self._tty, self._n, self._i, self._t0 = sys.stderr.isatty(), stages, 0, time.monotonic()

    def stage(self, name: str, **counts: Any) -> None:
        self._i += 1
        if self._tty:
            extra = "".join(f" {k}={v}" for k, v in counts.items())
            print(f"\r\x1b[2Kaudit [{self._i}/{self._n}] {name}{extra} "
                  f"({time.monotonic() - self._t0:.1f}s)", end="", file=sys.stderr, flush=True)
        else:
            log.info("audit stage", stage=name, step=self._i, of=self._n, **counts)

    def done(self) -> None:
        if self._tty:
            print(file=sys.stderr)


def _fail(text: str, code: int) -> int:
    print(f"apexps audit: {text}", file=sys.stderr)
    return code




def _existing(config: KafkaConfig) -> set[str]:
    topics = existing_topics(config)
    return {role for role in _ROLES if config.topic(role) in topics}


def _usage(args: argparse.Namespace) -> tuple[Any, Any, tuple[str, int] | None]:
    from broker.spark.audit.message import parse_message
    from broker.spark.source import parse_bound

    start = None if args.start is None else parse_bound(args.start)
    end = None if args.end is None else parse_bound(args.end)
    message = None if args.message is None else parse_message(args.message)
    if args.margin < 0:
        raise ValueError(f"--margin {args.margin} is negative")
    if args.edge_ms < 0:
        raise ValueError(f"--edge-ms {args.edge_ms} is negative")
    return start, end, message


def _run(args: argparse.Namespace) -> int:
    try:
        start, end, message = _usage(args)
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE)
    try:
        config = KafkaConfig(bootstrap=kafka_bootstrap(args.bootstrap, args.data_dir),
                             namespace=args.namespace)
    except KafkaNotFound as exc:
        return _fail(str(exc), EXIT_UNREACHABLE)
    if not answers(config.bootstrap, timeout_s=10.0):
        return _fail(f"no Kafka answers at {config.bootstrap}; check --bootstrap",
                     EXIT_UNREACHABLE)
    try:
        from adapters.local.spark import local_session

        spark = local_session(app_name="apexps-audit", master=args.master,
                              conf={"spark.ui.showConsoleProgress": "false"})
    except Exception as exc:  # Py4J/JVM start failures have no common type
        return _fail(f"cannot start Spark at {args.master}: {str(exc).splitlines()[0]}",
                     EXIT_UNREACHABLE)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return _audit(spark, config, args, (start, end), message=message, out=out)


def _empty(spark: Any, role: str) -> Any:
    from broker.spark.journal_reader import decode_journal
    from broker.spark.readers import decode_links, decode_registry

    raw = spark.createDataFrame([], "key binary, value binary, topic string, partition int, "
                                    "offset bigint, timestamp timestamp, timestampType int")
    if role == "journal":
        return decode_journal(raw)
    if role == "links":
        return decode_links(raw)
    return decode_registry(raw, role)


def _spread(spark: Any, raw: Any) -> Any:
    """The link log's Kafka rows spread over every core before they are decoded: the broker
    writes a link's packs to one partition, so a handful of links decode, and explode, on one
    core each; hashed by (partition, offset) every task gets its share. Decoding keeps each
    record's partition, offset and place in its pack, which is all the log order needs."""
    from pyspark.sql import functions as F

    slices = 2 * spark.sparkContext.defaultParallelism
    return raw.repartition(slices, F.hash("partition", "offset"))


def _audit(spark: Any, config: KafkaConfig, args: argparse.Namespace, bounds: tuple[Any, Any],
           *, message: tuple[str, int] | None, out: Path) -> int:
    from pyspark.sql import functions as F

    from broker.spark.audit import AuditInputs, AuditOptions, audit
    from broker.spark.audit.job import subscription_lifetimes
    from broker.spark.audit.message import who_could_see
    from broker.spark.audit.summary import summarize
    from broker.spark.avro_decode import needs_python
    from broker.spark.readers import DECODED_SCHEMAS, decode_links, decode_registry
    from broker.spark.source import kafka_source

    start, end = bounds
    progress = _Progress(6)
    present = _existing(config)

    def read(role: str, **window: Any) -> tuple[Any, Any]:
        if role not in present:
            return None, _empty(spark, role)
        raw = kafka_source(spark, config, role, **window).cache()
        # The Python fallback's pass over every row buys nothing where no record needs it:
        # asked once of the cached rows, in SQL (broker/spark/avro_decode.py).
        python = needs_python(raw, DECODED_SCHEMAS[role])
        if role == "links":
            raw = _spread(spark, raw)
        decoded = (decode_links(raw, python_fallback=python) if role == "links"
                   else decode_registry(raw, role, python_fallback=python))
        return raw, decoded

    # The registries first: the subscriptions say whether the journal needs its fields.
    _, subscriptions = read("subscriptions")
    _, access = read("access")
    _, topics = read("topics")
    _, acks = read("acks")
    whole = start in (None, "earliest") and end in (None, "latest")
    options = AuditOptions(topic=args.topic, subscriber=args.subscriber, whole=whole,
                           edge_ms=args.edge_ms)
    lifetimes = subscription_lifetimes(subscriptions, options)
    journal = _journal(spark, config, "journal" in present, (start, end), lifetimes)
    offsets: dict[str, dict[str, list[int]]] = {}
    first_offsets: dict[int, int] = {}
    span: list[int] = []
    for r in _extent(journal, "kafka_partition", "kafka_offset", "kafka_timestamp"):
        offsets.setdefault(config.topic("journal"), {})[str(r["partition"])] = [
            r["lo"], r["hi"] + 1]
        first_offsets[r["partition"]] = r["lo"]
        span += [r["first_ms"], r["last_ms"]]
    rows = sum(hi - lo for p in offsets.values() for lo, hi in p.values())
    progress.stage("journal read", rows=rows)

    link_start = link_end = None
    if span:
        link_start = datetime.fromtimestamp(min(span) / 1000, UTC) - _SKEW
        if end is not None and end != "latest":
            link_end = (datetime.fromtimestamp(max(span) / 1000, UTC)
                        + timedelta(seconds=args.margin))
    raw_links, links = read("links", start=link_start, end=link_end)
    if raw_links is not None and span:
        for r in _extent(raw_links, "partition", "offset", "timestamp"):
            offsets.setdefault(config.topic("links"), {})[str(r["partition"])] = [
                r["lo"], r["hi"] + 1]
    progress.stage("link log read", rows=sum(
        hi - lo for lo, hi in offsets.get(config.topic("links"), {}).values()))
    progress.stage("registries read")

    note = ""
    known_topics = {r["kafka_key"] for r in topics.filter(~F.col("deleted")).select(
        "kafka_key").collect()}
    if not offsets.get(config.topic("journal")):
        note = "no records in the window"
    if args.topic is not None and args.topic not in known_topics:
        note = f"unknown topic {args.topic}"
    options = replace(options, from_start=tuple(p for p, lo in first_offsets.items() if lo == 0))
    result = audit(spark, AuditInputs(journal, links, subscriptions, access, acks,
                                      lifetimes=lifetimes), options)
    progress.stage("reconciled")

    result.findings.orderBy("category", "source", "source_seq", "link", "link_seq") \
        .coalesce(1).write.mode("overwrite").parquet(str(out / "findings"))
    window = {"from": _iso(start), "to": _iso(end)}
    summed = summarize(result, window=window, offsets=offsets, note=note)
    (out / "summary.json").write_text(json.dumps(summed.summary, indent=2, sort_keys=True)
                                      + "\n")
    progress.stage("findings written", findings=sum(summed.summary["counts"].values()))
    _report(out, summed)
    if message is not None:
        table = who_could_see(result, *message)
        (out / "message.json").write_text(json.dumps(
            {"source": message[0], "source_seq": message[1], "rows": table}, indent=2) + "\n")
        progress.done()
        _print_table(message, table)
    progress.stage("report written")
    progress.done()
    counts = {k: v for k, v in summed.summary["counts"].items() if v}
    log.info("audit done", clean=summed.summary["clean"], out=str(out), **counts)
    return EXIT_CLEAN if summed.summary["clean"] else EXIT_FINDINGS


def _journal(spark: Any, config: KafkaConfig, present: bool, bounds: tuple[Any, Any],
             lifetimes: list[Any]) -> Any:
    """The window's journal decoded once and kept (job.keep_journal), straight from Kafka: no
    copy of its Kafka rows is kept beside it. The Python fallback decodes only a record whose
    schema fingerprint the JVM does not know; the kept rows say whether there is one (in SQL),
    and only then is the window read and decoded again with it."""
    from broker.spark.audit.job import keep_journal
    from broker.spark.avro_decode import left_to_python
    from broker.spark.journal_reader import decode_journal
    from broker.spark.source import kafka_source

    if not present:
        return keep_journal(_empty(spark, "journal"), lifetimes)
    start, end = bounds
    journal = keep_journal(decode_journal(kafka_source(spark, config, "journal", start=start,
                                                       end=end), python_fallback=False),
                           lifetimes)
    if left_to_python(journal):
        journal.unpersist()
        journal = keep_journal(decode_journal(kafka_source(
            spark, config, "journal", start=start, end=end), python_fallback=True), lifetimes)
    return journal


def _extent(frame: Any, partition: str, offset: str, timestamp: str) -> list[Any]:
    """Per Kafka partition of a frame (raw, or decoded with the Kafka coordinates under other
    names): first and last offset, first and last timestamp."""
    from pyspark.sql import functions as F

    rows: list[Any] = frame.groupBy(F.col(partition).alias("partition")).agg(
        F.min(offset).alias("lo"), F.max(offset).alias("hi"),
        F.unix_millis(F.min(timestamp)).alias("first_ms"),
        F.unix_millis(F.max(timestamp)).alias("last_ms")).collect()
    return rows


def _iso(bound: Any) -> str | None:
    if bound is None:
        return None
    if isinstance(bound, datetime):
        aware = bound if bound.tzinfo else bound.replace(tzinfo=UTC)
        return aware.isoformat()
    return str(bound) if isinstance(bound, str) else json.dumps(dict(bound))


def _report(out: Path, summed: Any) -> None:
    try:
        from adapters.audit.report import (  # type: ignore[import-not-found,unused-ignore]
            ReportData,
            write_report,
        )
    except ImportError:  # the report module is another step's; the data is all here
        log.warning("report.html not written: this build has no adapters.audit.report")
        return
    write_report(out, ReportData(summary=summed.summary, source_series=summed.source_series,
                                 subscriptions=summed.subscriptions,
                                 latencies_ms=summed.latencies_ms, holes=summed.holes))


def _print_table(message: tuple[str, int], rows: list[dict[str, Any]]) -> None:
    from broker.spark.audit.message import MESSAGE_COLUMNS

    print(f"message {message[0]}:{message[1]}")
    if not rows:
        print("  not in the window, or no subscription to its topic")
        return
    cells = [[("" if r[c] is None else str(r[c])) for c in MESSAGE_COLUMNS] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(MESSAGE_COLUMNS)]
    print("  ".join(c.ljust(w) for c, w in zip(MESSAGE_COLUMNS, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="reconcile the journal and the link log over a window",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="start", metavar="WHEN",
                   help="window start: earliest (default), latest, offsets JSON or ISO time")
    p.add_argument("--to", dest="end", metavar="WHEN",
                   help="window end: latest (default), offsets JSON or ISO time")
    p.add_argument("--topic", metavar="TOPIC", help="audit this topic's messages only")
    p.add_argument("--subscriber", metavar="ENDPOINT",
                   help="audit this subscriber's subscriptions only")
    p.add_argument("--message", metavar="SOURCE:SEQ",
                   help="also list who was entitled to this message and whether their link "
                        "carried it (printed, and written to DIR/message.json)")
    p.add_argument("--out", required=True, metavar="DIR", help="where the results go")
    p.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT…]",
                   help="Kafka bootstrap servers (default: the local Kafka of --data-dir)")
    p.add_argument("--namespace", default="apexps", metavar="NS",
                   help="prefix of the broker's Kafka topics (default: %(default)s)")
    p.add_argument("--data-dir", default=str(default_data_dir()), metavar="DIR",
                   help="where `apexps up` keeps the local Kafka (default: %(default)s)")
    p.add_argument("--master", default="local[2]", metavar="URL",
                   help="Spark master (default: %(default)s; spark://HOST:PORT for a cluster)")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN_S, metavar="SECONDS",
                   help="read the link log this long past the window's last record "
                        "(default: %(default)s)")
    p.add_argument("--edge-ms", type=int, default=DEFAULT_EDGE_MS, metavar="MS",
                   help="how long after a message's append, or a registry change, the broker "
                        "may still decide on the state before it: either outcome reconciles "
                        "(default: %(default)s; docs/audit.md)")
    p.set_defaults(func=_run)
