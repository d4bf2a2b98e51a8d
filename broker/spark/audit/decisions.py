"""Decision replay: for every (message, subscription) pair, what the live rule decides, and what
the link carried.

Theory of operation
-------------------
The live fan-out (broker/delivery/core.py `forward`) puts a journal DATA message on the link of
every subscription to its topic that is active when it runs, if the subscriber is entitled to
the message's permission token (broker/entitlements.py); a selector, where a subscription has
one, must match the message's fields. The replay decides each pair the same way from the
evidence: the subscription's lifetime (broker/spark/audit/registry.py) at the message's
`appended_at`, the token rule's verdict then, the selector compiled to Spark SQL over the
journal's `fields` (broker/selectors: the live path's three-valued semantics; UNKNOWN is no).
A message's expiration date is replayed as the fan-out applies it (broker/expiry.py,
`live=True`: `0` and `*` go, a date at or before the append does not); so is the privacy of
`WKT=Subscriptions` (a subscriber gets only the messages whose `subscriber` field is itself).
dataHopping is not a rule of the fan-out, so it is not replayed: see docs/audit.md.

Pairs are judged per (link, message): several subscriptions may travel on one link, and a link
carries a message once however many of them select it. *Carried* means a live delivery of
(source, source seq) on that link in any epoch (a catch-up after a repair is a delivery).

Every pair is one decision; the outcomes, one finding at most each:
- wanted and carried, or neither: reconciled;
- wanted, not carried: `missing`;
- carried, the subscription active and selecting it but the token withheld: `withheld_delivered`;
- carried against the lifetime or the selector: `decision_mismatch`;
- carried on a link no subscription to the message's topic travels on, or a message the journal
  does not hold: `extra` (a delivery with no pair).

The edge. The broker decides when its fan-out runs and sees registry changes when its follower
does: a little after the message's append and the change's record. A pair is *at the edge*,
and either outcome reconciles it, when its message was appended: between `edge_ms` before its
subscription's `created_at` and the moment the subscription's record was durable (the fan-out
sees it from then); within `edge_ms` of its end, either side; within `edge_ms` after its
token verdict changed; or within `edge_ms` of its own expiration (the fan-out may run a little
after the append). docs/audit.md gives the rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from broker import selectors
from broker.spark.audit.findings import as_findings
from broker.spark.audit.registry import FOREVER, Lifetime
from common.errors import ApexpsError

__all__ = ["PAIR_KEY", "carry", "dated", "delivered", "judge", "pair_findings", "pairs",
           "selector_keys", "tokens_and_dates", "unpaired_deliveries"]

log = structlog.get_logger(__name__)

DataFrame = Any  # pyspark.sql.DataFrame
Column = Any

#: What identifies a judged (link, message) pair.
PAIR_KEY = ("link", "source", "source_seq")

#: The private well-known topic (content-based §6.3.1; broker/pubsub/wkt.py).
SUBSCRIPTIONS_TOPIC = "WKT=Subscriptions"
#: Resource Notifies: each is its subscriber's alone, too (docs/event-binding.md §5).
NOTIFY_TOPIC = "WKT=Notify"


def expires_ms(text: str | None) -> int | None:
    """When a message with this expiration header expires (epoch ms), by the broker's own
    reading (broker/expiry.py); None for never, `0` or unreadable."""
    from broker.expiry import expires_at

    return expires_at(text)


def selector_keys(subs: Sequence[Lifetime]) -> dict[tuple[str, str], int]:
    """A number per distinct (class, selector) among `subs`."""
    keys: dict[tuple[str, str], int] = {}
    for s in subs:
        if s.selector:
            keys.setdefault((s.selector_class or "JMS", s.selector), len(keys))
    return keys


def _selector_column(keys: Mapping[tuple[str, str], int], fields: str = "fields") -> Column:
    """True where the pair's selector (by `sel_key`) matches, or it has none."""
    from pyspark.sql import functions as F

    column = F.when(F.col("sel_key").isNull(), F.lit(True))
    for (cls, text), key in keys.items():
        try:
            match = selectors.compile(cls, text).to_spark(fields)
        except ApexpsError as exc:  # a stored selector the broker never accepted: selects none
            log.warning("subscription selector does not compile; it selects nothing",
                        selector_class=cls, selector=text, error=str(exc))
            match = F.lit(False)
        column = column.when(F.col("sel_key") == key, match)
    return F.coalesce(column.otherwise(F.lit(False)), F.lit(False))


def dated() -> Column:
    """True for a message whose expiration date only the Python reading decides (`0` and
    `*` are decided in SQL, and no header is no expiry)."""
    from pyspark.sql import functions as F

    exp = F.col("expiration_date")
    return exp.isNotNull() & ~exp.isin("*", "0")


def tokens_and_dates(messages: DataFrame) -> tuple[set[tuple[str, str]], bool]:
    """One look at `messages` for two questions: the (topic, permission token) pairs they
    carry (the token verdicts the registry must give), and whether any is `dated()` (pairs'
    `any_dated`). A job over the few distinct answers, collected."""
    from pyspark.sql import functions as F

    rows = (messages.filter(F.col("permission_token").isNotNull() | dated())
            .select("topic", "permission_token", dated().alias("dated")).distinct().collect())
    return ({(r["topic"], r["permission_token"]) for r in rows
             if r["permission_token"] is not None}, any(r["dated"] for r in rows))


def pairs(messages: DataFrame, subs: DataFrame, ents: DataFrame,
          keys: Mapping[tuple[str, str], int], edge_ms: int, *, any_dated: bool = True,
          ) -> DataFrame:
    """One row per (message, subscription to its topic) with the replayed decision: `in_life`,
    `allowed`, `selected`, `want`, `edge` (see the module doc).

    `messages`: journal DATA rows (source, source_seq, topic, permission_token,
    expiration_date, fields, at_ms, kafka_partition, kafka_offset); `subs`: lifetimes (label,
    subscriber, topic, link, sel_key, start_ms, visible_ms, end_ms); `ents`: (subscriber,
    topic, token, from_ms, to_ms, allowed)."""
    from pyspark.sql import functions as F

    # The subscriptions and the token verdicts are the registries' few rows: sent to every
    # task, so the messages are not shuffled to meet them.
    # Only a message with a date reaches the Python reading of it (`0` and `*` are decided
    # here): the dated ones go through it apart, once per message, not once per pair (a Python
    # UDF inside a condition still runs on every row).
    # `any_dated` False (the caller saw no dated message): no Python at all, and one pass.
    exp = F.col("expiration_date")
    rows = (messages.filter(~dated()) if any_dated else messages).withColumn(
        "_expires", F.lit(None).cast("bigint"))
    if any_dated:
        rows = messages.filter(dated()).withColumn(
            "_expires", F.udf(expires_ms, "bigint")(exp)).unionByName(rows)
    messages = rows
    m, s, e = messages.alias("m"), F.broadcast(subs).alias("s"), F.broadcast(ents).alias("e")
    joined = m.join(s, F.col("m.topic") == F.col("s.topic"))
    verdict = joined.join(
        e, (F.col("e.subscriber") == F.col("s.subscriber")) & (F.col("e.topic") == F.col("m.topic"))
        & (F.col("e.token") == F.col("m.permission_token"))
        & (F.col("e.from_ms") <= F.col("m.at_ms")) & (F.col("m.at_ms") < F.col("e.to_ms")),
        "left")
    at, start, end = F.col("m.at_ms"), F.col("s.start_ms"), F.col("s.end_ms")
    token = F.col("m.permission_token")
    expires = F.col("m._expires")
    unexpired = expires.isNull() | (at < expires)
    own = (~F.col("m.topic").isin(SUBSCRIPTIONS_TOPIC, NOTIFY_TOPIC)
           | F.coalesce(F.col("m.fields")["subscriber"] == F.array(F.col("s.subscriber")),
                        F.lit(False)))

    visible, granted = F.col("s.visible_ms"), F.col("e.from_ms")
    edge = (
        # put in flight, or appended just before and fanned out after it was visible
        ((start - edge_ms <= at) & (at < visible))
        # appended just before its end and fanned out after, or the other way round
        | ((end != FOREVER) & (end - edge_ms <= at) & (at < end + edge_ms))
        # a token verdict that had just changed: the broker's view follows the registry
        | (token.isNotNull() & (granted > 0) & (granted <= at) & (at < granted + edge_ms))
        # expiring about when it was forwarded
        | (expires.isNotNull() & (expires - edge_ms <= at) & (at < expires + edge_ms)))
    out = verdict.select(
        "m.source", "m.source_seq", "m.topic", "m.at_ms", "m.kafka_partition",
        "m.kafka_offset", "m.permission_token", "m.fields",
        "s.label", "s.subscriber", "s.link", "s.sel_key",
        ((start <= at) & (at < end)).alias("in_life"),
        (token.isNull() | F.coalesce(F.col("e.allowed"), F.lit(False))).alias("allowed"),
        edge.alias("edge"), unexpired.alias("unexpired"), own.alias("own"),
    )
    out = out.withColumn("selected", _selector_column(keys)).drop("fields")
    return out.withColumn("want", F.col("in_life") & F.col("allowed") & F.col("selected")
                          & F.col("unexpired") & F.col("own"))


def delivered(live: DataFrame) -> DataFrame:
    """(link, source, source_seq) -> the first live delivery in log order (its link_seq,
    epoch, rec_ms, journal_partition, journal_offset) and how many times the link carried it.
    One aggregation of the deliveries, which judge and unpaired_deliveries both read."""
    from pyspark.sql import functions as F

    first = F.struct("kafka_partition", "kafka_offset", "pack_index", "link_seq", "epoch",
                     "rec_ms", "journal_partition", "journal_offset")
    return (live.groupBy(*PAIR_KEY)
            .agg(F.min(first).alias("_first"), F.count("*").alias("times"))
            .select(*PAIR_KEY, *(F.col(f"_first.{c}").alias(c) for c in (
                "link_seq", "epoch", "rec_ms", "journal_partition", "journal_offset")),
                "times"))


def carry(pair_rows: DataFrame, delivered_rows: DataFrame) -> DataFrame:
    """Each pair with what its link carried of its message (`delivered_rows`: delivered(), one
    row per (link, message)): link_seq, epoch, rec_ms, times, and `is_carried`. Both sides
    partitioned by PAIR_KEY (the audit's job does it), the join shuffles neither; judge and the
    summary's per-subscription figures are then each one aggregation of this frame."""
    from pyspark.sql import functions as F

    carried_rows = delivered_rows.select(*PAIR_KEY, "link_seq", "epoch", "rec_ms", "times")
    return (pair_rows.join(carried_rows, list(PAIR_KEY), "left")
            .withColumn("is_carried", F.col("times").isNotNull()))


def judge(paired: DataFrame, names: Sequence[tuple[str, str]]) -> DataFrame:
    """Per (link, message): the subscriptions' decisions folded (`want`: any wants it;
    `withhold`: one would, but for the token; `edge`: any is at the edge; `label`,
    `subscriber`: a wanting subscription first, then an active one, then the greatest
    (label, subscriber)), with what the link carried (`paired`: carry(): `is_carried`, link_seq,
    epoch, rec_ms, times: one value per key, so grouped by, not aggregated).

    `names`: every (label, subscriber) the pairs hold (the lifetimes'). The pick is a max of
    one long, (want, in_life, the name's place in their order), not of a struct of strings:
    a fold of fixed-width values is a hash aggregate, a struct's a sort of every pair. The
    name comes back from its place through the few names, sent to every task."""
    from pyspark.sql import functions as F

    spark = paired.sparkSession
    order = spark.createDataFrame(
        [(label, subscriber, i) for i, (label, subscriber) in enumerate(sorted(set(names)))],
        "label string, subscriber string, _place bigint")
    pick = (F.col("want").cast("bigint") * (1 << 33) + F.col("in_life").cast("bigint") * (1 << 32)
            + F.col("_place"))
    folded = (paired.join(F.broadcast(order), ["label", "subscriber"])
              .groupBy(*PAIR_KEY, "topic", "at_ms", "kafka_partition", "kafka_offset",
                       "link_seq", "epoch", "rec_ms", "times", "is_carried").agg(
        F.max("want").alias("want"), F.max("edge").alias("edge"),
        F.max(F.col("in_life") & F.col("selected") & ~F.col("allowed")).alias("withhold"),
        F.max(F.col("in_life")).alias("in_life"),
        F.max(pick).alias("_pick")))
    back = F.broadcast(order.select(F.col("_place").alias("_pick"), "label", "subscriber"))
    return folded.withColumn("_pick", F.col("_pick") % (1 << 32)).join(back, "_pick").drop(
        "_pick")


def pair_findings(judged: DataFrame) -> DataFrame:
    """`missing`, `withheld_delivered` and `decision_mismatch` findings of judged pairs."""
    from pyspark.sql import functions as F

    common = {"source": "source", "source_seq": "source_seq", "subscriber": "subscriber",
              "subscription": "label", "link": "link", "topic": "topic",
              "journal_partition": "kafka_partition", "journal_offset": "kafka_offset"}
    firm = ~F.col("edge")
    missing = as_findings(
        judged.filter(F.col("want") & ~F.col("is_carried") & firm), "missing", **common,
        at_ms="at_ms", detail=F.format_string(
            "appended at %d ms, never carried on link %s", "at_ms", "link"))
    wrongly = judged.filter(~F.col("want") & F.col("is_carried") & firm)
    withheld = as_findings(
        wrongly.filter(F.col("withhold")), "withheld_delivered", **common,
        link_seq="link_seq", at_ms="rec_ms",
        detail=F.lit("carried although the subscriber's permission token rule withheld it"))
    mismatch = as_findings(
        wrongly.filter(~F.col("withhold")), "decision_mismatch", **common,
        link_seq="link_seq", at_ms="rec_ms",
        detail=F.when(~F.col("in_life"), F.lit(
            "carried although no subscription to its topic on this link was active when it "
            "was appended")).otherwise(F.lit("carried although the selector does not match")))
    return missing.unionByName(withheld).unionByName(mismatch)


def unpaired_deliveries(delivered_rows: DataFrame, messages: DataFrame, judged: DataFrame,
                        covered: DataFrame, *, whole: bool, topic: str | None = None,
                        ) -> DataFrame:
    """`extra` findings: live deliveries (`delivered_rows`: delivered()) no pair explains. A
    delivery of a journal message on a link without a subscription to its topic; a delivery of a
    (source, source seq) the journal does not hold although the window covers it (`covered`:
    source, first, last of the window, and holes as (source, from_seq, to_seq); a seq in a hole
    is the source's finding, not the link's). `whole`: the window is every record retained, so a
    delivery of a source the journal never saw is extra too. `topic`: only deliveries of that
    topic's messages are judged (a link record does not name its topic)."""
    from pyspark.sql import functions as F

    first = delivered_rows.select(*PAIR_KEY, "link_seq", "rec_ms", "journal_partition",
                                  "journal_offset")
    unjudged = first.join(judged.select(*PAIR_KEY), list(PAIR_KEY), "left_anti")
    # One lookup of the journal serves both kinds (the held, and the never journaled).
    looked = unjudged.join(messages.select("source", "source_seq", "topic",
                                           F.lit(True).alias("_held")),
                           ["source", "source_seq"], "left")
    known = looked.filter(F.col("_held").isNotNull())
    if topic is not None:
        known = known.filter(F.col("topic") == topic)
    no_sub = as_findings(
        known, "extra", source="source", source_seq="source_seq", link="link",
        link_seq="link_seq", topic="topic", journal_partition="journal_partition",
        journal_offset="journal_offset", at_ms="rec_ms", detail=F.format_string(
            "carried, but no subscription to %s travels on link %s", "topic", "link"))

    unknown = looked.filter(F.col("_held").isNull()).drop("topic", "_held")
    bounds = covered.select("source", "first", "last")
    holes = covered.select("source", F.explode_outer("holes").alias("h"))
    inside = unknown.join(bounds, "source", "left").filter(
        (F.col("first").isNull() & F.lit(whole))
        | ((F.col("source_seq") >= F.col("first")) & (F.col("source_seq") <= F.col("last"))))
    in_hole = inside.join(
        holes, (inside["source"] == holes["source"]) & (F.col("h.from_seq") <= F.col("source_seq"))
        & (F.col("source_seq") <= F.col("h.to_seq")), "left_semi")
    strays = inside.join(in_hole.select(*PAIR_KEY), list(PAIR_KEY), "left_anti")
    stray = as_findings(
        strays, "extra", source="source", source_seq="source_seq", link="link",
        link_seq="link_seq", journal_partition="journal_partition",
        journal_offset="journal_offset", at_ms="rec_ms", detail=F.format_string(
            "carried source seq %d of %s, which the journal does not hold", "source_seq",
            "source"))
    return no_sub if topic is not None else no_sub.unionByName(stray)
