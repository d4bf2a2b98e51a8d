"""The link log against real Kafka (broker/robust/links.py): invariants 3 and 4 — link seqs rise
by one, 0 only on reset, wrap to 1; any range within retention is refilled exactly, also after a
reopen and after a kill -9 of the appender."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator

import pytest

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, Position
from broker.records import Publication, PublishType
from broker.robust.config import RobustConfig
from broker.robust.link_records import LinkItem, LinkKind, LinkRecord
from broker.robust.links import LinkLog
from broker.robust.refill import refill
from common.errors import (
    BadGapRange,
    LinkContextGone,
    NotYourLink,
    RebuildRefused,
)

pytestmark = [pytest.mark.kafka]


def _data(link: str, n: int) -> LinkItem:
    return LinkItem(link, LinkKind.DATA, Position(0, n), "fred@example.com", n)


def _reopened(config: KafkaConfig, **kwargs: object) -> BrokerCore:
    core = BrokerCore(config, **kwargs)  # type: ignore[arg-type]
    core.open()
    return core


def test_a_new_link_begins_with_a_reset_and_counts_up(core: BrokerCore) -> None:
    """The first item on a link is preceded by its epoch-0 reset (link seq 0); then 1, 2, …"""
    recs = core.links.append_sync([_data("L", 1), LinkItem.heartbeat("L"), _data("L", 2)])
    assert [(r.kind, r.link_seq, r.epoch, r.ordinal) for r in recs] == [
        (LinkKind.RESET, 0, 0, 0), (LinkKind.DATA, 1, 0, 1), (LinkKind.HEARTBEAT, 2, 0, 2),
        (LinkKind.DATA, 3, 0, 3)]
    assert core.links.last("L") == core.links.head("L")
    head = core.links.last("L")
    assert head is not None and head.link_seq == 3 and head.epoch == 0


def test_exact_refill_of_a_range_and_after_reopen(kafka_config: KafkaConfig,
                                                  core: BrokerCore) -> None:
    """read_range returns exactly what each seq carried, in order; a reopened broker returns
    the same records and continues after the last durable seq."""
    core.links.append_sync([_data("A", n) if n % 3 else LinkItem.heartbeat("A")
                            for n in range(1, 3000)])
    core.links.append_sync([_data("B", n) for n in range(1, 50)])
    got = core.links.read_range("A", 1000, 2100)
    assert [r.link_seq for r in got] == list(range(1000, 2101))
    assert all(r.link == "A" for r in got)
    assert [r.source_seq for r in got if r.kind is LinkKind.DATA] == \
        [n for n in range(1000, 2101) if n % 3]
    core.links.flush()
    core.close()
    again = _reopened(kafka_config)
    try:
        assert again.links.read_range("A", 1000, 2100) == got
        assert again.links.read_range("A", 2999) == again.links.read_range("A", 2999, 2999)
        head = again.links.last("A")
        assert head is not None and head.link_seq == 2999
        (nxt,) = again.links.append_sync([_data("A", 3000)])
        assert (nxt.link_seq, nxt.epoch, nxt.ordinal) == (3000, 0, 3000)
        assert again.links.read_range("A", 3001) == []  # nothing after the newest
    finally:
        again.close()


def test_a_read_seeks_through_the_sparse_index(kafka_config: KafkaConfig, core: BrokerCore,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a recent range scans about one index bucket of the link, not the partition —
    also after a reopen, from the checkpoints in Kafka."""
    from broker.robust import links as links_module

    core.links.append_sync([_data("S", n) for n in range(1, 5001)])
    core.links.flush()
    scanned = [0]
    real = links_module.read_partition

    def counting(*args: object, **kwargs: object) -> Iterator[object]:
        for rec in real(*args, **kwargs):  # type: ignore[arg-type]
            scanned[0] += 1
            yield rec

    monkeypatch.setattr(links_module, "read_partition", counting)
    assert len(core.links.read_range("S", 4900, 4910)) == 11
    assert scanned[0] <= links_module.LINK_BUCKET + 20
    core.close()
    again = _reopened(kafka_config)
    try:
        scanned[0] = 0
        assert len(again.links.read_range("S", 4900, 4910)) == 11
        assert scanned[0] <= links_module.LINK_BUCKET + 20
    finally:
        again.close()


def test_refill_brings_back_the_journaled_messages(kafka_config: KafkaConfig,
                                                   core: BrokerCore) -> None:
    """refill pairs each link record with its journal entry: same content, type and token."""
    items = []
    for n in range(20):
        pub = Publication("equity.quote", "fred@example.com", f"<q n='{n}'/>".encode(),
                          PublishType.CORRECTION if n % 2 else PublishType.UPDATE,
                          permission_token="6747" if n % 5 == 0 else None)
        entry = core.journal.append_sync(pub)
        items.append(LinkItem("desk-1", LinkKind.DATA, entry.position, entry.source,
                              entry.source_seq))
        if n % 7 == 6:
            items.append(LinkItem.heartbeat("desk-1"))
    core.links.append_sync(items)
    core.links.flush()
    core.close()
    again = _reopened(kafka_config)
    try:
        got = refill(again.links, again.journal, "desk-1", 5, 12)
        assert [r.link_seq for r, _ in got] == list(range(5, 13))
        for record, entry in got:
            if record.kind is LinkKind.HEARTBEAT:
                assert entry is None
                continue
            assert entry is not None and entry.source_seq == record.source_seq
            n = entry.source_seq - 1
            assert entry.content == f"<q n='{n}'/>".encode()
            assert entry.permission_token == ("6747" if n % 5 == 0 else None)
    finally:
        again.close()


def _links_on(part: int, count: int, log: LinkLog) -> list[str]:
    """`count` link ids that all hash to links partition `part`."""
    names = (f"pack-{n}" for n in range(100_000))
    return [name for name in names if log.partition_for(name) == part][:count]


def test_one_append_goes_to_kafka_packed_and_reads_back_per_link(
        kafka_config: KafkaConfig) -> None:
    """A fan-out turn's records on many links of one partition travel in a few Kafka records
    (a link_batch each); every link still reads back exactly, also after a reopen, and numbering
    continues after recovery."""
    from broker.robust import links as links_module

    kafka_config = dataclasses.replace(kafka_config, link_partitions=3)
    core = _reopened(kafka_config)
    try:
        desks = _links_on(0, 40, core.links)
        other = _links_on(1, 1, core.links)[0]
        for turn in range(1, 6):  # five turns, each one record on every desk, and five on `other`
            core.links.append_sync([_data(desk, turn) for desk in desks]
                                   + [_data(other, 10 * turn + k) for k in range(5)])
        core.links.flush()
        part0 = list(links_module.read_partition(kafka_config, core.links.topic, 0))
        records = sum(len(core.links._decode(r.value)) for r in part0 if r.value is not None)
        assert records == 40 * 6  # each desk: its reset and five DATA
        assert len(part0) <= 6, "one Kafka record per turn, the first turn's resets included"
        assert all(r.key is None for r in part0), "a pack of several links has no key"
        part1 = list(links_module.read_partition(kafka_config, core.links.topic, 1))
        assert [r.key for r in part1] == [other.encode()] * 5, "one link's pack keeps its key"

        def seen(log: LinkLog) -> dict[str, list[int | None]]:
            return {desk: [r.source_seq for r in log.read_range(desk, 1, 5)]
                    for desk in [*desks, other]}

        want = {**{desk: [1, 2, 3, 4, 5] for desk in desks}, other: [10, 11, 12, 13, 14]}
        assert seen(core.links) == want
    finally:
        core.close()
    again = _reopened(kafka_config)
    try:
        assert seen(again.links) == want
        (nxt,) = again.links.append_sync([_data(desks[7], 6)])
        assert (nxt.link_seq, nxt.ordinal) == (6, 6)
    finally:
        again.close()


def test_link_records_written_one_per_kafka_record_still_read(kafka_config: KafkaConfig,
                                                              core: BrokerCore) -> None:
    """What apexps wrote before packing (one link_record per Kafka record, keyed by the link)
    is recovered and refilled as before, beside packs of the same link."""
    log = core.links
    old = log.append_sync([_data("legacy", n) for n in range(1, 4)])  # reset + 3, packed
    codec = core.codec
    for n in range(4, 7):  # then three the old way, continuing the link
        record = LinkRecord("legacy", n, 0, 0, old[0].bits, n, LinkKind.DATA, Position(0, n),
                            "fred@example.com", n, None, old[0].writer, old[0].recorded_at)
        core._producer.produce_sync(log.topic, b"legacy",  # type: ignore[union-attr]
                                    codec.encode("link_record", record.to_avro()),
                                    partition=log.partition_for("legacy"))
    core.close()
    again = _reopened(kafka_config)
    try:
        head = again.links.last("legacy")
        assert head is not None and head.link_seq == 6
        assert [r.source_seq for r in again.links.read_range("legacy", 1, 6)] == \
            [1, 2, 3, 4, 5, 6]
        again.links.append_sync([_data("legacy", 7)])
        assert [r.source_seq for r in again.links.read_range("legacy", 5, 7)] == [5, 6, 7]
    finally:
        again.close()


@pytest.mark.slow
def test_crossing_the_16_bit_wrap_and_refilling_across_it(kafka_config: KafkaConfig) -> None:
    """At 16 bits the link goes 65534, 65535, 1, 2 (never 0), and a range across the wrap
    refills exactly, before and after a reopen."""
    robust = RobustConfig(seq_bits=16)
    core = _reopened(kafka_config, robust=robust)
    try:
        total = 65_540
        seqs: list[int] = []
        batch = 5000
        for start in range(0, total, batch):
            recs = core.links.append_sync([LinkItem.heartbeat("W")
                                           for _ in range(min(batch, total - start))])
            seqs += [r.link_seq for r in recs if r.kind is LinkKind.HEARTBEAT]
        assert seqs[65533:65537] == [65534, 65535, 1, 2] and 0 not in seqs
        across = core.links.read_range("W", 65530, 3)
        assert [r.link_seq for r in across] == [*range(65530, 65536), 1, 2, 3]
        assert [r.ordinal for r in across] == list(range(65530, 65539))
        core.links.flush()
    finally:
        core.close()
    again = _reopened(kafka_config, robust=robust)
    try:
        assert again.links.read_range("W", 65530, 3) == across
        head = again.links.last("W")
        assert head is not None and head.link_seq == total - 65535
    finally:
        again.close()


def test_bad_requests_get_their_codes_and_change_nothing(core: BrokerCore) -> None:
    """Backwards, zero, negative, beyond resolution, not yet sent: 553; over max gap: 570;
    unknown link, wrong epoch, before the reset: 569 — and the link is as it was."""
    core.links.append_sync([_data("L", n) for n in range(1, 101)])
    before = core.links.last("L")
    for lo, hi in ((50, 40), (0, 5), (-1, 5), (1, 2**32), (90, 120), (101, 101)):
        with pytest.raises(BadGapRange):
            core.links.read_range("L", lo, hi)
    small = LinkLog(core.config, core._producer, max_gap=10)  # type: ignore[arg-type]
    small.recover()
    with pytest.raises(RebuildRefused):
        small.read_range("L", 1, 11)
    with pytest.raises(LinkContextGone):
        core.links.read_range("nobody", 1, 2)
    with pytest.raises(LinkContextGone):
        core.links.read_range("L", 1, 2, epoch=3)
    core.links.append_sync([LinkItem.reset("L"), _data("L", 101), _data("L", 102)])
    assert [r.source_seq for r in core.links.read_range("L", 1, 2)] == [101, 102]
    with pytest.raises(LinkContextGone):
        core.links.read_range("L", 50, 60, epoch=0)  # the old epoch is over
    with pytest.raises(BadGapRange):
        core.links.read_range("L", 50, 60)  # epoch 1 has carried only 1..2
    with pytest.raises(LinkContextGone):
        core.links.read_range("L", 2**32 - 1, 2)  # wraps back across the reset
    after = core.links.last("L")
    assert before is not None and after is not None
    assert (after.epoch, after.link_seq, after.ordinal) == (1, 2, before.ordinal + 3)


def test_retention_window_makes_old_ranges_gone(core: BrokerCore) -> None:
    """A range whose records are older than the link retention window is 569."""
    now = [1_000_000]
    log = LinkLog(core.config, core._producer, retention_ms=60_000,  # type: ignore[arg-type]
                  clock=lambda: now[0])
    log.recover()
    log.append_sync([_data("R", n) for n in range(1, 11)])
    assert len(log.read_range("R", 1, 10)) == 10
    now[0] += 60_001
    log.append_sync([_data("R", 11)])
    with pytest.raises(LinkContextGone):
        log.read_range("R", 5, 11)
    assert [r.source_seq for r in log.read_range("R", 11, 11)] == [11]


def test_links_are_owned(core: BrokerCore) -> None:
    """The first subscriber to claim a link owns it; anybody else gets 537."""
    first = core.links.claim("desk-1", "jade@example.com")
    assert first is not None and first.kind is LinkKind.RESET and first.owner == "jade@example.com"
    assert core.links.claim("desk-1", "jade@example.com") is None
    with pytest.raises(NotYourLink):
        core.links.claim("desk-1", "fred@example.com")
    with pytest.raises(NotYourLink):
        core.links.check_owner("desk-1", "fred@example.com")
    core.links.check_owner("desk-1", "jade@example.com")
    core.links.append_sync([_data("desk-1", 1)])
    head = core.links.head("desk-1")
    assert head is not None and head.owner == "jade@example.com" and head.link_seq == 1


# --- kill -9 ------------------------------------------------------------------------------

TOTAL, LINKS, KILL_AFTER = 20_000, 4, 6_000


def _run_child(config: KafkaConfig, count: int, prefix: str,
               kill_after: int | None) -> list[tuple[str, int, int, int, str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.link_append_child", config.bootstrap,
         config.namespace, str(count), str(LINKS), prefix],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    acks = []
    for line in proc.stdout:
        if line.startswith("ACK "):
            _, link, ordinal, epoch, seq, kind, source_seq = line.split()
            acks.append((link, int(ordinal), int(epoch), int(seq), kind, int(source_seq)))
            if kill_after is not None and len(acks) == kill_after:
                proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=300) == (-signal.SIGKILL if kill_after is not None else 0)
    return acks


@pytest.mark.slow
def test_kill_9_while_appending_loses_and_reuses_nothing(kafka_config: KafkaConfig) -> None:
    """An appender killed with SIGKILL partway: after recovery every acknowledged record reads
    back exactly, numbering continues after the last durable record in the same epoch, and
    each link's epoch is complete — every seq once, none missing, none doubled."""
    first = _run_child(kafka_config, TOTAL, "a", KILL_AFTER)
    assert KILL_AFTER <= len(first) < TOTAL, "the kill landed while appending"
    second = _run_child(kafka_config, TOTAL // 2, "b", None)
    core = _reopened(kafka_config, robust=RobustConfig(max_gap=100_000))
    try:
        acked: dict[str, dict[int, tuple[int, int, str, int]]] = defaultdict(dict)
        for link, ordinal, epoch, seq, kind, source_seq in first + second:
            acked[link][ordinal] = (epoch, seq, kind, source_seq)
        for n in range(LINKS):
            link = f"link-{n}"
            head = core.links.last(link)
            assert head is not None and head.epoch == 0, "recovery does not reset a link"
            everything = core.links.read_range(link, 1, head.link_seq)
            assert [r.ordinal for r in everything] == list(range(1, head.ordinal + 1))
            by_ordinal: dict[int, LinkRecord] = {r.ordinal: r for r in everything}
            for ordinal, (epoch, seq, kind, source_seq) in acked[link].items():
                if ordinal == 0:
                    continue
                r = by_ordinal[ordinal]
                assert (r.epoch, r.link_seq, str(r.kind), r.source_seq or 0) == \
                    (epoch, seq, kind, source_seq), f"{link} ordinal {ordinal} reads back exactly"
            last_first = max(o for lk, o, *_ in first if lk == link)
            first_second = min(o for lk, o, *_ in second if lk == link)
            assert first_second > last_first, "numbering continues after the last durable"
    finally:
        core.close()
