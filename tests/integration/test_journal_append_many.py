"""Journal.append_many against the real Kafka: numbering, failures, refusals, recovery."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence

import pytest
from structlog.testing import capture_logs

from broker.core import BrokerCore
from broker.journal import Appended, Journal
from broker.kafka_io import KafkaConfig, ensure_topics, watermarks
from broker.kafka_producer import KafkaProducer
from broker.records import Publication, RecordKind
from common.errors import InvalidParameter, InvalidTopicName, JournalUnavailable

pytestmark = pytest.mark.kafka

#: The journal topic's record-batch limit in the failure tests; BIG never fits it (random bytes
#: do not compress), SMALL always does.
TOPIC_LIMIT = 4000
BIG = 20_000


@pytest.fixture(name="small_core")
def _small_core(kafka_config: KafkaConfig) -> Iterator[BrokerCore]:
    """A BrokerCore whose journal topic refuses record batches over TOPIC_LIMIT bytes."""
    core = BrokerCore(kafka_config)
    topics = core.kafka_topics()
    parts, conf = topics[kafka_config.topic("journal")]
    topics[kafka_config.topic("journal")] = (parts, conf | {"max.message.bytes": str(TOPIC_LIMIT)})
    ensure_topics(kafka_config, topics)
    core.open()
    yield core
    core.close()


def _pub(source: str, body: bytes = b"<n/>", topic: str = "equity.quote") -> Publication:
    return Publication(topic=topic, source=source, content=body)


def _append_many(journal: Journal, pubs: Sequence[Publication],
                 ) -> tuple[list[int], list[Appended | JournalUnavailable]]:
    """append_many, then wait for its one callback; returns (seqs, results)."""
    done = threading.Event()
    got: list[list[Appended | JournalUnavailable]] = []

    def cb(results: list[Appended | JournalUnavailable]) -> None:
        got.append(results)
        done.set()

    seqs = journal.append_many(pubs, cb)
    assert done.wait(60), "append_many never called back"
    assert len(got) == 1
    return seqs, got[0]


def _sources_by_partition(journal: Journal, count: int) -> list[str]:
    """`count` source names that land on `count` different journal partitions."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < count:
        found.setdefault(journal.partition_for(f"src{i}@example.com"), f"src{i}@example.com")
        i += 1
    return list(found.values())


def _gap_seqs(journal: Journal, source: str) -> set[int]:
    return {s for e in journal.read_source(source) if e.kind is RecordKind.GAP
            for s in range(e.source_seq, (e.gap_to or e.source_seq) + 1)}


def test_seqs_are_contiguous_per_source_across_batches_and_appends(core: BrokerCore) -> None:
    """Interleaved sources in one batch each get consecutive seqs in the order given, on every
    partition; single appends and later batches continue each source's numbering."""
    a, b, c = _sources_by_partition(core.journal, 3)
    order = [a, b, a, c, a, b, c, c, a]
    pubs = [_pub(s, f"<n i='{i}'/>".encode()) for i, s in enumerate(order)]
    seqs, results = _append_many(core.journal, pubs)
    assert seqs == [1, 1, 2, 1, 3, 2, 2, 3, 4]
    assert all(isinstance(r, Appended) for r in results)
    assert [(r.source, r.source_seq) for r in results] == list(zip(order, seqs, strict=True))
    assert core.journal.append_sync(_pub(b)).source_seq == 3
    more, _ = _append_many(core.journal, [_pub(b), _pub(a), _pub(b)])
    assert more == [4, 5, 5]
    for source in (a, b, c):
        entries = list(core.journal.read_source(source))
        assert [e.source_seq for e in entries] == list(range(1, len(entries) + 1))
        assert all(e.kind is RecordKind.DATA for e in entries)
    by_position = {r.position: r for r in results if isinstance(r, Appended)}
    for entry in core.journal.read_from():
        if entry.position in by_position:
            assert entry.content == pubs[results.index(by_position[entry.position])].content


def test_a_failed_record_gets_its_error_and_a_gap_as_with_append(small_core: BrokerCore) -> None:
    """A record Kafka does not take fails alone in its result, its seq is explained by a GAP
    record exactly as a failed `append`'s is, and the source's numbering goes on."""
    journal = small_core.journal
    ok1, bad, ok2 = _sources_by_partition(journal, 3)
    big = os.urandom(BIG)
    seqs, results = _append_many(journal, [_pub(ok1), _pub(bad, big), _pub(ok2)])
    assert seqs == [1, 1, 1]
    assert isinstance(results[0], Appended) and isinstance(results[2], Appended)
    assert isinstance(results[1], JournalUnavailable)
    assert "too large" in str(results[1])

    single: list[Exception | None] = []
    done = threading.Event()
    journal.append(_pub(bad, big), lambda err, res: (single.append(err), done.set()))
    assert done.wait(60) and isinstance(single[0], JournalUnavailable)

    after = journal.append_sync(_pub(bad))
    assert after.source_seq == 3
    journal.flush()
    gaps = [e for e in journal.read_source(bad) if e.kind is RecordKind.GAP]
    assert sorted((g.source_seq, g.gap_to) for g in gaps) == [(1, 1), (2, 2)]
    assert gaps[0].gap_reason == gaps[1].gap_reason
    assert [e.source_seq for e in journal.read_source(bad) if e.kind is RecordKind.DATA] == [3]
    for good in (ok1, ok2):
        assert [e.source_seq for e in journal.read_source(good)] == [1]


def test_a_record_kafka_refuses_outright_is_explained(kafka_config: KafkaConfig,
                                                      core: BrokerCore) -> None:
    """A record over the producer's own size limit: `append` raises and takes no seq;
    in a batch it gets its error and a GAP while the records around it are stored."""
    producer = KafkaProducer(kafka_config, **{"message.max.bytes": 10_000})
    journal = Journal(kafka_config, producer)
    try:
        journal.recover()
        source = "fred@example.com"
        with pytest.raises(JournalUnavailable):
            journal.append(_pub(source, os.urandom(BIG)), lambda err, res: None)
        assert journal.next_seq(source) == 1
        seqs, results = _append_many(journal, [_pub(source, b"<a/>"),
                                               _pub(source, os.urandom(BIG)),
                                               _pub(source, b"<c/>")])
        assert seqs == [1, 2, 3]
        assert [type(r) for r in results] == [Appended, JournalUnavailable, Appended]
        journal.flush()
        entries = list(journal.read_source(source))
        assert [(e.kind, e.source_seq) for e in entries] == [
            (RecordKind.DATA, 1), (RecordKind.DATA, 3), (RecordKind.GAP, 2)]
    finally:
        producer.close()


@pytest.mark.parametrize(("bad", "error"), [
    (_pub("fred@example.com", topic="not a topic"), InvalidTopicName),
    (_pub(""), InvalidParameter),
])
def test_invalid_publication_refuses_the_whole_batch(core: BrokerCore, bad: Publication,
                                                     error: type[Exception]) -> None:
    """One invalid publication raises, naming its index, before any seq is taken or any
    record written."""
    journal = core.journal
    before = [watermarks(core.config, journal.topic, p) for p in range(3)]
    with pytest.raises(error) as info:
        journal.append_many([_pub("fred@example.com"), bad], lambda results: None)
    assert "publication 1 of the batch" in info.value.__notes__
    journal.flush()
    assert [watermarks(core.config, journal.topic, p) for p in range(3)] == before
    assert journal.next_seq("fred@example.com") == 1


def test_empty_batch_calls_back_at_once(core: BrokerCore) -> None:
    """An empty batch returns no seqs and calls back with no results."""
    got: list[list[Appended | JournalUnavailable]] = []
    assert core.journal.append_many([], got.append) == []
    assert got == [[]]


def test_a_raising_callback_does_not_stop_deliveries(core: BrokerCore) -> None:
    """A callback that raises is logged; the poll thread goes on delivering reports."""

    def caller_bug(*args: object) -> None:
        raise RuntimeError("caller bug")

    source = "fred@example.com"
    with capture_logs() as logs:
        core.journal.append(_pub(source), caller_bug)
        core.journal.append_many([_pub(source)], caller_bug)
        _, results = _append_many(core.journal, [_pub(source)])
        assert core.journal.append_sync(_pub(source)).source_seq == 4
    assert [r.source_seq for r in results if isinstance(r, Appended)] == [3]
    failures = [e["event"] for e in logs if e["log_level"] == "error"]
    assert failures == ["append callback failed", "append_many callback failed"]


def test_batched_appends_survive_a_restart(kafka_config: KafkaConfig) -> None:
    """After batches that cross sparse-index buckets, a new process recovers the next seq of
    every source and reads from the middle of a source."""
    core = BrokerCore(kafka_config)
    core.open()
    sources = ["fred@example.com", "barney@example.com"]
    try:
        for first in range(0, 2500, 500):
            pubs = [_pub(sources[i % 2], f"<n i='{first + i}'/>".encode()) for i in range(500)]
            _, results = _append_many(core.journal, pubs)
            assert all(isinstance(r, Appended) for r in results)
    finally:
        core.close()
    again = BrokerCore(kafka_config)
    again.open()
    try:
        for source in sources:
            assert again.journal.next_seq(source) == 1251
        tail = list(again.journal.read_source("fred@example.com", 1200))
        assert [e.source_seq for e in tail] == list(range(1201, 1251))
        assert tail[-1].content == b"<n i='2498'/>"
    finally:
        again.close()


@pytest.mark.parametrize("order", ["reversed", "interleaved"])
def test_the_seq_index_holds_whatever_order_delivery_reports_come_in(
        core: BrokerCore, order: str) -> None:
    """A flush() and the poll thread can serve delivery reports at once, so a later record's
    report may be booked before an earlier one's. The sparse seq index must still point at each
    bucket's first record, or read_source starts past it and loses the records before."""
    journal = core.journal
    seqs, results = _append_many(journal, [_pub("src-reorder") for _ in range(30)])
    appended = [r for r in results if isinstance(r, Appended)]
    assert len(appended) == 30
    # Book them again from nothing, in another order, as a fresh process's reports would be.
    with journal._book:
        journal._durable.pop("src-reorder")
        journal._checkpoints.forget("src-reorder")
    booked = appended[::-1] if order == "reversed" else appended[1::2] + appended[0::2]
    for a in booked:
        with journal._book:
            journal._on_durable(a.source, a.source_seq, a.position)
    got = [e.source_seq for e in journal.read_source("src-reorder")]
    assert got == seqs
    assert journal._durable["src-reorder"].position == appended[-1].position  # the highest seq's
