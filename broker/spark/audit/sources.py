"""Per source: every source seq of the window accounted for, none twice, in order.

Theory of operation
-------------------
Invariant 2: a source's seqs rise strictly, and any missing number is explained by an explicit
GAP record (`[source_seq, gap_to]`). So each journal record of a source *covers* a range: a
DATA record its one seq, a GAP record its whole range. Sorted by the start of that range, a
running maximum of the ends says how far the source is accounted for; a record starting more
than one past it opens a *hole* (`source_hole`, one finding per hole, from the first missing
seq to the last).

Where the count starts. A window that begins at the start of a journal partition (the read began
at `earliest` and that partition's first offset is 0: retention has removed nothing) must start
every source of the partition at seq 1, so a lost first message is a hole. Any other window
starts a source at the first seq it holds of it: the source checkpoint (`NS.sources`) is the
newest position only, not the seq before an instant, so a hole right at a window's start cannot
be told from the window alone — audit from `earliest` to prove a source's beginning.

Duplicates (`source_duplicate`): one source seq journaled more than once (the detail says
whether the copies' content is the same), or one publication journaled twice under two seqs —
same publisher seq and same content (the publish gate answers a publisher's resend from its
ledger; a second copy in the journal means it did not). A copy that comes back later is a
duplicate, not also an order fault.

Order (`source_order`): a source's records all go to one journal partition, in seq order; a
record whose seq is below one an earlier offset of the source already had is out of order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker.spark.audit.findings import as_findings, millis

__all__ = ["DIGEST", "content_digest", "covered_ranges", "source_checks", "source_findings",
           "source_holes", "source_stats"]

DataFrame = Any  # pyspark.sql.DataFrame
Column = Any


#: The column a journal frame may carry instead of `content`: its SHA-256 (content_digest).
DIGEST = "digest"


def content_digest() -> Column:
    """A record's content as the duplicate check compares it: SHA-256, empty for none."""
    from pyspark.sql import functions as F

    return F.sha2(F.coalesce(F.col("content"), F.lit(b"")), 256)


def covered_ranges(journal: DataFrame) -> DataFrame:
    """Decoded journal records as (source, lo, hi, kind, ...): the seqs each one accounts for.
    `journal` holds `content` or, already digested, `digest` (content_digest)."""
    from pyspark.sql import functions as F

    digest = F.col(DIGEST) if DIGEST in journal.columns else content_digest()
    return journal.filter(F.col("decode_error").isNull() & F.col("source").isNotNull()).select(
        "source", "topic", "kind", "kafka_partition", "kafka_offset", "publisher_seq",
        F.col("source_seq").alias("lo"),
        F.when(F.col("kind") == "GAP", F.greatest("gap_to", "source_seq"))
        .otherwise(F.col("source_seq")).alias("hi"),
        millis("appended_at").alias("at_ms"),
        digest.alias("digest"),
    )


def source_checks(ranges: DataFrame, from_start: Sequence[int] = ()) -> DataFrame:
    """The rows of `ranges` that open a hole, repeat a seq or come out of order, with what
    each check found (`_hole`, `_twice`, `_late`, and the columns their details name): every
    per-source window in one pass over `ranges`, sorted twice. Few rows: the job keeps them,
    and source_holes and source_findings read them.

    Two orders, because two questions: the holes are asked in seq order (a running maximum of
    the seqs accounted for), the order in log order (a running maximum of the seqs journaled
    before). Every other question is asked of the rows of one (source, seq), which the seq
    order already keeps together, so each is a window over (source, lo) with no sort of its
    own. The windows are stacked log order first: Spark's TransposeWindow would put a window
    by (source) under one by (source, lo), and the seq order's sort would then be undone."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    data = F.col("kind") == "DATA"
    log_order = (Window.partitionBy("source").orderBy("kafka_partition", "kafka_offset")
                 .rowsBetween(Window.unboundedPreceding, -1))
    seq_order = (Window.partitionBy("source").orderBy("lo", "hi", "kafka_offset")
                 .rowsBetween(Window.unboundedPreceding, -1))
    one_seq = Window.partitionBy("source", "lo")
    start = (F.when(F.col("kafka_partition").isin(list(from_start)), F.lit(0))
             if from_start else F.lit(None))
    position = F.struct("kafka_partition", "kafka_offset")
    checked = (
        ranges.withColumn("_highest", F.max("hi").over(log_order))
        .withColumn("_reached", F.coalesce(F.max("hi").over(seq_order), start.cast("bigint")))
        # the first copy of a seq in log order (the order check's), and its DATA records'
        # count, contents, first and offsets (the duplicate check's)
        .withColumn("_first_copy", F.min(position).over(one_seq) == position)
        .withColumn("_n", F.count(F.when(data, F.lit(1))).over(one_seq))
        .withColumn("_same", F.min(F.when(data, F.col("digest"))).over(one_seq)
                    == F.max(F.when(data, F.col("digest"))).over(one_seq))
        .withColumn("_first", F.min(F.when(data, F.struct(
            "kafka_partition", "kafka_offset", "at_ms", "topic"))).over(one_seq))
        .withColumn("_offsets", F.sort_array(F.collect_list(
            F.when(data, F.col("kafka_offset"))).over(one_seq))))
    hole = F.col("_reached").isNotNull() & (F.col("lo") > F.col("_reached") + 1)
    # one finding per repeated seq: on its first DATA record
    twice = (data & (F.col("_n") > 1)
             & (F.col("kafka_partition") == F.col("_first.kafka_partition"))
             & (F.col("kafka_offset") == F.col("_first.kafka_offset")))
    late = F.col("_first_copy") & (F.col("lo") < F.col("_highest"))
    return (checked.withColumns({"_hole": hole, "_twice": twice, "_late": late})
            .filter(F.col("_hole") | F.col("_twice") | F.col("_late")))


def source_holes(checked: DataFrame) -> DataFrame:
    """(source, from_seq, to_seq, at_ms, kafka_partition, kafka_offset, topic) per hole, of
    source_checks' rows (`from_start`: journal partitions whose sources must begin at seq 1,
    see the module doc, is given there)."""
    from pyspark.sql import functions as F

    return checked.filter(F.col("_hole")).select(
        "source", (F.col("_reached") + 1).alias("from_seq"), (F.col("lo") - 1).alias("to_seq"),
        "at_ms", "kafka_partition", "kafka_offset", "topic")


def _by_pubseq(ranges: DataFrame) -> DataFrame:
    """One publication under two seqs: same publisher seq, same content. (A window, not a
    join with its own aggregate: ranges partitioned by source need no shuffle for it; and its
    sort is of the records with a publisher seq only.)"""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    same = Window.partitionBy("source", "publisher_seq", "digest")
    again = (ranges.filter((F.col("kind") == "DATA") & F.col("publisher_seq").isNotNull())
             .withColumn("first_seq", F.min("lo").over(same))
             .filter(F.col("lo") > F.col("first_seq")))
    return as_findings(
        again, "source_duplicate", source="source", source_seq="lo", topic="topic",
        journal_partition="kafka_partition", journal_offset="kafka_offset", at_ms="at_ms",
        detail=F.format_string("publisher seq %d journaled again with the same content "
                               "(first as source seq %d)", "publisher_seq", "first_seq"))


def source_findings(ranges: DataFrame, checked: DataFrame) -> DataFrame:
    """`source_hole`, `source_duplicate` and `source_order` findings: of source_checks' rows
    (`checked`), and of the records of `ranges` with a publisher seq."""
    from pyspark.sql import functions as F

    hole = as_findings(
        source_holes(checked), "source_hole", source="source", source_seq="from_seq",
        topic="topic", journal_partition="kafka_partition", journal_offset="kafka_offset",
        at_ms="at_ms", detail=F.format_string(
            "source seqs %d..%d missing, and no GAP record explains them", "from_seq", "to_seq"))
    by_seq = as_findings(
        checked.filter(F.col("_twice")), "source_duplicate", source="source", source_seq="lo",
        topic=F.col("_first.topic"), journal_partition=F.col("_first.kafka_partition"),
        journal_offset=F.col("_first.kafka_offset"), at_ms=F.col("_first.at_ms"),
        detail=F.format_string("source seq %d journaled %d times (offsets %s), %s", "lo", "_n",
                               F.array_join(F.col("_offsets").cast("array<string>"), ","),
                               F.when(F.col("_same"), F.lit("same content"))
                               .otherwise(F.lit("different content"))))
    late = as_findings(
        checked.filter(F.col("_late")), "source_order", source="source", source_seq="lo",
        topic="topic", journal_partition="kafka_partition", journal_offset="kafka_offset",
        at_ms="at_ms", detail=F.format_string("source seq %d journaled after seq %d", "lo",
                                              "_highest"))
    return hole.unionByName(by_seq).unionByName(_by_pubseq(ranges)).unionByName(late)


def source_stats(ranges: DataFrame) -> DataFrame:
    """(source, first, last, first_ms, last_ms, messages, gaps) per source: its first and
    last seq in the window, when its first and last record were appended, its DATA records
    and its GAP records."""
    from pyspark.sql import functions as F

    return ranges.groupBy("source").agg(
        F.min("lo").alias("first"), F.max("hi").alias("last"),
        F.min("at_ms").alias("first_ms"), F.max("at_ms").alias("last_ms"),
        F.sum(F.when(F.col("kind") == "DATA", 1).otherwise(0)).alias("messages"),
        F.sum(F.when(F.col("kind") == "GAP", 1).otherwise(0)).alias("gaps"))
