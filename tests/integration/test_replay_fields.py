"""ensure_fields: a record written with an empty `fields` map (an older broker) and one written
with the map today's ingest stores give a Spark job the same fields; a filled map is kept as
written; non-XML content has no fields either way; hostile or undecodable content is a row with
`fields_error`, never a failed job."""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.kafka_producer import KafkaProducer
from broker.pubsub.ingest import ingest
from broker.records import Publication, gap_record
from broker.selectors import extract_fields
from broker.spark.fields import ensure_fields
from broker.spark.journal_reader import load_journal

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

CONTENTS = [
    b"<equity-quote symbol='XMPL'><price>10.5</price><net-change-pct>-2</net-change-pct>"
    b"</equity-quote>",
    b"<a x='1'><b>one</b><b> two </b><c><d y='z'>deep</d></c></a>",
    "<q n='\u00e9t\u00e9'>caf\u00e9</q>".encode(),
    b"<ps:message-content xmlns:ps='urn:ietf:params:xml:ns:apex-pubsub'><ps:topic>t</ps:topic>"
    b"<ps:publisher>fred@example.com</ps:publisher><ps:content><m k='v'>w</m></ps:content>"
    b"</ps:message-content>",
]
HOSTILE = [
    b"<!DOCTYPE a [<!ENTITY x 'boom'>]><a>&x;</a>",  # DOCTYPE: refused outright
    b"<a><b></a>",  # not well-formed
    b"\xff\xfe\x00garbage",  # not XML at all
    b"<a>" * 300 + b"</a>" * 300,  # deeper than the limit
]


def _fields(row: Any) -> dict[str, list[str]]:
    return {k: list(v) for k, v in (row["fields"] or {}).items()}


T0 = 1_764_000_000_000  # the publication date of every record here (ms)


def _ingested(content: bytes, content_type: str = "application/xml") -> dict[str, list[str]]:
    return ingest(content, content_type, topic="t", publisher="s@example.com", now=T0).fields


def test_empty_and_ingested_fields_read_the_same(kafka_config: KafkaConfig, spark: Any) -> None:
    """Each content twice from one source: with no fields (an older broker) and with the map
    today's ingest stores. After ensure_fields both carry that map: the content's fields and
    the broker's topic, publisher and publication-date. XML sent as octet-stream has no fields
    in the ingest, so none here either."""
    core = BrokerCore(kafka_config)
    core.open()
    try:
        for content in CONTENTS:
            for fields in ({}, _ingested(content)):
                core.journal.append_sync(Publication("t", "s@example.com", content,
                                                     publication_date=T0, fields=fields))
        core.journal.append_sync(Publication("t", "s@example.com", CONTENTS[0],
                                             content_type="application/octet-stream",
                                             publication_date=T0))
    finally:
        core.close()
    rows = ensure_fields(load_journal(spark, kafka_config)).collect()
    by = {r["source_seq"]: r for r in rows}
    assert len(by) == 2 * len(CONTENTS) + 1
    for i, content in enumerate(CONTENTS):
        want = _ingested(content)
        # the content's own fields are in, so "empty" cannot pass for "the same"
        assert set(extract_fields(content)) <= set(want)
        assert want["publisher"] == ["s@example.com"] and want["topic"] == ["t"]
        assert _fields(by[2 * i + 1]) == want, content
        assert _fields(by[2 * i + 2]) == want, content
        assert by[2 * i + 1]["fields_error"] is None
    octet = by[2 * len(CONTENTS) + 1]
    assert _fields(octet) == {} and octet["fields_error"] is None


def test_a_filled_map_is_kept_as_written(kafka_config: KafkaConfig, spark: Any) -> None:
    """A writer's map wins over the content (a selector schema may have kept only some names,
    or derived others): ensure_fields only fills what is empty."""
    core = BrokerCore(kafka_config)
    core.open()
    try:
        core.journal.append_sync(Publication("t", "s@example.com", CONTENTS[0],
                                             fields={"derived": ["42"]}))
    finally:
        core.close()
    (row,) = ensure_fields(load_journal(spark, kafka_config)).collect()
    assert _fields(row) == {"derived": ["42"]}
    assert row["fields_error"] is None


def test_hostile_content_gaps_and_broken_records_do_not_fail_the_job(
        kafka_config: KafkaConfig, spark: Any) -> None:
    """Refused content gives an empty map and the reason; a GAP row and a record that does not
    decode are passed through untouched; the good record after them still gets its fields."""
    core = BrokerCore(kafka_config)
    core.open()
    try:
        for content in HOSTILE:
            core.journal.append_sync(Publication("t", "h@example.com", content))
        core.journal.append_sync(Publication("t", "h@example.com", CONTENTS[1]))
    finally:
        core.close()
    producer = KafkaProducer(kafka_config)
    from broker.codec import default_codec

    producer.produce_sync(kafka_config.topic("journal"), b"g", default_codec().encode(
        "journal_record", {**gap_record("g@example.com", "t", 1, 4, "gone"), "appended_at": 1}),
        partition=0)
    producer.produce_sync(kafka_config.topic("journal"), b"x", b"\xc3\x01not avro", partition=0)
    producer.close()

    rows = ensure_fields(load_journal(spark, kafka_config)).collect()
    hostile = sorted((r for r in rows if r["source"] == "h@example.com"),
                     key=lambda r: r["source_seq"])
    assert [r["source_seq"] for r in hostile] == [1, 2, 3, 4, 5]
    for r in hostile[:4]:
        assert _fields(r) == {}
        assert r["fields_error"], r["source_seq"]
    assert "DOCTYPE" in hostile[0]["fields_error"] or "doctype" in hostile[0]["fields_error"]
    assert set(extract_fields(CONTENTS[1])) < set(_fields(hostile[4]))
    assert hostile[4]["fields_error"] is None
    (gap,) = [r for r in rows if r["kind"] == "GAP"]
    assert gap["fields_error"] is None and _fields(gap) == {}
    (broken,) = [r for r in rows if r["decode_error"] is not None]
    assert broken["fields_error"] is None
