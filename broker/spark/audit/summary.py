"""What an audit amounts to: summary.json's dict and the report's series, from an `Audit`.

Everything here is an aggregate small enough for the driver (per source, per subscription, a
latency sample, the holes); the findings stay a frame for the Parquet table. The keys are the
contract with the report (adapters/audit/report.py): "clean", "empty", "note", "window",
"offsets", "counts" (every category, zeros included), "per_source", "per_subscription",
"per_link", "decisions", "generated_at".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from broker.spark.audit.findings import CATEGORIES
from broker.spark.audit.job import Audit

__all__ = ["ACK_NOTE", "LATENCY_SAMPLE", "Summary", "summarize"]

DataFrame = Any

#: How to read `per_link` (broker/spark/audit/acks.py): a figure, not a finding.
ACK_NOTE = ("acknowledged: a link's deliveries at or before the newest its subscriber answered "
            "ok in that epoch (NS.acks, written every 0.5 s: a lower bound); unacknowledged "
            "deliveries are counted, not findings")
#: Latencies handed to the report's distribution plot at most.
LATENCY_SAMPLE = 10_000
#: Buckets of the per-source continuity series across the window.
SERIES_BUCKETS = 60


@dataclass
class Summary:
    summary: dict[str, Any]
    source_series: list[tuple[str, int, int, int]]
    subscriptions: list[tuple[str, int, int, int, int]]
    latencies_ms: list[float]
    holes: list[tuple[str, int, int, int]]


def summarize(result: Audit, *, window: dict[str, str | None],
              offsets: dict[str, dict[str, list[int]]], note: str = "") -> Summary:
    """The summary and the report's series; a handful of Spark jobs over cached frames."""
    from pyspark.sql import functions as F

    counts = dict.fromkeys(CATEGORIES, 0)
    by_source: dict[str, int] = {}
    named: dict[tuple[str, str], int] = {}  # (subscription, category)
    on_link: dict[tuple[str, str, str], int] = {}  # (link, topic, category)
    for r in result.findings.groupBy("category", "source", "subscription", "link",
                                     "topic").count().collect():
        n, cat = r["count"], r["category"]
        counts[cat] += n
        if cat.startswith("source_"):
            by_source[r["source"]] = by_source.get(r["source"], 0) + n
        if r["subscription"] is not None:
            named[(r["subscription"], cat)] = named.get((r["subscription"], cat), 0) + n
        elif r["link"] is not None:
            key = (r["link"], r["topic"], cat)
            on_link[key] = on_link.get(key, 0) + n

    per_source: dict[str, dict[str, Any]] = {}
    span: list[int] = []
    for r in result.source_stats.collect():
        per_source[r["source"]] = {"first": r["first"], "last": r["last"],
                                   "messages": r["messages"], "gaps": r["gaps"],
                                   "findings": by_source.get(r["source"], 0)}
        span += [x for x in (r["first_ms"], r["last_ms"]) if x is not None]
    holes = [(r["source"], r["from_seq"], r["to_seq"], r["at_ms"])
             for r in result.holes.orderBy("at_ms").collect()]
    series = _series(result.messages, holes, span)

    # Per subscription: its pairs and what their links carried (the pairs hold both: one
    # aggregation, no join).
    pair = result.pairs
    latency = F.when(F.col("is_carried") & F.col("want"), F.col("rec_ms") - F.col("at_ms"))
    stats = {r["label"]: r for r in pair.groupBy("label").agg(
        F.sum(F.col("want").cast("int")).alias("expected"),
        F.sum(F.col("is_carried").cast("int")).alias("delivered"),
        F.sum((F.col("in_life") & F.col("selected") & ~F.col("allowed") & ~F.col("is_carried"))
              .cast("int")).alias("withheld"),
        F.percentile_approx(latency, [0.5, 0.99]).alias("p"),
        F.max(latency).alias("max")).collect()}
    sample = [float(r["ms"]) for r in pair.filter(F.col("is_carried") & F.col("want"))
              .select((F.col("rec_ms") - F.col("at_ms")).alias("ms"))
              .limit(LATENCY_SAMPLE).collect()]

    per_sub: dict[str, dict[str, Any]] = {}
    for s in result.lifetimes:
        r = stats.get(s.label)

        def n(cat: str, s: Any = s) -> int:
            return int(named.get((s.label, cat), 0) + on_link.get((s.link, s.topic, cat), 0))

        p = r["p"] if r is not None and r["p"] is not None else [None, None]
        per_sub.setdefault(s.label, {
            "subscriber": s.subscriber, "topic": s.topic, "link": s.link,
            "expected": int(r["expected"] or 0) if r else 0,
            "delivered": int(r["delivered"] or 0) if r else 0,
            "missing": n("missing"),
            "extra": n("extra") + n("decision_mismatch") + n("withheld_delivered"),
            "duplicated": n("duplicate"), "reordered": n("reorder"),
            "withheld": int(r["withheld"] or 0) if r else 0,
            "latency_ms": {"p50": p[0], "p99": p[1], "max": r["max"] if r else None}})

    folded = result.judged.agg(
        F.count("*").alias("n"),
        F.sum(((F.col("want") == F.col("is_carried")) | F.col("edge")).cast("int"))
        .alias("ok")).first()
    judged_total = int(folded["n"]) if folded else 0
    reconciled = int(folded["ok"] or 0) if folded else 0
    total = judged_total + counts["extra"]  # every extra is a delivery no pair explains
    per_link: dict[str, dict[str, Any]] = {}
    if result.acknowledged is not None:
        for r in result.acknowledged.collect():
            per_link[r["link"]] = {
                "carried": int(r["carried"]), "acknowledged": int(r["acknowledged"]),
                "acked": {str(epoch): seq for epoch, seq in sorted((r["acked"] or {}).items())}}
    notes = [note] if note else []
    notes.append(ACK_NOTE)
    summary = {
        "clean": sum(counts.values()) == 0, "empty": not per_source,
        "note": "; ".join(notes), "window": window,
        "offsets": offsets, "counts": counts, "per_source": per_source,
        "per_subscription": per_sub, "per_link": per_link,
        "decisions": {"total": total, "reconciled": reconciled,
                      "fraction": 1.0 if total == 0 else reconciled / total},
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return Summary(summary, series,
                   [(label, e["expected"], e["delivered"], e["missing"], e["extra"])
                    for label, e in sorted(per_sub.items())], sample, holes)


def _series(messages: DataFrame, holes: list[tuple[str, int, int, int]], span: list[int],
            ) -> list[tuple[str, int, int, int]]:
    """(source, bucket_start_ms, messages, holes) over SERIES_BUCKETS buckets of the window."""
    from pyspark.sql import functions as F

    if not span:
        return []
    lo, hi = min(span), max(span)
    width = max(1, math.ceil((hi - lo + 1) / SERIES_BUCKETS))
    counts: dict[tuple[str, int], list[int]] = {}
    bucket = (F.floor((F.col("at_ms") - lo) / width) * width + lo).cast("bigint")
    for r in messages.groupBy("source", bucket.alias("b")).count().collect():
        counts.setdefault((r["source"], r["b"]), [0, 0])[0] = r["count"]
    for source, _, _, at in holes:
        if at is not None:
            b = lo + max(0, (at - lo)) // width * width
            counts.setdefault((source, b), [0, 0])[1] += 1
    return sorted((s, b, m, h) for (s, b), (m, h) in counts.items())
