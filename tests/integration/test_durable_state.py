"""Kafka restarts, reads, and bad input against the real Kafka."""

from __future__ import annotations

import time

import pytest

from adapters.local.kafka import LocalKafka
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, watermarks
from broker.records import (
    AccessEffect,
    AccessEntry,
    Publication,
    PublishType,
    RecordKind,
    Subscription,
    SubscriptionState,
    Topic,
    now_ms,
)
from common.errors import InvalidParameter, InvalidTopicName, RecordSchemaError

pytestmark = pytest.mark.kafka


def _pub(topic: str = "music.jazz.milesdavis", source: str = "fred@example.com",
         body: bytes = b"<note/>", **kw: object) -> Publication:
    return Publication(topic=topic, source=source, content=body, **kw)  # type: ignore[arg-type]


def _all_watermarks(core: BrokerCore) -> dict[str, list[tuple[int, int]]]:
    return {
        name: [watermarks(core.config, name, p) for p in range(parts)]
        for name, (parts, _) in core.kafka_topics().items()
    }


def test_state_survives_a_kafka_restart(private_kafka: LocalKafka) -> None:
    """Stop and restart Kafka on the same data dir: topics, subscriptions, access entries and
    source seqs are all still there, and appends continue from the next seq."""
    state = private_kafka.start()
    # the JVM names its collector first, whichever KAFKA_JVM_PERFORMANCE_OPTS chose
    assert "Using " in (private_kafka.data_dir / "logs" / "gc.log").read_text()
    config = KafkaConfig(bootstrap=state.bootstrap, namespace="restart")
    core = BrokerCore(config)
    core.open()
    core.create_topic("music.jazz.milesdavis", owner="fred@example.com")
    core.create_topic("equity.quote")
    core.delete_topic("equity.quote")
    sub = Subscription(subscriber="barney@example.com", subscription_id="1",
                       topic="music.jazz.milesdavis", duration_s=3600,
                       state=SubscriptionState.ACTIVE, created_at=now_ms(),
                       selector_class="JMS", selector="symbol = 'XMPL'")
    core.subscriptions.put(sub)
    entry = AccessEntry(entry_id="slate-deny", originator="mr.slate@example.com",
                        tokens=("pubsub:subscribe",), effect=AccessEffect.DENY,
                        created_at=now_ms(), topic="music.jazz.milesdavis")
    core.access.put(entry)
    last = [core.journal.append_sync(_pub(source=f"s{i % 2}")) for i in range(10)][-1]
    core.close()

    private_kafka.stop()
    state2 = private_kafka.start()
    assert state2.bootstrap == state.bootstrap and state2.pid != state.pid

    again = BrokerCore(config)
    again.open()
    try:
        assert [t.name for t in again.topics] == ["music.jazz.milesdavis"]
        assert again.topics.get("music.jazz.milesdavis").owner == "fred@example.com"
        assert again.subscriptions.get(sub.key) == sub
        assert again.access.get("slate-deny") == entry
        assert again.journal.next_seq(last.source) == last.source_seq + 1
        nxt = again.journal.append_sync(_pub(source=last.source))
        assert nxt.source_seq == last.source_seq + 1
    finally:
        again.close()


def test_reads_by_source_position_and_time(core: BrokerCore) -> None:
    """Records come back by (source, after seq), from a position, and by time range."""
    first = [core.journal.append_sync(_pub(body=f"<n i='{i}'/>".encode())) for i in range(5)]
    # The time read needs appends on both sides of a millisecond boundary: a record's Kafka
    # timestamp is taken when it is produced, and an unlingered append can come back within
    # that same millisecond, so step past it before and after taking `mid`.
    time.sleep(0.01)
    mid = now_ms()
    time.sleep(0.01)
    later = [core.journal.append_sync(_pub(topic="WKT=Topics", source="barney@example.com"))
             for _ in range(3)]
    after2 = [e.source_seq for e in core.journal.read_source("fred@example.com", 2)]
    assert after2 == [3, 4, 5]
    assert [e.content for e in core.journal.read_source("fred@example.com", 4)] == [b"<n i='4'/>"]
    by_topic = list(core.journal.read_from(topic="WKT=Topics"))
    assert [e.source_seq for e in by_topic] == [a.source_seq for a in later]
    pos = {first[3].position.partition: first[3].position.offset}
    from_pos = [e.source_seq for e in core.journal.read_from(pos, topic="music.jazz.milesdavis")]
    assert from_pos == [4, 5]
    timed = list(core.journal.read_time(mid))
    assert {e.source for e in timed} == {"barney@example.com"} and len(timed) == 3
    assert all(e.kind is RecordKind.DATA for e in timed)


def test_publication_fields_round_trip(core: BrokerCore) -> None:
    """Every field of a publication is stored and read back as given."""
    pub = _pub(publish_type=PublishType.CORRECTION, message_id="m1", revision_id="r2",
               publication_date=1_700_000_000_123, expiration_date="*",
               permission_token="6747", publisher_seq=9,
               fields={"symbol": ["XMPL"], "net-change-pct": ["5.5", "6"]},
               options={"dataTiming": "noLaterThan=3000"})
    core.journal.append_sync(pub)
    (got,) = core.journal.read_source(pub.source, 0)
    for name in ("topic", "source", "content", "message_id", "revision_id", "publication_date",
                 "expiration_date", "permission_token", "publisher_seq", "content_type"):
        assert getattr(got, name) == getattr(pub, name), name
    assert got.publish_type is PublishType.CORRECTION
    assert got.fields == {"symbol": ["XMPL"], "net-change-pct": ["5.5", "6"]}
    assert got.options == {"dataTiming": "noLaterThan=3000"}


@pytest.mark.parametrize("bad", [
    _pub(topic="not a topic"),
    _pub(topic="apex=pubsub/x@y"),
    _pub(topic="WKT=Nonsense"),
    _pub(source=""),
    _pub(source="x" * 5000),
    _pub(publish_type="bogus"),  # type: ignore[arg-type]
    _pub(fields={"a": [1]}),  # type: ignore[dict-item]
])
def test_bad_publication_is_refused_and_writes_nothing(core: BrokerCore,
                                                       bad: Publication) -> None:
    """Invalid topic names, sources or records raise a coded error; no Kafka topic grows and
    no seq is consumed."""
    before = _all_watermarks(core)
    with pytest.raises((InvalidTopicName, InvalidParameter, RecordSchemaError)) as info:
        core.journal.append_sync(bad)
    assert int(info.value.code) in (501, 553)
    core.journal.flush()
    assert _all_watermarks(core) == before
    assert core.journal.next_seq(bad.source or "x") == 1


def test_bad_registry_record_is_refused_and_writes_nothing(core: BrokerCore) -> None:
    """A registry record that does not fit its schema, or a bad topic name, writes nothing."""
    before = _all_watermarks(core)
    with pytest.raises(RecordSchemaError):
        core.topics.put(Topic(name="ok.name", created_at="yesterday"))  # type: ignore[arg-type]
    with pytest.raises(InvalidTopicName):
        core.create_topic("bad/name")
    with pytest.raises(InvalidParameter):
        core.delete_topic("never.created")
    assert _all_watermarks(core) == before
    assert len(core.topics) == 0


def test_topic_names_work_whatever_the_kafka_layout(core: BrokerCore) -> None:
    """Names Kafka itself would refuse as topic names (WKT=Topics) work as APEX topics."""
    core.create_topic("music.jazz.milesdavis")
    core.create_topic("WKT=Topics")
    assert {t.name for t in core.topics} == {"music.jazz.milesdavis", "WKT=Topics"}
    assert core.journal.append_sync(_pub(topic="WKT=Topics")).source_seq == 1
