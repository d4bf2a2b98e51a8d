"""What each link's subscriber acknowledged, against what the link carried (DESIGN invariant 8).

The evidence is `NS.acks` (broker/robust/acks.py): per link and epoch, the newest link record
whose delivery the subscriber answered `ok`. BEEP answers a channel's messages in order, so a
record at or before that one (by ordinal, within the epoch) was acknowledged. The log is written
behind, every half second, so it is a lower bound: a delivery answered just before a broker
crash may show as unacknowledged. Unacknowledged is therefore a figure, not a finding — a
subscriber that went away for good, or the last half second before a kill, both look alike.
"""

from __future__ import annotations

from typing import Any

__all__ = ["acknowledgements"]

DataFrame = Any


def acknowledgements(records: DataFrame, acks: DataFrame | None) -> DataFrame:
    """Per link: `carried` (its live DATA records), `acknowledged` (those at or before the
    newest acknowledged record of their epoch) and `acked` (epoch -> newest acknowledged link
    seq). `records` are `links.link_records`; `acks` is `readers.load_acks` (None: no log)."""
    from pyspark.sql import functions as F

    data = records.filter((F.col("kind") == "DATA") & ~F.coalesce(F.col("snapshot"),
                                                                   F.lit(False)))
    if acks is None:
        newest = None
    else:
        newest = (acks.filter(F.col("decode_error").isNull() & ~F.col("deleted"))
                  .groupBy("link", "epoch")
                  .agg(F.max(F.struct("ordinal", "seq")).alias("_top"))
                  .select("link", "epoch", F.col("_top.ordinal").alias("acked_ordinal"),
                          F.col("_top.seq").alias("acked_seq")))
    if newest is None:
        joined = data.withColumn("acked_ordinal", F.lit(None).cast("long"))
    else:
        joined = data.join(newest.drop("acked_seq"), ["link", "epoch"], "left")
    per_link = joined.groupBy("link").agg(
        F.count("*").alias("carried"),
        F.coalesce(F.sum((F.col("ordinal") <= F.col("acked_ordinal")).cast("int")),
                   F.lit(0)).alias("acknowledged"))
    if newest is None:
        return per_link.withColumn("acked", F.create_map().cast("map<bigint,bigint>"))
    acked = newest.groupBy("link").agg(
        F.map_from_entries(F.collect_list(F.struct("epoch", "acked_seq"))).alias("acked"))
    return (per_link.join(acked, "link", "full")
            .select("link", F.coalesce("carried", F.lit(0)).alias("carried"),
                    F.coalesce("acknowledged", F.lit(0)).alias("acknowledged"), "acked"))
