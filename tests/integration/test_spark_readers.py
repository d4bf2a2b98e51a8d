"""Spark reads apexps's topics natively: what spark-avro decodes in the JVM is, column by column,
what the Python codec decodes from the same Kafka bytes; damage becomes rows; windows select by
offset and by Kafka timestamp."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.codec import default_codec
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, Position
from broker.kafka_producer import KafkaProducer
from broker.records import (
    AccessEffect,
    AccessEntry,
    AccessKind,
    Publication,
    PublishType,
    Subscription,
    SubscriptionState,
    Topic,
    gap_record,
)
from broker.robust.acks import AckTag
from broker.robust.link_records import LinkItem, LinkKind
from broker.spark.journal_reader import JOURNAL_COLUMNS, decode_journal, load_journal
from broker.spark.readers import (
    LINK_COLUMNS,
    item_columns,
    load_access,
    load_acks,
    load_items,
    load_links,
    load_subscriptions,
    load_topics,
    registry_columns,
)
from broker.spark.source import kafka_source, parse_bound, window_options

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

T0 = 1_764_000_000_000  # a fixed instant (ms), so timestamps in the records are exact


def _norm(v: Any) -> Any:
    """A value as both decoders can be compared on: naive UTC datetimes, bytes, plain dicts."""
    if isinstance(v, datetime):
        return v.astimezone(UTC).replace(tzinfo=None) if v.tzinfo else v
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    if hasattr(v, "asDict"):
        return {k: _norm(x) for k, x in v.asDict().items()}
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_norm(x) for x in v]
    return v


def _raw(spark: Any, config: KafkaConfig, role: str) -> list[tuple[int, int, bytes | None]]:
    rows = kafka_source(spark, config, role).select("partition", "offset", "value").collect()
    return [(r["partition"], r["offset"], None if r["value"] is None else bytes(r["value"]))
            for r in rows]


def _compare(native: list[Any], expected: dict[tuple[int, ...], dict[str, Any]],
             key: Callable[[Any], tuple[int, ...]], columns: tuple[str, ...]) -> None:
    got = {key(r): r for r in native}
    assert set(got) == set(expected)
    for k, want in expected.items():
        for c in columns:
            assert _norm(got[k][c]) == _norm(want.get(c)), (k, c)


def test_journal_decodes_natively_exactly_as_the_python_codec(kafka_config: KafkaConfig,
                                                              spark: Any) -> None:
    """Journal records the broker wrote (data with every optional header, gaps) and records of
    the older v1 layout decode in the JVM to the Python codec's values, per column."""
    codec = default_codec()
    core = BrokerCore(kafka_config)
    core.open()
    try:
        for i in range(60):
            core.journal.append_sync(Publication(
                topic=f"t{i % 3}.quote", source=f"p{i % 4}@example.com",
                content=f"<q n='{i}'>\u00e9\x00</q>".encode(),
                publish_type=list(PublishType)[i % len(PublishType)],
                message_id=f"m{i}" if i % 2 else None, revision_id="r1" if i % 5 == 0 else None,
                publication_date=T0 + i if i % 3 else None,
                expiration_date="*" if i % 7 == 0 else None,
                permission_token="6747" if i % 4 == 0 else None,
                publisher_seq=i if i % 2 else None,
                fields={"n": [str(i), "x"], "empty": []} if i % 2 else {},
                options={"dataTiming": "noLaterThan=5"} if i % 3 == 0 else {}))
        producer = KafkaProducer(kafka_config)
        topic = kafka_config.topic("journal")
        producer.produce_sync(topic, b"g", codec.encode("journal_record", {
            **gap_record("g@example.com", "t.x", 3, 9, "publisher gone"),
            "appended_at": T0}), partition=0)
        old = {k: v for k, v in gap_record("o@example.com", "t.y", 1, 1, "v1").items()
               if k not in ("publisher_seq", "permission_token", "options")}
        producer.produce_sync(topic, b"o", codec.encode(
            "journal_record", {**old, "appended_at": T0, "fields": {"a": ["b"]}}, version=1),
            partition=1)
        producer.close()
    finally:
        core.close()

    expected = {(p, o): codec.decode(v, expect="journal_record")[1]
                for p, o, v in _raw(spark, kafka_config, "journal") if v is not None}
    assert len(expected) == 62
    df = load_journal(spark, kafka_config)
    assert "from_avro" in df._jdf.queryExecution().analyzed().toString()
    rows = df.collect()
    assert all(r["decode_error"] is None for r in rows)
    _compare(rows, expected, lambda r: (r["kafka_partition"], r["kafka_offset"]),
             JOURNAL_COLUMNS[:-1])


def test_links_explode_packs_and_match_the_python_codec(kafka_config: KafkaConfig,
                                                        spark: Any) -> None:
    """Link records the link log packed (several links per append) and a lone link_record of
    the older layout: one row per link record with its pack's Kafka coordinates."""
    codec = default_codec()
    core = BrokerCore(kafka_config)
    core.open()
    try:
        for n in range(1, 6):
            core.links.append_sync([
                LinkItem("A", LinkKind.DATA, Position(0, n), "fred@example.com", n),
                LinkItem.heartbeat("B"),
                LinkItem("C", LinkKind.DATA, Position(1, n), "wilma@example.com", n,
                         snapshot=True) if n % 2 else LinkItem.reset("C", "barney@example.com"),
            ])
        producer = KafkaProducer(kafka_config)
        producer.produce_sync(kafka_config.topic("links"), b"Z", codec.encode("link_record", {
            "link": "Z", "ordinal": 0, "epoch": 0, "epoch_start": 0, "bits": 16, "kind": "RESET",
            "owner": "z@example.com", "writer": 7, "recorded_at": T0}, version=1), partition=0)
        producer.close()
    finally:
        core.close()

    expected: dict[tuple[int, ...], dict[str, Any]] = {}
    for p, o, v in _raw(spark, kafka_config, "links"):
        assert v is not None
        name, rec = codec.decode(v)
        for i, one in enumerate(rec["records"] if name == "link_batch" else [rec]):
            expected[(p, o, i)] = one
    assert len(expected) > 15 and any(k[2] > 0 for k in expected)  # packs were exploded
    rows = load_links(spark, kafka_config).collect()
    assert all(r["decode_error"] is None for r in rows)
    _compare(rows, expected, lambda r: (r["kafka_partition"], r["kafka_offset"], r["pack_index"]),
             LINK_COLUMNS[1:-1])


def test_registries_and_items_match_the_python_codec(kafka_config: KafkaConfig,
                                                     spark: Any) -> None:
    """Topics, subscriptions and access entries the registries wrote (a delete included), the
    item store's headers, versions and markers, and the acknowledgement log's records decode to
    the Python codec's values."""
    codec = default_codec()
    core = BrokerCore(kafka_config)
    core.open()
    try:
        core.topics.put(Topic(name="equity.quote", created_at=T0, owner="fred@example.com",
                              description="quotes", revision=3))
        core.topics.put(Topic(name="gone", created_at=T0))
        core.topics.delete("gone")
        core.subscriptions.put(Subscription(
            subscriber="barney@example.com", subscription_id="s1", topic="equity.quote",
            duration_s=600, state=SubscriptionState.ACTIVE, created_at=T0,
            selector_class="jms", selector="n > 3", expires_at=T0 + 600_000, link_id="L1",
            originator="barney@example.com", trans_id=5))
        core.access.put(AccessEntry(entry_id="e1", originator="*@example.com",
                                    tokens=("pubsub:subscribe", "core:data"),
                                    effect=AccessEffect.ALLOW, created_at=T0))
        core.access.put(AccessEntry(entry_id="e2", originator="*", tokens=("67*",),
                                    effect=AccessEffect.DENY, created_at=T0, topic="t",
                                    kind=AccessKind.PERMTOKEN))
        core.items.recover()
        for i in range(4):
            core.journal.append_sync(Publication(
                topic="q.items", source="s@example.com", content=f"<v>{i}</v>".encode(),
                publish_type=PublishType.IMAGE if i == 0 else PublishType.UPDATE,
                message_id="item1"))
        core.journal.flush()
        core.items.apply(e for e in core.journal.read_source("s@example.com"))
        core.items.checkpoint()
        core.acks.acked(AckTag("barney@example.com", 0, 7, 7), at_ms=T0)
        core.acks.acked(AckTag("barney@example.com", 1, 9, 1), at_ms=T0 + 1)
        core.acks.flush()
    finally:
        core.close()

    for role, load in (("topics", load_topics), ("subscriptions", load_subscriptions),
                       ("access", load_access), ("items", load_items), ("acks", load_acks)):
        expected: dict[tuple[int, ...], dict[str, Any]] = {}
        for p, o, v in _raw(spark, kafka_config, role):
            if v is None:
                expected[(p, o)] = {"deleted": True}
                continue
            name, rec = codec.decode(v)
            expected[(p, o)] = {**rec, "deleted": False, "record_type": name}
        rows = load(spark, kafka_config).collect()
        assert rows and all(r["decode_error"] is None for r in rows), role
        if role == "items":
            assert {r["record_type"] for r in rows} >= {"item_header", "item_version",
                                                        "item_marker"}
            columns = item_columns()[1:-1]
        else:
            columns = registry_columns(role)[1:-1]
        _compare(rows, expected, lambda r: (r["kafka_partition"], r["kafka_offset"]), columns)
    deleted = [r["kafka_key"] for r in load_topics(spark, kafka_config).collect() if r["deleted"]]
    assert deleted == ["gone"]


def test_damaged_records_become_rows_with_their_error(kafka_config: KafkaConfig,
                                                      spark: Any) -> None:
    """Garbage, a truncated body, an unknown fingerprint and a record of another schema each
    give one row with `decode_error` and no record; the job completes and the good record reads."""
    core = BrokerCore(kafka_config)
    core.open()
    try:
        good = core.journal.append_sync(Publication(topic="a.b", source="s", content=b"<x/>"))
    finally:
        core.close()
    codec = default_codec()
    (_, _, value), = _raw(spark, kafka_config, "journal")
    assert value is not None
    link = codec.encode("link_record", {"link": "L", "ordinal": 0, "epoch": 0, "epoch_start": 0,
                                        "bits": 16, "kind": "RESET", "writer": 1,
                                        "recorded_at": T0})
    damaged = {
        b"garbage": "bad marker",
        b"\xc3\x01": "bad marker",
        value[:-4]: "does not decode as journal_record v2",
        b"\xc3\x01" + b"\x09" * 8 + b"zz": "unknown schema fingerprint 0909090909090909",
        link: "expected a journal_record record, found link_record",
    }
    producer = KafkaProducer(kafka_config)
    for v in damaged:
        producer.produce_sync(kafka_config.topic("journal"), b"s", v, partition=0)
    producer.close()
    rows = load_journal(spark, kafka_config).collect()
    assert len(rows) == 1 + len(damaged)
    ok = [r for r in rows if r["decode_error"] is None]
    assert [(r["source"], r["source_seq"]) for r in ok] == [("s", good.source_seq)]
    bad = sorted((r for r in rows if (r["kafka_partition"], r["kafka_offset"]) != good.position),
                 key=lambda r: (r["kafka_partition"], r["kafka_offset"]))
    for r, why in zip(bad, damaged.values(), strict=True):
        assert why in r["decode_error"]
        assert all(r[c] is None for c in JOURNAL_COLUMNS[:-1]), r

    # Without the Python fallback the job names the same rows in SQL, and runs no Python.
    jvm_only = decode_journal(kafka_source(spark, kafka_config, "journal"), python_fallback=False)
    assert "BatchEvalPython" not in jvm_only._jdf.queryExecution().executedPlan().toString()
    errors = {(r["kafka_partition"], r["kafka_offset"]): r["decode_error"]
              for r in jvm_only.collect()}
    assert [errors[(r["kafka_partition"], r["kafka_offset"])] for r in bad][-2:] == [
        "record written with schema fingerprint 0909090909090909, which no shipped version of "
        "journal_record has",
        f"record written with schema fingerprint {link[2:10].hex()}, which no shipped version "
        "of journal_record has"]


def test_window_selects_by_kafka_timestamp_and_by_offset(kafka_config: KafkaConfig,
                                                        spark: Any) -> None:
    """[start, end) by Kafka timestamp picks exactly the records stamped inside it, whatever
    their partition; a start after every record gives no rows; offsets bound per partition."""
    from confluent_kafka import Producer

    codec = default_codec()
    core = BrokerCore(kafka_config)
    core.open()
    core.close()
    producer = Producer({"bootstrap.servers": kafka_config.bootstrap})
    topic = kafka_config.topic("journal")
    # Stamped an hour ago, on a whole second: T0 is older than the journal's retention, and
    # Kafka's retention check (every five minutes) deletes such records whenever it runs.
    stamp0 = (int(time.time()) - 3600) * 1000
    for i in range(12):
        value = codec.encode("journal_record", {
            **gap_record("w@example.com", "t", i + 1, i + 1, "r"), "appended_at": T0})
        producer.produce(topic, value, b"w", partition=i % 3, timestamp=stamp0 + 1000 * i)
    assert producer.flush(30) == 0

    def seqs(**window: Any) -> list[int]:
        df = load_journal(spark, kafka_config, **window)
        return sorted(r["source_seq"] for r in df.select("source_seq").collect())

    at = datetime.fromtimestamp(stamp0 / 1000, UTC)
    assert seqs(start=at + timedelta(seconds=3), end=at + timedelta(seconds=8)) == [4, 5, 6, 7, 8]
    assert seqs(start=at + timedelta(seconds=10)) == [11, 12]
    assert seqs(end=at + timedelta(seconds=2)) == [1, 2]
    assert seqs(start=at + timedelta(days=1)) == []
    # Partition 1 holds seqs 2, 5, 8, 11 at offsets 0..3.
    assert seqs(start={0: 4, 1: 1, 2: 4}, end={0: 4, 1: 3, 2: 4}) == [5, 8]


def test_window_options_name_the_kafka_source_options() -> None:
    """Times become startingTimestamp/endingTimestamp in ms (naive is UTC), offsets JSON."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert window_options("j", at, at.replace(tzinfo=None) + timedelta(seconds=1)) == {
        "startingOffsets": "earliest", "endingOffsets": "latest",
        "startingTimestamp": "1767225600000", "endingTimestamp": "1767225601000",
        "startingOffsetsByTimestampStrategy": "latest"}
    assert window_options("j", {0: 5}, "latest") == {
        "startingOffsets": '{"j": {"0": 5}}', "endingOffsets": "latest"}


def test_bounds_parse_from_the_command_line() -> None:
    """--from/--to take earliest, latest, offsets JSON or an ISO time; anything else is refused
    with the text in the message."""
    assert parse_bound("2026-01-01T00:00:00Z") == datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_bound("2026-01-01 00:00") == datetime(2026, 1, 1)
    assert parse_bound(" latest ") == "latest"
    assert parse_bound('{"j": {"0": 5}}') == '{"j": {"0": 5}}'
    with pytest.raises(ValueError, match="'yesterday' is neither"):
        parse_bound("yesterday")


def test_a_fingerprint_the_job_lacks_decodes_through_the_python_codec(
        spark: Any, tmp_path: Any) -> None:
    """A job whose schemas lack journal_record v1 and link_record v1 still decodes records of
    those versions, through the Python codec on the executors, to the values spark-avro gives
    a job that has them."""
    import shutil

    from broker.codec import AVRO_DIR, Codec
    from broker.spark.avro_decode import decode_values, record_column

    for path in AVRO_DIR.glob("*.avsc"):
        if path.name not in ("journal_record.v1.avsc", "link_record.v1.avsc"):
            shutil.copy(path, tmp_path / path.name)
    partial, full = Codec(tmp_path), default_codec()
    values = [
        full.encode("journal_record", {
            **{k: v for k, v in gap_record("o@x", "t", 1, 2, "v1").items()
               if k not in ("publisher_seq", "permission_token", "options")},
            "appended_at": T0, "fields": {"a": ["b", "c"]}}, version=1),
        full.encode("link_record", {"link": "Z", "ordinal": 0, "epoch": 0, "epoch_start": 0,
                                    "bits": 16, "kind": "RESET", "owner": "z@x", "writer": 7,
                                    "recorded_at": T0}, version=1),
    ]
    raw = spark.createDataFrame([(v,) for v in values], "value binary")
    names = ["journal_record", "link_record"]
    cols = ["_schema", *[record_column(n) for n in names], "decode_error"]
    fallback = decode_values(raw, names, codec=partial).select(*cols).collect()
    native = decode_values(raw, names, codec=full).select(*cols).collect()
    assert [r["_schema"] for r in fallback] == names
    assert [r["decode_error"] for r in fallback] == [None, None]
    assert _norm(fallback) == _norm(native)


def test_the_python_fallback_is_needed_only_for_a_fingerprint_the_job_lacks(
        spark: Any, tmp_path: Any) -> None:
    """`needs_python` is false over records, garbage and empty values the JVM decodes or
    names itself (then both decodes give the same rows), true once one record has a
    fingerprint none of the names' shipped versions has."""
    import shutil

    from broker.codec import AVRO_DIR, Codec
    from broker.spark.avro_decode import decode_values, needs_python, record_column

    for path in AVRO_DIR.glob("*.avsc"):
        if path.name != "journal_record.v1.avsc":
            shutil.copy(path, tmp_path / path.name)
    partial, full = Codec(tmp_path), default_codec()
    v2 = full.encode("journal_record", {**gap_record("o@x", "t", 1, 2, "r"), "appended_at": T0})
    v1 = full.encode("journal_record", {
        **{k: v for k, v in gap_record("o@x", "t", 3, 4, "r").items()
           if k not in ("publisher_seq", "permission_token", "options")},
        "appended_at": T0, "fields": {}}, version=1)
    known = spark.createDataFrame([(v2,), (b"garbage",), (None,)], "value binary")
    names = ["journal_record"]
    assert not needs_python(known, names)
    cols = ["_schema", record_column("journal_record"), "decode_error"]
    assert _norm(decode_values(known, names, python_fallback=False).select(*cols).collect()) \
        == _norm(decode_values(known, names).select(*cols).collect())
    stranger = spark.createDataFrame([(v2,), (v1,)], "value binary")
    assert needs_python(stranger, names, codec=full) is False
    assert needs_python(stranger, names, codec=partial) is True
