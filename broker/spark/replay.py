"""`replay`: a topic's history as a subscriber would have received it, from the journal.

Theory of operation
-------------------
The journal holds every accepted message once, with its source and source seq, in per-source
order within one Kafka partition (the key is the source). A subscriber of topic T is sent, per
source, T's DATA records in source-seq order; a robust subscriber's stub hands each to its
application once. So a replay is a filter and a sort over the decoded journal
(broker/spark/journal_reader.py), nothing the broker's memory has to supply:

- kind DATA and topic T; GAP records explain holes in a source's seqs, they are not messages;
  a record that did not decode (`decode_error`) is no message either (the audit reports it);
- per source, ascending source seq. Sources are independent streams (the live broker promises
  nothing about the interleaving of two sources), so the output is sorted by (source,
  source_seq): one deterministic order that is every source's own order;
- one row per (source, source_seq): the journal's idempotent producer writes each once, and
  the subscriber's stub drops a repeat, so a duplicate in a damaged journal is replayed once
  (the first copy by Kafka position); finding it is the audit's job;
- `source` + `after`: one source's messages after a seq, as a repair by (source, last source
  seq) delivers them (XEP-0040 last-ditch repair);
- `selector`: a compiled `broker.selectors.Selector`, applied as `selector.to_spark("fields")`
  over the fields `ensure_fields` guarantees (broker/spark/fields.py), with the live path's
  three-valued semantics: UNKNOWN is not selected. A message whose content could not be
  parsed has no fields; its `fields_error` says why.

Whose view. Without `tokens` the replay is the journal's view: every message of the topic,
each with its `permission_token`, which is what an auditor with no entitlement filter sees.
With `tokens` (the permission tokens one endpoint may receive, decided by the launcher with the
live rule, broker/entitlements.py) a message carrying a token outside the set is left out and
a message without a token always stays, as the live fan-out does (PubsubService.entitled).

Expiry (draft §5.2.1, broker/expiry.py). The live fan-out forwards a message unless it has
expired by then (`expired(..., live=True)`: an expiration of `0` goes to the subscribers of the
moment). So by default a replay leaves out what had expired when the broker appended it, which
no subscriber was sent, and keeps the rest, also what expired later: a subscriber connected at
the time received it. The decision is `broker.expiry.expired` itself, at the record's append
time, in a Python UDF that sees only rows with a date to read (`*`, `0` and no header are
decided in SQL). The fan-out's clock reads a few milliseconds after the append, so a message
published to expire within those milliseconds is replayed though it was not sent.
`include_expired=True` keeps everything, the journal's view. A gap fill or repair asked for
today would also leave out what has expired since; a replay shows the stream as it went out.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from broker.spark.fields import FIELDS_ERROR_COLUMN, ensure_fields

__all__ = ["REPLAY_COLUMNS", "message_tokens", "replay", "sent_unexpired"]

DataFrame = Any  # pyspark.sql.DataFrame; pyspark ships no type stubs mypy can use here
Selector = Any  # broker.selectors.Selector (kept Any: pyspark Column types are Any too)

#: The columns of a replay, in this order.
REPLAY_COLUMNS = (
    "topic", "source", "source_seq", "publisher_seq", "publish_type", "message_id",
    "revision_id", "publication_date", "expiration_date", "permission_token", "content_type",
    "content", "appended_at", "kafka_partition", "kafka_offset", FIELDS_ERROR_COLUMN,
)


def _messages(journal: DataFrame, topic: str) -> DataFrame:
    from pyspark.sql import functions as F

    return journal.filter(F.col("decode_error").isNull() & (F.col("kind") == "DATA")
                          & (F.col("topic") == topic))


def message_tokens(journal: DataFrame, topic: str) -> list[str]:
    """The distinct permission tokens the topic's messages in `journal` carry (few: a token
    names a class of data), for deciding a viewer's `tokens` outside Spark."""
    from pyspark.sql import functions as F

    rows = (_messages(journal, topic).filter(F.col("permission_token").isNotNull())
            .select("permission_token").distinct().collect())
    return sorted(r["permission_token"] for r in rows)


def sent_unexpired(record: Any) -> bool | None:
    """Had the message not expired when appended (expiration_date, appended_ms)? The live
    fan-out's rule (`live=True`); None for no record."""
    from broker.expiry import expired

    if record is None:
        return None
    return not expired(record["expiration_date"], record["appended_ms"], live=True)


def _unexpired_at_send() -> Any:
    from pyspark.sql import functions as F

    exp = F.col("expiration_date")
    dated = exp.isNotNull() & ~exp.isin("*", "0")
    check = F.udf(sent_unexpired, "boolean")(F.when(dated, F.struct(
        exp.alias("expiration_date"), F.unix_millis("appended_at").alias("appended_ms"))))
    return ~dated | check


def replay(journal: DataFrame, *, topic: str, selector: Selector | None = None,
           source: str | None = None, after: int | None = None,
           tokens: Collection[str] | None = None, include_expired: bool = False) -> DataFrame:
    """The messages of `topic` in `journal` (decode_journal's columns) as a subscriber receives
    them: REPLAY_COLUMNS, sorted by (source, source_seq). See the module doc.

    Args:
        selector: a compiled Selector; None (or an empty selector) keeps every message.
        source: only this source's messages.
        after: with `source`, only its seqs greater than this.
        tokens: the permission tokens the viewer may receive; None: no token filter.
        include_expired: keep messages that had expired when appended (never sent live).

    Raises:
        ValueError: `after` without `source` (a seq means nothing across sources).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if after is not None and source is None:
        raise ValueError("after needs a source: source seqs are per source")
    df = _messages(journal, topic)
    if source is not None:
        df = df.filter(F.col("source") == source)
        if after is not None:
            df = df.filter(F.col("source_seq") > F.lit(after))
    if not include_expired:
        df = df.filter(_unexpired_at_send())
    if tokens is not None:
        allowed = sorted(set(tokens))
        token = F.col("permission_token")
        df = df.filter(token.isNull() | (token.isin(*allowed) if allowed else F.lit(False)))
    if selector is not None and selector.text.strip():
        # UNKNOWN is a null Column, and the live rule is that UNKNOWN does not match: filter
        # drops null rows anyway, the coalesce keeps that from resting on filter's habit.
        df = ensure_fields(df)
        df = df.filter(F.coalesce(selector.to_spark("fields"), F.lit(False)))
    else:
        df = df.withColumn(FIELDS_ERROR_COLUMN, F.lit(None).cast("string"))
    first = Window.partitionBy("source", "source_seq").orderBy("kafka_partition", "kafka_offset")
    return (df.withColumn("_copy", F.row_number().over(first)).filter(F.col("_copy") == 1)
            .select(*REPLAY_COLUMNS).orderBy("source", "source_seq"))
