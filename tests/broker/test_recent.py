"""What the follower keeps of the journal (broker/recent.py): whatever it answers is exactly what
Kafka holds at those offsets — contiguous, nothing past an undecodable record, nothing evicted
passed off as present — under any sequence of reads, gaps and evictions (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.kafka_io import Position
from broker.recent import ENTRY_OVERHEAD, RecentJournal
from broker.records import JournalEntry, PublishType, RecordKind


def _entry(part: int, offset: int, size: int) -> JournalEntry:
    return JournalEntry(
        position=Position(part, offset), kind=RecordKind.DATA, topic="q", source="s@e.com",
        source_seq=offset + 1, gap_to=None, gap_reason=None, publish_type=PublishType.UPDATE,
        publisher_seq=None, message_id=None, revision_id=None, publication_date=None,
        expiration_date=None, permission_token=None, content_type="text/plain",
        content=b"x" * size, fields={}, options={}, appended_at=offset)


# per step: partition, how far past the previous offset (0: the very next), undecodable?, size
_steps = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.booleans(),
                            st.integers(0, 400)), max_size=120)


@given(_steps, st.integers(0, 40_000), st.data())
def test_answers_match_what_was_read(steps: list[tuple[int, int, bool, int]], budget: int,
                                     data: st.DataObject) -> None:
    recent = RecentJournal(budget)
    read: dict[int, list[tuple[int, JournalEntry | None]]] = {0: [], 1: [], 2: []}
    nxt = {0: 0, 1: 0, 2: 0}
    for part, skip, bad, size in steps:
        offset = nxt[part] + skip
        entry = None if bad else _entry(part, offset, size)
        recent.add(part, offset, entry)
        read[part].append((offset, entry))
        nxt[part] = offset + 1
    for part, log in read.items():
        for start in data.draw(st.lists(st.integers(0, nxt[part] + 2), max_size=6)):
            kept = recent.scan(part, start)
            if kept is None:
                continue
            entries, end = kept
            assert end == nxt[part]  # covered up to what was read last
            span = [(o, e) for o, e in log if start <= o < end]
            assert all(e is not None for _, e in span)  # no undecodable record inside
            assert entries == [e for _, e in span]
        for offset in data.draw(st.lists(st.integers(0, nxt[part] + 2), max_size=6)):
            got = recent.get(part, offset)
            if got is not None:
                assert (offset, got) in log
    kept_bytes = sum(len(e.content) + ENTRY_OVERHEAD
                     for part in read for e in (recent.scan(part, 0) or ([], 0))[0])
    assert kept_bytes <= max(budget, 0) or budget == 0


def test_nothing_kept_with_no_budget() -> None:
    recent = RecentJournal(0)
    recent.add(0, 0, _entry(0, 0, 10))
    assert recent.scan(0, 0) is None and recent.get(0, 0) is None


def test_the_oldest_go_first() -> None:
    recent = RecentJournal(10 * (100 + ENTRY_OVERHEAD))
    for offset in range(30):
        recent.add(0, offset, _entry(0, offset, 100))
    assert recent.get(0, 29) is not None and recent.get(0, 0) is None
    assert recent.scan(0, 0) is None
    kept = recent.scan(0, 25)
    assert kept is not None and [e.position.offset for e in kept[0]] == list(range(25, 30))
