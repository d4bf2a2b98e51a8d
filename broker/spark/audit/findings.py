"""What a finding is: its category and its columns, one frame layout for every check.

Every check of the audit returns a frame of findings in this one layout, so they union into the
findings table (Parquet) without reshaping, and a finding names exactly what the evidence
pins: the source and source seq, the link and link seq, the subscription, the journal position,
when (`at_ms`, epoch milliseconds of the record that shows it) and a sentence (`detail`).
Columns a check cannot fill are null. docs/audit.md says what each category means.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CATEGORIES", "FINDING_COLUMNS", "as_findings", "empty_findings", "millis"]

DataFrame = Any  # pyspark.sql.DataFrame
Column = Any
SparkSession = Any

#: Every category, in the order summary.json and the report list them.
CATEGORIES = (
    "source_hole", "source_duplicate", "source_order", "missing", "extra", "duplicate",
    "reorder", "withheld_delivered", "decision_mismatch", "decode_error",
)

#: (name, Spark type) of the findings table, in order.
FINDING_COLUMNS = (
    ("category", "string"), ("source", "string"), ("source_seq", "bigint"),
    ("subscriber", "string"), ("subscription", "string"), ("link", "string"),
    ("link_seq", "bigint"), ("topic", "string"), ("journal_partition", "int"),
    ("journal_offset", "bigint"), ("detail", "string"), ("at_ms", "bigint"),
)


def as_findings(df: DataFrame, category: str | Column, **columns: Column | str) -> DataFrame:
    """`df` as findings of `category` (a category, or a Column that yields one per row: a
    check whose rows are findings of several kinds): each named column from a Column or a
    column name of `df`, the others null."""
    from pyspark.sql import functions as F

    if isinstance(category, str) and category not in CATEGORIES:
        raise ValueError(f"unknown finding category {category!r}")
    unknown = set(columns) - {n for n, _ in FINDING_COLUMNS}
    if unknown:
        raise ValueError(f"not finding columns: {sorted(unknown)}")
    out = []
    for name, kind in FINDING_COLUMNS:
        if name == "category":
            value = F.lit(category) if isinstance(category, str) else category
        else:
            given = columns.get(name)
            value = F.lit(None) if given is None else (
                F.col(given) if isinstance(given, str) else given)
        out.append(value.cast(kind).alias(name))
    return df.select(*out)


def empty_findings(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], ", ".join(f"{n} {t}" for n, t in FINDING_COLUMNS))


def millis(column: str | Column) -> Column:
    """A timestamp column as epoch milliseconds (a long)."""
    from pyspark.sql import functions as F

    return F.unix_millis(F.col(column) if isinstance(column, str) else column)
