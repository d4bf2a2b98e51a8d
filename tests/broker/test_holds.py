"""Held data (RFC 3342 hold4Endpoint): the pure `HoldBook` and its Kafka-durable `KafkaHolds`."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import BrokerCore
from broker.holds import HeldData, HoldBook, HoldLimits, KafkaHolds
from broker.kafka_io import KafkaConfig
from common.errors import TransactionFailed


def item(hold_id: str, recipient: str = "barney@x.example", *, originator: str = "fred@x.example",
         size: int = 10, held_at: int = 1000, deadline: int | None = None,
         report_at: int | None = None) -> HeldData:
    local, _, domain = recipient.rpartition("@")
    return HeldData(hold_id, recipient, f"{local.split('/')[0]}@{domain}", originator,
                    "application/beep+xml", b"x" * size, held_at, deadline, report_at)


class TestHoldBook:
    def test_cap_counts_items_and_octets_per_originator(self) -> None:
        """Over either cap is 554 and books nothing; another originator is unaffected;
        forgetting frees the room."""
        book = HoldBook(HoldLimits(max_per_originator=2, max_bytes_per_originator=25))
        book.reserve(item("1"))
        book.reserve(item("2"))
        with pytest.raises(TransactionFailed):
            book.reserve(item("3"))
        book.forget("2")
        with pytest.raises(TransactionFailed):
            book.reserve(item("3", size=16))
        assert book.usage("fred@x.example") == (1, 10) and len(book) == 1
        book.reserve(item("4", originator="wilma@x.example", size=25))
        with pytest.raises(TransactionFailed):
            book.reserve(item("1"))  # the same id twice

    def test_take_matches_endpoint_and_subaddresses_oldest_first(self) -> None:
        """barney takes his own and barney/appl's data; barney/appl only its own; taken data
        is out until requeued."""
        book = HoldBook()
        book.reserve(item("late", held_at=20))
        book.reserve(item("sub", "barney/appl=wb@x.example", held_at=10))
        book.reserve(item("other", "wilma@x.example"))
        assert [i.hold_id for i in book.take("barney/appl=wb@x.example", base=False)] == ["sub"]
        assert [i.hold_id for i in book.take("barney@x.example", base=True)] == ["late"]
        book.requeue("sub")
        assert [i.hold_id for i in book.take("barney@x.example", base=True)] == ["sub"]

    def test_deadlines_report_times_and_next_due(self) -> None:
        """expired() hands out waiting data past its deadline; late() each report once;
        next_due() follows what is still waiting."""
        book = HoldBook()
        book.reserve(item("a", deadline=500, report_at=100))
        book.reserve(item("b", "wilma@x.example", deadline=300))
        assert book.next_due() == 100
        assert [i.hold_id for i in book.late(150)] == ["a"] and book.late(150) == []
        assert book.next_due() == 300
        book.take("wilma@x.example", base=True)
        assert book.next_due() == 500  # b is out: its delivery watches its deadline
        assert book.expired(499) == [] and [i.hold_id for i in book.expired(500)] == ["a"]
        assert book.next_due() is None

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from(["reserve", "forget", "take", "requeue"]),
                              st.integers(0, 5), st.integers(0, 2)), max_size=40))
    def test_usage_always_matches_what_is_booked(self, ops: list[tuple[str, int, int]]) -> None:
        """Whatever happens, each originator's usage is the sum of its booked data and the
        cap is never exceeded."""
        limits = HoldLimits(max_per_originator=3, max_bytes_per_originator=40)
        book = HoldBook(limits)
        for op, n, who in ops:
            hid, originator = f"h{n}", f"o{who}@x.example"
            if op == "reserve":
                with contextlib.suppress(TransactionFailed):
                    book.reserve(item(hid, f"r{n % 2}@x.example", originator=originator,
                                      size=5 + n * 3))
            elif op == "forget":
                book.forget(hid)
            elif op == "take":
                book.take(f"r{n % 2}@x.example", base=True)
            else:
                book.requeue(hid)
        booked = [book._items[h] for h in book._items]
        for who in range(3):
            mine = [i for i in booked if i.originator == f"o{who}@x.example"]
            assert book.usage(f"o{who}@x.example") == (len(mine), sum(i.size for i in mine))
            assert len(mine) <= 3 and sum(i.size for i in mine) <= 40

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.tuples(
        st.sampled_from(["reserve", "forget", "take", "requeue", "expired", "late", "due"]),
        st.integers(0, 5), st.integers(0, 900)), max_size=40))
    def test_next_due_always_equals_a_fresh_scan(self, ops: list[tuple[str, int, int]]) -> None:
        """next_due() answers from its last scan until the book changes: after any sequence
        of changes and questions it must say what a scan of the book says now."""
        book = HoldBook()
        for op, n, t in ops:
            hid = f"h{n}"
            if op == "reserve":
                with contextlib.suppress(TransactionFailed):
                    book.reserve(item(hid, f"r{n % 2}@x.example", deadline=t or None,
                                      report_at=t // 2 or None))
            elif op == "forget":
                book.forget(hid)
            elif op == "take":
                book.take(f"r{n % 2}@x.example", base=True)
            elif op == "requeue":
                book.requeue(hid)
            elif op == "expired":
                book.expired(t)
            elif op == "late":
                book.late(t)
            waiting = [i for i in book._items.values() if i.hold_id not in book._out]
            times = [x for i in waiting for x in (
                i.deadline, None if i.hold_id in book._reported else i.report_at)
                if x is not None]
            assert book.next_due() == min(times, default=None)


def test_kafka_holds_survive_a_restart(kafka_config: KafkaConfig) -> None:
    """Two held, one released: a reopened core sees exactly the other, bytes and times intact;
    a hold over the cap writes nothing."""
    kept = item("kept", deadline=1_900_000_000_000, report_at=1_800_000_000_000)

    async def write() -> None:
        core = BrokerCore(kafka_config)
        await asyncio.to_thread(core.open)
        holds = KafkaHolds(core.holds, HoldLimits(max_per_originator=2))
        try:
            await holds.hold(kept)
            await holds.hold(item("gone"))
            with pytest.raises(TransactionFailed):
                holds.hold(item("over"))
            await holds.release("gone")
        finally:
            holds.close()
            core.close()

    asyncio.run(write())
    core = BrokerCore(kafka_config)
    core.open()
    try:
        holds = KafkaHolds(core.holds)
        assert len(holds.book) == 1
        (taken,) = holds.take("barney@x.example", base=True)
        assert taken == kept
        holds.close()
    finally:
        core.close()
