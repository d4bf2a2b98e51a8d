"""Per link: what the link log says each link carried, and the faults visible in the log alone.

Theory of operation
-------------------
A link record's link seq follows from its ordinal, its epoch's start ordinal and its resolution
(broker/robust/links.py, linkseq.py): 0 for the epoch's RESET, then 1, 2, ... wrapping after
2**bits - 1 to 1. The *log order* of a link is its records' order in its links partition
(Kafka offset, then place in the pack): the order the broker appended, and sent, them.

Evidence of delivery is a DATA record that is not a snapshot copy (a snapshot replays item
state on subscribe, robust-binding §9; it is not the live delivery of a message). HEARTBEATs
and RESETs carry no message.

Faults the log shows by itself:
- `duplicate`: a record repeated verbatim (same link, ordinal and writer: a producer never
  writes one record twice), or one message (source, source seq) carried twice in one epoch.
  A new epoch (a RESET: a source repair's catch-up, a reset after a failed append) may carry
  again what the previous one did — the subscriber asked for it — so across epochs a message
  may recur. Two records of one ordinal from different writers are the log's known kill -9
  case (a dead writer's last produce landing after the new writer's recovery): the newer
  writer's is the one `read_range` serves, and the audit keeps it, as the log does.
- `reorder`: in log order within an epoch, a record whose ordinal is below one already seen,
  or a message whose source seq is below one the link already carried of that source.
"""

from __future__ import annotations

from typing import Any

from broker.spark.audit.findings import as_findings, millis

__all__ = ["deliveries", "link_findings", "link_records", "link_seq", "live_delivery"]

DataFrame = Any  # pyspark.sql.DataFrame
Column = Any

_LOG_ORDER = ("kafka_partition", "kafka_offset", "pack_index")


def link_seq(ordinal: Column, epoch_start: Column, bits: Column) -> Column:
    """The link seq of `ordinal` (broker.robust.linkseq.LinkSeqSpace.add(0, ordinal - start)):
    at 64 bits no link lives long enough to wrap, and 2**64 - 1 does not fit a long."""
    from pyspark.sql import functions as F

    steps = ordinal - epoch_start
    maximum = F.pow(F.lit(2), F.least(bits, F.lit(62))).cast("bigint") - 1
    return (F.when(steps == 0, F.lit(0).cast("bigint"))
            .when(bits >= 63, steps)
            .otherwise(F.pmod(steps - 1, maximum) + 1))


def link_records(links: DataFrame) -> DataFrame:
    """Decoded link records with `link_seq`, `rec_ms` and `copies` (how many verbatim copies
    of the record the log holds), one row per distinct record, the newer writer's where two
    writers share an ordinal.

    Every window here and in link_findings is partitioned by the link first: a link log
    already partitioned by `link` (the audit's job does it once) is sorted, never shuffled
    again, by each."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ok = links.filter(F.col("decode_error").isNull() & F.col("link").isNotNull())
    # One spec for both: the copies of a record (whole frame) and the first of them.
    first = Window.partitionBy("link", "ordinal", "writer").orderBy(*_LOG_ORDER)
    counted = (ok.withColumn("copies", F.count("*").over(
        first.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)))
        .withColumn("_copy", F.row_number().over(first))
        .filter(F.col("_copy") == 1))
    # (by (link, ordinal): the order above already serves it, no sort of its own)
    newest = F.max("writer").over(Window.partitionBy("link", "ordinal"))
    return (counted.withColumn("_writer", newest)
            .filter(F.col("writer").eqNullSafe(F.col("_writer")))
            .drop("_copy", "_writer")
            .withColumn("link_seq", link_seq(F.col("ordinal"), F.col("epoch_start"),
                                             F.col("bits")))
            .withColumn("rec_ms", millis("recorded_at")))


def live_delivery() -> Column:
    """True for a record that is evidence of delivery: live DATA (see the module doc)."""
    from pyspark.sql import functions as F

    return (F.col("kind") == "DATA") & ~F.coalesce(F.col("snapshot"), F.lit(False))


def deliveries(records: DataFrame) -> DataFrame:
    """The records that are evidence of delivery: live DATA (see the module doc)."""
    return records.filter(live_delivery())


def link_findings(records: DataFrame) -> DataFrame:
    """`duplicate` and `reorder` findings of the log alone, in one pass over `records`
    (link_records): three windows, each partitioned by the link and sorted in its partition."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    common = {"link": "link", "link_seq": "link_seq", "source": "source",
              "source_seq": "source_seq", "journal_partition": "journal_partition",
              "journal_offset": "journal_offset", "at_ms": "rec_ms"}
    live = live_delivery()
    # Per message in an epoch, the deliveries so far: the n-th carriage and the first's seq.
    carried = (Window.partitionBy("link", "epoch", "source", "source_seq").orderBy(*_LOG_ORDER)
               .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    flagged = (records.withColumn("_live", live)
               .withColumn("_n", F.sum(F.col("_live").cast("int")).over(carried))
               .withColumn("_first", F.first(F.when(F.col("_live"), F.col("link_seq")),
                                             ignorenulls=True).over(carried)))
    # The ordinal check runs over every record of the epoch, the seq check over each message's
    # first delivery; a record both flag is one finding.
    before = Window.unboundedPreceding, -1
    in_log = Window.partitionBy("link", "epoch").orderBy(*_LOG_ORDER).rowsBetween(*before)
    per_source = (Window.partitionBy("link", "epoch", "source").orderBy(*_LOG_ORDER)
                  .rowsBetween(*before))
    once = F.col("_live") & (F.col("_n") == 1)
    flagged = (flagged.withColumn("_top", F.max("ordinal").over(in_log))
               .withColumn("_top_seq", F.max(F.when(once, F.col("source_seq")))
                           .over(per_source)))
    # A record may be two findings (copied verbatim, and late): each is a row of its own.
    # One exploded frame rather than a union of three filters, which would each run the
    # windows again.
    twice = F.col("_live") & (F.col("_n") > 1)
    late = once & ((F.col("source_seq") < F.col("_top_seq")) | (F.col("ordinal") < F.col("_top")))
    kinds = F.filter(F.array(F.when(F.col("copies") > 1, F.lit("verbatim")),
                             F.when(twice, F.lit("twice")), F.when(late, F.lit("late"))),
                     lambda k: k.isNotNull())
    found = (flagged.filter((F.col("copies") > 1) | twice | late)
             .withColumn("_kind", F.explode(kinds)))
    kind = F.col("_kind")
    return as_findings(
        found, F.when(kind == "late", F.lit("reorder")).otherwise(F.lit("duplicate")), **common,
        detail=F.when(kind == "verbatim", F.format_string(
            "link record (ordinal %d, writer %d) written %d times", "ordinal", "writer",
            "copies"))
        .when(kind == "twice", F.format_string(
            "source seq %d carried again in epoch %d (first as link seq %d)", "source_seq",
            "epoch", "_first"))
        .when(F.col("source_seq") < F.col("_top_seq"), F.format_string(
            "source seq %d carried after source seq %d in epoch %d", "source_seq", "_top_seq",
            "epoch"))
        .otherwise(F.format_string(
            "link seq %d logged after a later one (ordinal %d after %d)", "link_seq",
            "ordinal", "_top")))
