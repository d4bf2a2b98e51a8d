"""`ensure_fields`: every DATA row of a decoded journal carries its selectable fields.

Theory of operation
-------------------
A journal record's `fields` map is what selectors read (`Selector.to_spark("fields")` in batch,
the live matcher over the same map). Since the ingest (broker/pubsub/ingest.py) the broker fills
it as it accepts an XML message: `extract_fields` over the content, plus the broker's view of
the `topic`, `publisher` and `publication-date` headers. Records written before that hold an
empty map, and they sit beside the new ones in one retained journal. So a Spark job that selects
must not trust the column blindly: where a DATA record's map is empty (or null), the job runs
the broker's own `ingest` over the record (its content and media type, topic, source as the
publisher, and its publication date, else its append time, as the broker's clock), with no
selector schema (every field); where the map is filled, the writer's map stands. Either way a
selector sees what today's broker would have stored, whichever version wrote the record. That
includes the ingest's rule that only XML media types are parsed: a non-XML record has no fields
in both cases, so an empty map from today's broker stays empty here.

The re-ingest is a Python UDF, on purpose and only for this fallback: one definition of the
field map (the hardened lxml walk in broker/selectors/_fields.py and the header rules of the
ingest) is worth more than a JVM twin that would have to be held to it. Spark evaluates a
Python UDF on every row, even under a CASE, so the UDF's input is null on rows that keep their
fields (GAP rows, decode errors, filled maps): the Python side then only passes nulls through.

A record the ingest would refuse (not well-formed, a DOCTYPE, too big, too deep, too many
instances, a malformed header) gives an empty map and the reason in `fields_error`; the job
goes on. A selector then sees no field at all: every comparison is UNKNOWN and does not match,
`IS NULL` is TRUE. Today's broker refuses such a message at publication (561), so only an older
writer's records can be in that state. `fields_error` is null everywhere else.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FIELDS_ERROR_COLUMN", "ensure_fields", "fields_or_error"]

DataFrame = Any  # pyspark.sql.DataFrame; pyspark ships no type stubs mypy can use here

#: The column `ensure_fields` adds: why a record's fields could not be extracted, else null.
FIELDS_ERROR_COLUMN = "fields_error"


def fields_or_error(record: Any) -> tuple[dict[str, list[str]], str | None]:
    """The fields `ingest` gives `record` (content, content_type, topic, source, now_ms) and
    no error, or an empty map and the reason it was refused."""
    from broker.pubsub.ingest import ingest

    if record is None or record["content"] is None:
        return {}, None
    try:
        return ingest(bytes(record["content"]), record["content_type"] or "",
                      topic=record["topic"], publisher=record["source"],
                      now=record["now_ms"]).fields, None
    # InvalidMessage is the refusal ingest promises; anything else is a content no test
    # foresaw. Either way an exception here would fail the whole Spark job, and a replay or an
    # audit must report a damaged record, not stop at it.
    except Exception as exc:
        return {}, f"{type(exc).__name__}: {exc}"


def ensure_fields(journal: DataFrame) -> DataFrame:
    """`journal` (decode_journal's columns) with `fields` filled on every DATA row and a
    `fields_error` column (see the module doc). The other columns and the row order are kept.

    Idempotent: a frame that already has `fields_error` is returned as it is, so a job can
    ensure (and cache) once and hand the result to several selections without another
    Python pass, which costs seconds per query even over null inputs.
    """
    if FIELDS_ERROR_COLUMN in journal.columns:
        return journal
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from broker.selectors import FIELDS_TYPE_DDL

    fields_type = T._parse_datatype_string(FIELDS_TYPE_DDL)
    extract = F.udf(fields_or_error, T.StructType([
        T.StructField("fields", fields_type), T.StructField("error", T.StringType())]))
    empty = F.col("fields").isNull() | (F.size("fields") <= 0)
    need = (F.col("kind") == "DATA") & F.col("content").isNotNull() & empty
    record = F.struct("content", "content_type", "topic", "source", F.coalesce(
        F.unix_millis("publication_date"), F.unix_millis("appended_at")).alias("now_ms"))
    return (journal
            .withColumn("_extracted", extract(F.when(need, record)))
            .withColumns({
                "fields": F.when(need, F.col("_extracted.fields")).otherwise(F.col("fields")),
                FIELDS_ERROR_COLUMN: F.when(need, F.col("_extracted.error")),
            })
            .drop("_extracted"))
