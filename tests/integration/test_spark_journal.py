"""Spark reads the journal through its Kafka source and decodes exactly what was appended."""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.records import Publication, PublishType
from broker.spark.journal_reader import load_journal

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_spark_reads_back_exactly_what_was_appended(kafka_config: KafkaConfig,
                                                    spark: Any) -> None:
    """Count, the set of (source, seq), a content checksum and typed fields all agree."""
    from pyspark.sql import functions as F

    core = BrokerCore(kafka_config)
    core.open()
    sent: dict[tuple[str, int], bytes] = {}
    failed: list[Exception] = []
    try:
        for i in range(1500):
            body = f"<quote n='{i}'>{'x' * (i % 97)}</quote>".encode()
            pub = Publication(topic="equity.quote", source=f"p{i % 4}@example.com", content=body,
                              publish_type=PublishType.IMAGE if i % 10 == 0 else
                              PublishType.UPDATE, fields={"n": [str(i)]})
            core.journal.append(pub, lambda err, res: failed.extend([err] if err else []))
        core.journal.flush()
        assert not failed, f"{len(failed)} appends failed, the first: {failed[0]!r}"
        for n in range(4):
            for e in core.journal.read_source(f"p{n}@example.com"):
                sent[(e.source, e.source_seq)] = e.content
    finally:
        core.close()
    assert len(sent) == 1500, _missing(sent)

    df = load_journal(spark, kafka_config).cache()
    row = df.agg(F.count("*").alias("n"),
                 F.sum(F.crc32("content")).alias("crc"),
                 F.count("decode_error").alias("errors"),
                 F.sum(F.when(F.col("publish_type") == "image", 1).otherwise(0)).alias("images"),
                 ).collect()[0]
    assert row["n"] == len(sent) and row["errors"] == 0
    assert row["crc"] == sum(zlib.crc32(c) for c in sent.values())
    assert row["images"] == 150
    keys = {(r["source"], r["source_seq"]) for r in df.select("source", "source_seq").collect()}
    assert keys == set(sent)
    one = df.where(F.col("fields")["n"][0] == "42").select("content", "topic").collect()
    assert [(bytes(r["content"]), r["topic"]) for r in one] == [
        (b"<quote n='42'>" + b"x" * 42 + b"</quote>", "equity.quote")]
    df.unpersist()


def _missing(sent: dict[tuple[str, int], bytes]) -> str:
    """Which seqs each source lacks: a short count says where it came from."""
    out = []
    for n in range(4):
        have = {seq for source, seq in sent if source == f"p{n}@example.com"}
        gone = sorted(set(range(1, 376)) - have)
        more = " …" if len(gone) > 12 else ""
        out.append(f"p{n}: {len(have)} read back, missing {gone[:12]}{more}")
    return "; ".join(out)


def test_undecodable_records_are_reported_not_fatal(kafka_config: KafkaConfig,
                                                    spark: Any) -> None:
    """A record with an unknown schema fingerprint shows up with decode_error set."""
    from broker.kafka_producer import KafkaProducer

    core = BrokerCore(kafka_config)
    core.open()
    core.journal.append_sync(Publication(topic="a.b", source="s", content=b"<x/>"))
    core.close()
    producer = KafkaProducer(kafka_config)
    producer.produce_sync(kafka_config.topic("journal"), b"s", b"\xc3\x01" + b"\x09" * 8 + b"zz",
                          partition=0)
    producer.close()
    rows = load_journal(spark, kafka_config).select("source", "decode_error").collect()
    assert sorted((r["source"] is None, r["decode_error"] is None) for r in rows) == [
        (False, True), (True, False)]
    assert any("unknown schema fingerprint" in (r["decode_error"] or "") for r in rows)
