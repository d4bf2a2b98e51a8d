"""Read the journal with Spark's Kafka source and decode it into typed columns.

`load_journal` is the extract step (it needs a session and a Kafka); `decode_journal` is a pure
DataFrame -> DataFrame transform over Spark's Kafka rows (`key`, `value`, `partition`, `offset`,
`timestamp`), so it can be tested on any such frame. Records are decoded in the JVM by spark-avro
with every shipped version of `journal_record` (broker/spark/avro_decode.py), into the newest
layout the Python codec also gives; a record that cannot be decoded yields a row with
`decode_error` set instead of failing the whole job, because an audit must report damage, not stop
at it. The link log, the registries and the item store have their readers in
broker/spark/readers.py.
"""

from __future__ import annotations

from typing import Any

from broker.kafka_io import KafkaConfig
from broker.spark.avro_decode import decode_values, record_column
from broker.spark.source import Bound, kafka_source

__all__ = ["JOURNAL_COLUMNS", "decode_journal", "load_journal"]

DataFrame = Any  # pyspark.sql.DataFrame; pyspark ships no type stubs mypy can use here
SparkSession = Any

JOURNAL_COLUMNS = (
    "kind", "topic", "source", "source_seq", "publisher_seq", "gap_to", "gap_reason",
    "publish_type", "message_id", "revision_id", "publication_date", "expiration_date",
    "permission_token", "content_type", "content", "fields", "options", "appended_at",
    "decode_error",
)


def decode_journal(raw: DataFrame, *, python_fallback: bool = True) -> DataFrame:
    """Kafka rows -> one typed row per journal record, with its Kafka coordinates.

    `python_fallback`: see `broker.spark.avro_decode.decode_values`.
    """
    from pyspark.sql import functions as F

    rec = F.col(record_column("journal_record"))
    return decode_values(raw, ["journal_record"], python_fallback=python_fallback).select(
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        *[rec[c].alias(c) for c in JOURNAL_COLUMNS[:-1]],
        "decode_error",
    )


def load_journal(spark: SparkSession, config: KafkaConfig, *, start: Bound = None,
                 end: Bound = None, starting: str | None = None,
                 ending: str | None = None) -> DataFrame:
    """The journal topic as Spark's Kafka source sees it (a batch read), decoded.

    `start`/`end` bound it by offsets or by time (broker/spark/source.py); `starting`/`ending`
    are the offset specs earlier callers pass, taken as `start`/`end`.
    """
    raw = kafka_source(spark, config, "journal", start=starting if start is None else start,
                       end=ending if end is None else end)
    return decode_journal(raw)
