"""The reconciliation as one function: decoded frames in, findings and the frames behind them out.

`audit(spark, inputs, options)` is pure in the Spark sense: it reads nothing and writes
nothing; the launcher (adapters/cli/audit_cmd.py) reads Kafka into `AuditInputs`, and writes
what `Audit` holds (findings Parquet, summary.json, the report). Only the registries are
collected on the way (broker/spark/audit/registry.py says why they may be).

Order of work: the journal's decode errors and per-source checks (sources.py); the link log's
records, deliveries and log-only faults (links.py); the registries' lifetimes and token
verdicts (registry.py); the decision replay (decisions.py). `--topic` narrows the messages and
the subscriptions; `--subscriber` the subscriptions and the links they travel on.

Cost. Every stage reads the journal and the link log, and a decoded frame is a plan, not data:
left as it comes, each stage's action would decode the Kafka rows again (the spark-avro CASE
and the Python fallback's pass over every row), and carry each record's content through the
shuffles. So each is decoded once and persisted (memory, spilling to disk): the journal
projected to the columns the stages read, its content reduced to the digest the duplicate check
compares (the fields a selector needs are extracted before, and only when one does).

Each kept frame is partitioned, once, the way the checks over it group their rows, so that
they sort within partitions and shuffle nothing more: the link log by link (every link check
is a window partitioned by the link first, links.py), the journal's ranges by source (every
source check, sources.py), the pairs and the deliveries by (link, source, source seq), the key
judge and the extras join them on and the summary reads them by. Within a partition, the
per-source checks sort the journal's ranges twice, in seq order and in log order, and every
other per-source question is a window that reads one of those sorts (sources.source_checks);
only their few flagged rows are kept. The registries' few rows go to every task (broadcast).
A kept frame is planned with adaptive execution off (`audit`), or it would no longer say how
it is partitioned and every query over it would shuffle it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.spark.audit import acks, decisions, links, registry, sources
from broker.spark.audit.findings import as_findings, millis
from broker.spark.audit.sources import DIGEST

__all__ = ["DEFAULT_EDGE_MS", "Audit", "AuditInputs", "AuditOptions", "audit", "keep_journal",
           "subscription_lifetimes"]

DataFrame = Any  # pyspark.sql.DataFrame
SparkSession = Any

#: The edge of a decision (decisions.py): how long after a message's append, or a registry
#: change, the live broker may still decide on the state before it. The fan-out follows the
#: journal within milliseconds when healthy; a restarted broker re-follows from its fan-out
#: marks, seconds later. Five seconds covers both without blurring a whole window.
DEFAULT_EDGE_MS = 5_000

#: The journal's columns the audit reads (`content` only as a digest: sources.py).
_JOURNAL_KEEP = ("kafka_partition", "kafka_offset", "kafka_timestamp", "kind", "topic",
                 "source", "source_seq", "publisher_seq", "gap_to", "permission_token",
                 "expiration_date", "fields", "appended_at", "decode_error")


@dataclass(frozen=True)
class AuditInputs:
    """Decoded frames (broker/spark/journal_reader.py, readers.py). `journal` as decoded, or
    already kept (keep_journal: the launcher keeps it as it reads, to learn the window's extent
    from the kept rows rather than from a second copy of the Kafka rows)."""

    journal: DataFrame
    links: DataFrame
    subscriptions: DataFrame
    access: DataFrame
    #: what subscribers acknowledged (readers.load_acks; None: no log to read)
    acks: DataFrame | None = None
    #: subscription_lifetimes(subscriptions, options), when the launcher has them already
    lifetimes: list[registry.Lifetime] | None = None


@dataclass(frozen=True)
class AuditOptions:
    topic: str | None = None
    subscriber: str | None = None
    #: journal partitions the window reads from their first record (offset 0): their sources
    #: must begin at seq 1 (sources.py)
    from_start: tuple[int, ...] = ()
    #: the window is every retained record of every topic (a delivery of a source the journal
    #: never held is then extra)
    whole: bool = False
    edge_ms: int = DEFAULT_EDGE_MS


@dataclass
class Audit:
    findings: DataFrame
    #: per source: source, first, last, messages, gaps
    source_stats: DataFrame
    #: source, from_seq, to_seq, at_ms, ...
    holes: DataFrame
    #: the journal DATA messages judged (after --topic): source, source_seq, topic, at_ms, ...
    messages: DataFrame
    #: one row per (message, subscription) decision (decisions.pairs), with what its link
    #: carried (decisions.carry)
    pairs: DataFrame
    #: per (link, message) (decisions.judge)
    judged: DataFrame
    #: deliveries with no pair (extra findings' rows)
    unpaired: DataFrame
    lifetimes: list[registry.Lifetime] = field(default_factory=list)
    #: per link: carried, acknowledged, acked (epoch -> link seq) (acks.acknowledgements)
    acknowledged: DataFrame | None = None


def subscription_lifetimes(subscriptions: DataFrame, options: AuditOptions,
                           ) -> list[registry.Lifetime]:
    """The lifetimes the audit judges (after --topic and --subscriber), from the registry's
    few rows collected on the driver."""
    lifetimes = registry.lifetimes(_subscription_rows(subscriptions))
    if options.topic is not None:
        lifetimes = [s for s in lifetimes if s.topic == options.topic]
    if options.subscriber is not None:
        lifetimes = [s for s in lifetimes if s.subscriber == options.subscriber]
    return lifetimes


def keep_journal(journal: DataFrame, lifetimes: list[registry.Lifetime]) -> DataFrame:
    """The journal as every stage reads it: the columns they use, `content` replaced by its
    digest, fields extracted where a selector of `lifetimes` needs them (a Python pass: only
    then), kept. Lazy: the first action over it decodes and keeps it."""
    from broker.spark.audit.sources import content_digest

    if decisions.selector_keys(lifetimes):
        from broker.spark.fields import ensure_fields

        journal = ensure_fields(journal)
    return _keep(journal.select(*_JOURNAL_KEEP, content_digest().alias(DIGEST)))


def _keep(df: DataFrame) -> DataFrame:
    """`df` persisted where every later stage finds it (memory, spilling to disk)."""
    from pyspark import StorageLevel

    return df.persist(StorageLevel.MEMORY_AND_DISK)


def _messages(journal: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return journal.filter(F.col("decode_error").isNull() & (F.col("kind") == "DATA")).select(
        "source", "source_seq", "topic", "permission_token", "expiration_date", "fields",
        millis("appended_at").alias("at_ms"), "kafka_partition", "kafka_offset")


def _decode_errors(frames: dict[str, DataFrame]) -> DataFrame:
    from pyspark.sql import functions as F

    out: DataFrame = None
    for role, df in frames.items():
        bad = df.filter(F.col("decode_error").isNotNull())
        one = as_findings(
            bad, "decode_error",
            journal_partition="kafka_partition" if role == "journal" else None,
            journal_offset="kafka_offset" if role == "journal" else None,
            at_ms=millis("kafka_timestamp"),
            detail=F.format_string(f"{role} partition %d offset %d: %s", "kafka_partition",
                                   "kafka_offset", "decode_error"))
        out = one if out is None else out.unionByName(one)
    return out.dropDuplicates()  # a pack that fails is one row per pack already


def _subscription_rows(subscriptions: DataFrame) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    rows = subscriptions.filter(F.col("decode_error").isNull()).select(
        "kafka_partition", "kafka_offset", millis("kafka_timestamp").alias("kafka_timestamp"),
        "kafka_key", "deleted", "subscriber", "subscription_id", "topic", "state",
        millis("created_at").alias("created_at"), millis("expires_at").alias("expires_at"),
        "selector_class", "selector", "link_id").collect()
    return [r.asDict() for r in rows]


def _access_rows(access: DataFrame) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    rows = access.filter(F.col("decode_error").isNull()).select(
        "kafka_partition", "kafka_offset", millis("kafka_timestamp").alias("kafka_timestamp"),
        "kafka_key", "deleted", "entry_id", "originator", "tokens", "topic", "effect",
        millis("created_at").alias("created_at"), "kind").collect()
    return [r.asDict() for r in rows]


#: Off while the audit plans its kept frames (a frame is planned when it is kept): planned
#: adaptively, a kept frame no longer says how it is partitioned, so every later window,
#: aggregate and join over it would shuffle its rows again, although they were partitioned for
#: it once. (Spark's canChangeCachedPlanOutputPartitioning=false does not do it in 4.0.) The
#: queries over the kept frames are still planned adaptively, and so is the findings table,
#: kept after: nothing groups it again but the summary's few rows, and adaptively its lookups
#: of the journal's messages (the link log's faults' topics, the extras) see at run time that
#: the faults are few (none, when clean) and skip the sort of every message a planned
#: sort-merge join costs.
_KEEP_PARTITIONING = "spark.sql.adaptive.enabled"


def audit(spark: SparkSession, inputs: AuditInputs, options: AuditOptions) -> Audit:
    """The reconciliation (see the package doc); nothing runs until a result is read."""
    before = spark.conf.get(_KEEP_PARTITIONING, None)
    spark.conf.set(_KEEP_PARTITIONING, "false")
    try:
        result = _audit(spark, inputs, options)
    finally:
        if before is None:
            spark.conf.unset(_KEEP_PARTITIONING)
        else:
            spark.conf.set(_KEEP_PARTITIONING, before)
    result.findings = result.findings.cache()
    return result


def _audit(spark: SparkSession, inputs: AuditInputs, options: AuditOptions) -> Audit:
    from pyspark.sql import functions as F

    # The registries, on the driver (first: whether any subscription selects decides
    # whether the journal needs its fields extracted).
    lifetimes = (subscription_lifetimes(inputs.subscriptions, options)
                 if inputs.lifetimes is None else inputs.lifetimes)
    keys = decisions.selector_keys(lifetimes)
    subs = spark.createDataFrame(
        [(s.label, s.subscriber, s.topic, s.link,
          keys.get((s.selector_class or "JMS", s.selector)) if s.selector else None,
          s.start_ms, s.visible_ms, s.end_ms) for s in lifetimes],
        "label string, subscriber string, topic string, link string, sel_key int, "
        "start_ms bigint, visible_ms bigint, end_ms bigint")

    # Each input decoded once, projected and kept (see the module doc).
    journal = (inputs.journal if DIGEST in inputs.journal.columns
               else keep_journal(inputs.journal, lifetimes))
    # The link log partitioned by link before it is kept: every link check (links.py) and the
    # deliveries' aggregation below then sort within partitions and shuffle nothing.
    link_log = _keep(inputs.links.repartition("link"))

    # Per source: with --topic, the sources that published on it, all their records (a
    # source's seqs run across its topics, and a hole has no topic).
    ranges = sources.covered_ranges(journal)
    if options.topic is not None:
        ranges = ranges.join(ranges.filter(F.col("topic") == options.topic).select("source"),
                             "source", "left_semi")
    # (by source, once: every per-source check is a window or an aggregate by source)
    ranges = ranges.repartition("source").cache()
    # Every per-source window in one pass, its few flagged rows kept: the holes and the
    # findings are read from them, not windowed again.
    checked = sources.source_checks(ranges, options.from_start).cache()
    holes = sources.source_holes(checked).cache()
    stats = sources.source_stats(ranges).cache()
    found = [sources.source_findings(ranges, checked)]

    all_messages = _messages(journal)
    messages = (all_messages if options.topic is None
                else all_messages.filter(F.col("topic") == options.topic)).cache()
    tokened, any_dated = decisions.tokens_and_dates(messages)
    needed = {(s.subscriber, topic, token) for s in lifetimes for topic, token in tokened
              if s.topic == topic}
    ents = spark.createDataFrame(
        registry.entitlement_intervals(_access_rows(inputs.access), needed),
        "subscriber string, topic string, token string, from_ms bigint, to_ms bigint, "
        "allowed boolean")

    # The link log.
    records = links.link_records(link_log)
    if options.subscriber is not None:
        records = records.filter(F.col("link").isin(sorted({s.link for s in lifetimes})))
    records = records.cache()
    # Each delivered (link, message) once, keyed as the pairs are: judge, the extras and the
    # summary join on that key without shuffling either side again.
    carried = decisions.delivered(links.deliveries(records)).repartition(
        *decisions.PAIR_KEY).cache()
    # Log faults of messages the window holds (the link log is read past it), named with
    # their message's topic.
    log_faults = links.link_findings(records).drop("topic").join(
        all_messages.select("source", "source_seq", "topic"), ["source", "source_seq"])
    if options.topic is not None:
        log_faults = log_faults.filter(F.col("topic") == options.topic)
    found.append(log_faults.select(*found[0].columns))

    # The decisions.
    pair_rows = decisions.carry(decisions.pairs(messages, subs, ents, keys, options.edge_ms,
                                                any_dated=any_dated)
                                .repartition(*decisions.PAIR_KEY), carried).cache()
    judged = decisions.judge(pair_rows, [(s.label, s.subscriber) for s in lifetimes]).cache()
    found.append(decisions.pair_findings(judged))
    covered = stats.join(holes.groupBy("source").agg(
        F.collect_list(F.struct("from_seq", "to_seq")).alias("holes")), "source", "left")
    unpaired = decisions.unpaired_deliveries(carried, all_messages, judged, covered,
                                             whole=options.whole, topic=options.topic)
    found.append(unpaired)
    found.append(_decode_errors({"journal": journal, "links": link_log,
                                 "subscriptions": inputs.subscriptions,
                                 "access": inputs.access}))

    findings = found[0]
    for more in found[1:]:
        findings = findings.unionByName(more)
    return Audit(findings=findings, source_stats=stats, holes=holes,
                 messages=messages, pairs=pair_rows, judged=judged, unpaired=unpaired,
                 lifetimes=lifetimes,
                 acknowledged=acks.acknowledgements(records, inputs.acks))
