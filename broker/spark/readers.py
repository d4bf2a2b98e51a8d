"""One reader per kind of topic an audit needs: the link log, the registries, the item store.

Each kind has a pure `decode_X(raw)` over Spark's Kafka rows (`key`, `value`, `partition`,
`offset`, `timestamp`) and a thin `load_X(spark, config, *, start=None, end=None)` that reads the
topic by offsets or by time (broker/spark/source.py) and decodes it. The journal's reader is
broker/spark/journal_reader.py. Decoding happens in the JVM (broker/spark/avro_decode.py); every
row carries its Kafka coordinates, and a record that cannot be decoded is a row with
`decode_error` set and its other columns null.

- links: one row per link record. A Kafka record of the links topic is a `link_batch` pack
  (several link records of one append) or, as apexps wrote before packing, one `link_record`;
  packs are exploded, each row keeping the pack's Kafka partition and offset and its place in
  the pack (`pack_index`), so (kafka_partition, kafka_offset, pack_index) is a row's identity.
- subscriptions, access, topics: compacted registries, one row per Kafka record with its key;
  a tombstone (a delete) is a row with `deleted` true and no error.
- items: headers, versions and markers of the data item store in one frame, `record_type`
  saying which; each type fills its own columns (the columns they share, like `topic`, are one).
"""

from __future__ import annotations

from typing import Any

from broker.codec import default_codec
from broker.kafka_io import KafkaConfig
from broker.spark.avro_decode import decode_values, record_column
from broker.spark.source import Bound, kafka_source

__all__ = [
    "DECODED_SCHEMAS", "ITEM_TYPES", "KAFKA_COLUMNS", "LINK_COLUMNS", "REGISTRY_SCHEMAS",
    "decode_access", "decode_acks", "decode_items", "decode_links", "decode_registry",
    "decode_subscriptions", "decode_topics", "item_columns", "load_access", "load_acks",
    "load_items", "load_links", "load_subscriptions", "load_topics", "registry_columns",
]

DataFrame = Any  # pyspark.sql.DataFrame
SparkSession = Any

#: Where each row was in Kafka.
KAFKA_COLUMNS = ("kafka_partition", "kafka_offset", "kafka_timestamp")

LINK_COLUMNS = (
    "pack_index", "link", "ordinal", "epoch", "epoch_start", "bits", "kind", "journal_partition",
    "journal_offset", "source", "source_seq", "owner", "writer", "recorded_at", "snapshot",
    "decode_error",
)
_LINK_SCHEMAS = ("link_batch", "link_record")

#: The registry topics (their role in KafkaConfig.topic) and the schema each holds.
REGISTRY_SCHEMAS = {
    "subscriptions": "subscription_record", "access": "access_entry", "topics": "topic_record",
    "acks": "link_ack",
}

#: Per topic role, the schema names its decode reads (avro_decode.needs_python asks about them).
DECODED_SCHEMAS: dict[str, tuple[str, ...]] = {
    "journal": ("journal_record",), "links": _LINK_SCHEMAS,
    **{role: (name,) for role, name in REGISTRY_SCHEMAS.items()},
}

#: The item store's record types, as `record_type` names them.
ITEM_TYPES = ("item_header", "item_version", "item_marker")


def _kafka(key: bool = False) -> list[Any]:
    from pyspark.sql import functions as F

    cols = [F.col("partition").alias("kafka_partition"), F.col("offset").alias("kafka_offset"),
            F.col("timestamp").alias("kafka_timestamp")]
    if key:
        cols.append(F.col("key").cast("string").alias("kafka_key"))
    return cols


def _fields(name: str) -> list[str]:
    return [f["name"] for f in default_codec().schema(name).raw["fields"]]


def decode_links(raw: DataFrame, *, python_fallback: bool = True) -> DataFrame:
    """Kafka rows of the links topic -> one row per link record (see the module doc).
    `python_fallback`: see `broker.spark.avro_decode.decode_values`."""
    from pyspark.sql import functions as F

    d = decode_values(raw, _LINK_SCHEMAS, python_fallback=python_fallback)
    packed = (F.when(F.col("_schema") == "link_batch",
                     F.col(record_column("link_batch"))["records"])
              .when(F.col("_schema") == "link_record",
                    F.array(F.col(record_column("link_record")))))
    exploded = d.select(*_kafka(), "decode_error",
                        F.posexplode_outer(packed).alias("pack_index", "r"))
    return exploded.select(
        *KAFKA_COLUMNS, "pack_index",
        *[F.col("r")[c].alias(c) for c in LINK_COLUMNS[1:-1]], "decode_error")


def registry_columns(role: str) -> tuple[str, ...]:
    """The columns `decode_registry(raw, role)` gives after the Kafka ones."""
    return ("kafka_key", "deleted", *_fields(REGISTRY_SCHEMAS[role]), "decode_error")


def decode_registry(raw: DataFrame, role: str, *, python_fallback: bool = True) -> DataFrame:
    """Kafka rows of a registry topic (`subscriptions`, `access`, `topics`) -> one row each."""
    from pyspark.sql import functions as F

    name = REGISTRY_SCHEMAS[role]
    d = decode_values(raw, [name], tombstones=True, python_fallback=python_fallback)
    rec = F.col(record_column(name))
    return d.select(*_kafka(key=True), F.col("value").isNull().alias("deleted"),
                    *[rec[c].alias(c) for c in _fields(name)], "decode_error")


def decode_subscriptions(raw: DataFrame) -> DataFrame:
    return decode_registry(raw, "subscriptions")


def decode_access(raw: DataFrame) -> DataFrame:
    return decode_registry(raw, "access")


def decode_topics(raw: DataFrame) -> DataFrame:
    return decode_registry(raw, "topics")


def decode_acks(raw: DataFrame) -> DataFrame:
    """What each subscriber acknowledged, per link and epoch (broker/robust/acks.py)."""
    return decode_registry(raw, "acks")


def item_columns() -> tuple[str, ...]:
    """The columns `decode_items` gives after the Kafka ones: every item type's fields, once."""
    fields: list[str] = []
    for name in ITEM_TYPES:
        fields.extend(f for f in _fields(name) if f not in fields)
    return ("kafka_key", "deleted", "record_type", *fields, "decode_error")


def decode_items(raw: DataFrame) -> DataFrame:
    """Kafka rows of the item store's topic -> one row each (see the module doc)."""
    from pyspark.sql import functions as F

    d = decode_values(raw, ITEM_TYPES, tombstones=True)
    columns = []
    for field in item_columns()[3:-1]:
        having = [F.col(record_column(n))[field] for n in ITEM_TYPES if field in _fields(n)]
        columns.append((F.coalesce(*having) if len(having) > 1 else having[0]).alias(field))
    return d.select(*_kafka(key=True), F.col("value").isNull().alias("deleted"),
                    F.col("_schema").alias("record_type"), *columns, "decode_error")


def load_links(spark: SparkSession, config: KafkaConfig, *, start: Bound = None,
               end: Bound = None) -> DataFrame:
    return decode_links(kafka_source(spark, config, "links", start=start, end=end))


def load_subscriptions(spark: SparkSession, config: KafkaConfig, *, start: Bound = None,
                       end: Bound = None) -> DataFrame:
    return decode_subscriptions(kafka_source(spark, config, "subscriptions", start=start,
                                             end=end))


def load_access(spark: SparkSession, config: KafkaConfig, *, start: Bound = None,
                end: Bound = None) -> DataFrame:
    return decode_access(kafka_source(spark, config, "access", start=start, end=end))


def load_topics(spark: SparkSession, config: KafkaConfig, *, start: Bound = None,
                end: Bound = None) -> DataFrame:
    return decode_topics(kafka_source(spark, config, "topics", start=start, end=end))


def load_acks(spark: SparkSession, config: KafkaConfig, *, start: Bound = None,
              end: Bound = None) -> DataFrame:
    return decode_acks(kafka_source(spark, config, "acks", start=start, end=end))


def load_items(spark: SparkSession, config: KafkaConfig, *, start: Bound = None,
               end: Bound = None) -> DataFrame:
    return decode_items(kafka_source(spark, config, "items", start=start, end=end))
