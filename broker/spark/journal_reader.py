"""Read the journal with Spark's Kafka source and decode it into typed columns.

`load_journal` is the extract step (it needs a session and a Kafka); `decode_journal` is a pure
DataFrame -> DataFrame transform over Spark's Kafka rows (`key`, `value`, `partition`, `offset`,
`timestamp`), so it can be tested on any such frame. Decoding uses the same `Codec` as the live
broker, so every schema version the broker can read, Spark can read; a record that cannot be
decoded yields a row with `decode_error` set instead of failing the whole job, because an audit
must report damage, not stop at it.
"""

from __future__ import annotations

from typing import Any

from broker.kafka_io import KafkaConfig

__all__ = ["JOURNAL_COLUMNS", "decode_journal", "load_journal"]

DataFrame = Any  # pyspark.sql.DataFrame; pyspark ships no type stubs mypy can use here
SparkSession = Any

JOURNAL_COLUMNS = (
    "kind", "topic", "source", "source_seq", "publisher_seq", "gap_to", "gap_reason",
    "publish_type", "message_id", "revision_id", "publication_date", "expiration_date",
    "permission_token", "content_type", "content", "fields", "options", "appended_at",
    "decode_error",
)


def _struct() -> Any:
    from pyspark.sql import types as t

    s, long_, ts = t.StringType(), t.LongType(), t.TimestampType()
    return t.StructType([
        t.StructField("kind", s), t.StructField("topic", s), t.StructField("source", s),
        t.StructField("source_seq", long_), t.StructField("publisher_seq", long_),
        t.StructField("gap_to", long_), t.StructField("gap_reason", s),
        t.StructField("publish_type", s), t.StructField("message_id", s),
        t.StructField("revision_id", s), t.StructField("publication_date", ts),
        t.StructField("expiration_date", s), t.StructField("permission_token", s),
        t.StructField("content_type", s), t.StructField("content", t.BinaryType()),
        t.StructField("fields", t.MapType(s, t.ArrayType(s))),
        t.StructField("options", t.MapType(s, s)), t.StructField("appended_at", ts),
        t.StructField("decode_error", s),
    ])


def _decode(value: bytes | bytearray | None) -> tuple[Any, ...]:
    from broker.codec import default_codec
    from common.errors import ApexpsError

    try:
        if value is None:
            raise ValueError("empty record")
        _, rec = default_codec().decode(bytes(value), expect="journal_record")
    except (ApexpsError, ValueError) as exc:
        return (None,) * (len(JOURNAL_COLUMNS) - 1) + (str(exc),)
    return (*tuple(rec.get(c) for c in JOURNAL_COLUMNS[:-1]), None)


def decode_journal(raw: DataFrame) -> DataFrame:
    """Kafka rows -> one typed row per journal record, with its Kafka coordinates."""
    from pyspark.sql import functions as F

    decode = F.udf(_decode, _struct())
    return raw.select(
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        decode(F.col("value")).alias("r"),
    ).select("kafka_partition", "kafka_offset", "kafka_timestamp", "r.*")


def load_journal(spark: SparkSession, config: KafkaConfig, *, starting: str = "earliest",
                 ending: str = "latest") -> DataFrame:
    """The journal topic as Spark's Kafka source sees it (a batch read), decoded."""
    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", config.bootstrap)
        .option("subscribe", config.topic("journal"))
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .option("failOnDataLoss", "false")
        .load()
    )
    return decode_journal(raw)
