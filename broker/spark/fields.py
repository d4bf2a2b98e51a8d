"""`ensure_fields`: every DATA row of a decoded journal carries its selectable fields.

Theory of operation
-------------------
A journal record's `fields` map is what selectors read (broker/selectors: `extract_fields` at
ingest, `Selector.to_spark("fields")` in batch). Live traffic stores it empty today (filling it
at ingest is issue 20), and records written before and after that change will sit side by side
in one retained journal. So a Spark job that selects must not trust the column blindly: where a
DATA record's map is empty (or null), the job extracts it from `content` with the very function
the broker uses, `broker.selectors.extract_fields`, with no selector schema (every field); where
the map is filled, the writer's map stands. Either way the selector sees what the live matcher
would, whichever broker version wrote the record.

The extraction is a Python UDF, on purpose and only for this fallback: one definition of the
field map (the hardened lxml walk in broker/selectors/_fields.py) is worth more than a JVM twin
that would have to be held to it. Spark evaluates a Python UDF on every row, even under a CASE,
so the UDF's input is null on rows that keep their fields (GAP rows, decode errors, filled
maps): the Python side then only passes nulls through.

A content the broker would refuse (not well-formed, a DOCTYPE, too big, too deep, too many
instances) gives an empty map and the reason in `fields_error`; the job goes on. A selector
then sees no field at all, as the live path would see a message it could not parse: every
comparison is UNKNOWN and does not match, `IS NULL` is TRUE. `fields_error` is null everywhere
else.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FIELDS_ERROR_COLUMN", "ensure_fields", "extract_or_error"]

DataFrame = Any  # pyspark.sql.DataFrame; pyspark ships no type stubs mypy can use here

#: The column `ensure_fields` adds: why a record's fields could not be extracted, else null.
FIELDS_ERROR_COLUMN = "fields_error"


def extract_or_error(content: bytes | bytearray | None) -> tuple[dict[str, list[str]], str | None]:
    """`extract_fields(content)` and no error, or an empty map and the reason it failed."""
    from broker.selectors import extract_fields

    if content is None:
        return {}, None
    try:
        return extract_fields(bytes(content)), None
    # InvalidMessage is the refusal extract_fields promises; anything else is a content no test
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
    extract = F.udf(extract_or_error, T.StructType([
        T.StructField("fields", fields_type), T.StructField("error", T.StringType())]))
    empty = F.col("fields").isNull() | (F.size("fields") <= 0)
    need = (F.col("kind") == "DATA") & F.col("content").isNotNull() & empty
    return (journal
            .withColumn("_extracted", extract(F.when(need, F.col("content"))))
            .withColumns({
                "fields": F.when(need, F.col("_extracted.fields")).otherwise(F.col("fields")),
                FIELDS_ERROR_COLUMN: F.when(need, F.col("_extracted.error")),
            })
            .drop("_extracted"))
