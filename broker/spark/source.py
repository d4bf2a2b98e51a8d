"""Spark's Kafka source over one of apexps's topics, bounded by offsets or by time.

A bound is what an auditor has in hand: nothing (the whole retained topic), Spark's own offset
spec (`"earliest"`, `"latest"` or its JSON), per-partition offsets (`{partition: offset}`), or a
point in time. Time goes to the Kafka source's `startingTimestamp` / `endingTimestamp`, which ask
each partition for its first offset whose record timestamp is at or after the instant
(`offsetsForTimes`): the window is [start, end) by Kafka timestamp (the broker's append time).
A start later than every record gives no rows, not an error
(`startingOffsetsByTimestampStrategy=latest`); an end later than every record reads to the end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from broker.kafka_io import KafkaConfig

__all__ = ["Bound", "kafka_source", "parse_bound", "window_options"]

DataFrame = Any  # pyspark.sql.DataFrame
SparkSession = Any

#: None, an offset spec Spark takes as is, {partition: offset}, or a time (naive means UTC).
Bound = str | Mapping[int, int] | datetime | None


def parse_bound(text: str) -> Bound:
    """A bound as a command line gives it (an audit's `--from`/`--to`): `earliest`, `latest`,
    Spark's offsets JSON, or an ISO 8601 time (naive means UTC, `Z` is accepted).

    Raises:
        ValueError: none of these, with the text in the message.
    """
    text = text.strip()
    if text in ("earliest", "latest") or text.startswith("{"):
        return text
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither earliest, latest, offsets JSON nor an ISO 8601 "
                         "time such as 2026-11-25T20:00:00Z") from None


def _millis(when: datetime) -> str:
    aware = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    return str(int(aware.timestamp() * 1000))


def _one(topic: str, bound: Bound, side: str) -> dict[str, str]:
    if bound is None:
        return {}
    if isinstance(bound, datetime):
        return {f"{side}Timestamp": _millis(bound)}
    if isinstance(bound, str):
        return {f"{side}Offsets": bound}
    return {f"{side}Offsets": json.dumps({topic: {str(p): o for p, o in bound.items()}})}


def window_options(topic: str, start: Bound = None, end: Bound = None) -> dict[str, str]:
    """The Kafka source options that read `topic` from `start` to `end` (see the module doc)."""
    options = {"startingOffsets": "earliest", "endingOffsets": "latest",
               **_one(topic, start, "starting"), **_one(topic, end, "ending")}
    if isinstance(start, datetime):
        options["startingOffsetsByTimestampStrategy"] = "latest"
    return options


def kafka_source(spark: SparkSession, config: KafkaConfig, role: str, *, start: Bound = None,
                 end: Bound = None) -> DataFrame:
    """The raw rows of apexps's `role` topic (`journal`, `links`, ...), a batch read."""
    topic = config.topic(role)
    reader = (spark.read.format("kafka")
              .option("kafka.bootstrap.servers", config.bootstrap)
              .option("subscribe", topic)
              # Retention may have removed the start of a range: read what is left, and let
              # the audit find the hole, rather than fail the job.
              .option("failOnDataLoss", "false"))
    for key, value in window_options(topic, start, end).items():
        reader = reader.option(key, value)
    return reader.load()
