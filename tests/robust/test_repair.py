"""A source repair's catch-up selection (broker/robust/repair.py `CatchUp`), fed records in
journal order: which entries, in what order, where the live side begins, and what is refused
(570) for the journal's retention or the repair size. The Kafka reading is in
tests/integration/test_repair_select.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.kafka_io import Position
from broker.records import JournalEntry, PublishType, RecordKind
from broker.robust.repair import CatchUp
from common.errors import RebuildRefused

A, B, C = "a@example.com", "b@example.com", "c@example.com"
SUB = "jade@example.com"
TOPICS = {"q.a": SUB, "q.b": SUB}


def rec(source: str, seq: int, topic: str = "q.a", *, offset: int | None = None,
        at: int = 1_000, gap_to: int | None = None) -> JournalEntry:
    """A journal record of `source` (a GAP when `gap_to` is given); offset defaults to seq."""
    kind = RecordKind.GAP if gap_to is not None else RecordKind.DATA
    return JournalEntry(Position(0, seq if offset is None else offset), kind, topic, source, seq,
                        gap_to, None, PublishType.UPDATE, None, None, None, None, None, None,
                        "text/plain", f"{source}/{seq}".encode(), {}, {}, at)


def everyone(entry: JournalEntry, subscriber: str) -> bool:
    return True


def keys(entries: list[JournalEntry]) -> list[tuple[str, int]]:
    return [(e.source, e.source_seq) for e in entries]


class TestNamedSources:
    def test_takes_data_after_the_position_on_the_links_topics_in_seq_order(self) -> None:
        """Only DATA after `after`, on a topic the link's subscriptions cover."""
        catch = CatchUp(TOPICS, everyone, 100, [A])
        records = [rec(A, 3), rec(A, 4, "q.b"), rec(A, 5, "q.other"), rec(A, 6, gap_to=7),
                   rec(A, 8)]
        catch.take_source(A, 2, records, acknowledged=8)
        assert keys(catch.entries()) == [(A, 3), (A, 4), (A, 8)]

    def test_records_at_or_before_after_are_skipped(self) -> None:
        """A read that starts at the index bucket yields older seqs first."""
        catch = CatchUp(TOPICS, everyone, 100, [A])
        catch.take_source(A, 4, [rec(A, s) for s in range(1, 8)], acknowledged=7)
        assert keys(catch.entries()) == [(A, 5), (A, 6), (A, 7)]

    def test_the_permission_hook_decides_per_entry_with_the_topics_subscriber(self) -> None:
        """`entitled` gets the entry and the subscriber whose subscription covers its topic."""
        asked: list[tuple[int, str]] = []

        def odd_only(entry: JournalEntry, subscriber: str) -> bool:
            asked.append((entry.source_seq, subscriber))
            return entry.source_seq % 2 == 1

        catch = CatchUp({"q.a": "x@example.com"}, odd_only, 100, [A])
        catch.take_source(A, 0, [rec(A, s) for s in range(1, 6)], acknowledged=5)
        assert keys(catch.entries()) == [(A, 1), (A, 3), (A, 5)]
        assert asked == [(s, "x@example.com") for s in range(1, 6)]

    def test_stops_at_the_live_side(self) -> None:
        """Records at or past `end` are what forward() will put on the link."""
        catch = CatchUp(TOPICS, everyone, 100, [A])
        catch.take_source(A, 0, [rec(A, s, offset=10 + s) for s in range(1, 6)],
                          acknowledged=5, end=14)
        assert keys(catch.entries()) == [(A, 1), (A, 2), (A, 3)]

    def test_a_duplicate_seq_in_the_journal_is_taken_once(self) -> None:
        """Exactly once by (source, source seq), even if the journal holds one twice."""
        catch = CatchUp(TOPICS, everyone, 100, [A])
        catch.take_source(A, 0, [rec(A, 1), rec(A, 2), rec(A, 2, offset=9)], acknowledged=2)
        assert keys(catch.entries()) == [(A, 1), (A, 2)]

    def test_named_sources_come_in_the_order_named(self) -> None:
        """Per source, one source after the other, as the request lists them."""
        catch = CatchUp(TOPICS, everyone, 100, [B, A])
        catch.take_source(B, 0, [rec(B, 1), rec(B, 2)], acknowledged=2)
        catch.take_source(A, 0, [rec(A, 1)], acknowledged=1)
        assert keys(catch.entries()) == [(B, 1), (B, 2), (A, 1)]


class TestRetention:
    def test_first_retained_seq_after_the_position_is_refused(self) -> None:
        """Seqs after+1.. deleted by retention: 570."""
        catch = CatchUp(TOPICS, everyone, 100, [A])
        with pytest.raises(RebuildRefused, match=r"seqs 3\.\.4"):
            catch.take_source(A, 2, [rec(A, 5), rec(A, 6)], acknowledged=6)

    def test_a_gap_record_accounts_for_the_seq(self) -> None:
        """A GAP explaining after+1 is not a loss — also when the journal wrote it later."""
        catch = CatchUp(TOPICS, everyone, 100, [A])
        catch.take_source(A, 2, [rec(A, 3, gap_to=4), rec(A, 5)], acknowledged=5)
        catch.take_source(A, 2, [rec(A, 4, offset=4), rec(A, 3, offset=5, gap_to=3)],
                          acknowledged=4)
        assert keys(catch.entries()) == [(A, 5), (A, 4)]

    def test_nothing_left_of_acknowledged_seqs_is_refused(self) -> None:
        """The journal acknowledged seqs after `after` and none is left: 570."""
        catch = CatchUp(TOPICS, everyone, 100, [A])
        with pytest.raises(RebuildRefused, match=r"seqs 3\.\.9"):
            catch.take_source(A, 2, [], acknowledged=9)

    def test_nothing_after_the_position_is_fine(self) -> None:
        """A source the journal never had, or one the subscriber is up to date with."""
        catch = CatchUp(TOPICS, everyone, 100, [A, B])
        catch.take_source(A, 0, [], acknowledged=0)
        catch.take_source(B, 7, [], acknowledged=7)
        catch.take_source(C, 12, [], acknowledged=7)  # ahead of the journal: nothing to send
        assert catch.entries() == []

    def test_a_live_record_still_shows_where_retained_seqs_begin(self) -> None:
        """Past `end` nothing is taken, but a first record that skips seqs is still a loss."""
        catch = CatchUp(TOPICS, everyone, 100, [A])
        with pytest.raises(RebuildRefused):
            catch.take_source(A, 2, [rec(A, 5, offset=50)], acknowledged=4, end=40)
        catch.take_source(A, 2, [rec(A, 3, offset=50)], acknowledged=2, end=40)
        assert catch.entries() == []


class TestSince:
    def test_unnamed_sources_from_since_sorted_by_name(self) -> None:
        """Unnamed sources: DATA accepted at or after `since`; named ones never come from here."""
        catch = CatchUp(TOPICS, everyone, 100, [A])
        catch.take_source(A, 1, [rec(A, 2, at=500)], acknowledged=2)
        part = [rec(C, 1, at=900), rec(C, 2, at=1_000), rec(A, 3, at=1_000),
                rec(B, 7, at=1_100), rec(C, 3, "q.b", at=1_200), rec(B, 8, "q.x", at=1_300),
                rec(B, 9, at=1_300, gap_to=9)]
        catch.take_since(1_000, part)
        assert keys(catch.entries()) == [(A, 2), (B, 7), (C, 2), (C, 3)]

    def test_a_duplicate_is_taken_once(self) -> None:
        """Per source, each seq once."""
        catch = CatchUp(TOPICS, everyone, 100)
        catch.take_since(0, [rec(B, 1), rec(B, 2), rec(B, 2, offset=7), rec(B, 3)])
        assert keys(catch.entries()) == [(B, 1), (B, 2), (B, 3)]


class TestLimit:
    def test_the_limit_is_inclusive_and_one_more_is_refused(self) -> None:
        """`limit` messages are served; limit + 1 is 570, named and unnamed counted together."""
        catch = CatchUp(TOPICS, everyone, 3, [A])
        catch.take_source(A, 0, [rec(A, 1), rec(A, 2)], acknowledged=2)
        catch.take_since(0, [rec(B, 1)])
        assert len(catch.entries()) == 3
        with pytest.raises(RebuildRefused, match="more than 3"):
            catch.take_since(0, [rec(C, 1)])

    def test_what_is_filtered_out_does_not_count(self) -> None:
        """Only messages that would be resent count."""
        catch = CatchUp(TOPICS, everyone, 2, [A])
        catch.take_source(A, 0, [rec(A, s, "q.x") for s in range(1, 50)] + [rec(A, 50)],
                          acknowledged=50)
        assert keys(catch.entries()) == [(A, 50)]


@given(topics=st.lists(st.sampled_from(["q.a", "q.b", "q.c"]), min_size=0, max_size=40),
       after=st.integers(0, 45), end=st.integers(0, 50))
def test_a_named_source_is_exactly_its_wanted_seqs_after_the_position(
        topics: list[str], after: int, end: int) -> None:
    """For any source history: seqs after `after`, before `end`, on the link's topics, in order."""
    records = [rec(A, i + 1, t, offset=i + 1) for i, t in enumerate(topics)]
    catch = CatchUp(TOPICS, everyone, 1_000, [A])
    catch.take_source(A, after, records, acknowledged=len(records), end=end)
    assert keys(catch.entries()) == [(A, r.source_seq) for r in records
                                     if r.source_seq > after and r.position.offset < end
                                     and r.topic in TOPICS]
