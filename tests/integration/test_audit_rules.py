"""The audit's per-source and link-log rules on hand-made decoded rows (the `spark` fixture, no
Kafka): the journal cases the broker cannot be made to write — a seq journaled twice, one
publication under two seqs, a seq out of order, holes at the start and between GAPs — and
the link-log cases: a new epoch may carry a message again, link seqs wrap at 16 bits."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from broker.spark.audit import links, sources

pytestmark = pytest.mark.spark

T0 = datetime(2026, 11, 25, tzinfo=UTC)
JOURNAL = ("kafka_partition int, kafka_offset bigint, kind string, topic string, source string, "
           "source_seq bigint, gap_to bigint, publisher_seq bigint, content binary, "
           "appended_at timestamp, decode_error string")


def _journal(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    """rows: (partition, offset, kind, source, seq, gap_to, publisher_seq, content)."""
    return spark.createDataFrame(
        [(p, o, k, "t", s, q, g, ps, c, T0, None) for p, o, k, s, q, g, ps, c in rows], JOURNAL)


def _findings(spark: Any, rows: list[tuple[Any, ...]], from_start: tuple[int, ...] = ()) -> Any:
    ranges = sources.covered_ranges(_journal(spark, rows))
    found = sources.source_findings(ranges, sources.source_checks(ranges, from_start)).collect()
    return sorted((f["category"], f["source"], f["source_seq"]) for f in found)


def test_holes_duplicates_and_order_per_source(spark: Any) -> None:
    rows = [
        (0, 0, "DATA", "a", 2, None, None, b"x"),   # 1 missing: a hole only from the start
        (0, 1, "DATA", "a", 3, None, 7, b"p"),
        (0, 2, "DATA", "a", 3, None, None, b"p"),   # seq 3 twice
        (0, 3, "GAP", "a", 4, 6, None, None),       # 4..6 explained
        (0, 4, "DATA", "a", 9, None, None, b"y"),   # 7, 8 missing
        (0, 5, "DATA", "a", 10, None, 7, b"p"),     # publisher seq 7 again, same content
        (0, 6, "DATA", "a", 12, None, None, b"z"),
        (0, 7, "DATA", "a", 11, None, None, b"w"),  # below 12: out of order
        (1, 0, "DATA", "b", 1, None, 1, b"q"),
        (1, 1, "DATA", "b", 2, None, 1, b"other"),  # same publisher seq, other content: fine
    ]
    assert _findings(spark, rows) == [
        ("source_duplicate", "a", 3), ("source_duplicate", "a", 10), ("source_hole", "a", 7),
        ("source_order", "a", 11)]
    assert ("source_hole", "a", 1) in _findings(spark, rows, from_start=(0,))


def test_a_copy_that_comes_back_later_is_a_duplicate_not_an_order_fault(spark: Any) -> None:
    rows = [(0, i, "DATA", "a", s, None, None, b"c%d" % s) for i, s in enumerate([1, 2, 3, 2])]
    assert _findings(spark, rows) == [("source_duplicate", "a", 2)]


LINKS = ("kafka_partition int, kafka_offset bigint, pack_index int, link string, ordinal bigint, "
         "epoch bigint, epoch_start bigint, bits int, kind string, journal_partition int, "
         "journal_offset bigint, source string, source_seq bigint, writer bigint, "
         "recorded_at timestamp, snapshot boolean, decode_error string")


def _links(spark: Any, rows: list[tuple[Any, ...]], bits: int = 32) -> Any:
    """rows: (offset, ordinal, epoch, epoch_start, kind, seq, writer, snapshot), link L."""
    return spark.createDataFrame(
        [(0, o, 0, "L", n, e, es, bits, k, 0, s, "a" if s else None, s, w, T0, snap, None)
         for o, n, e, es, k, s, w, snap in rows], LINKS)


def _link_faults(spark: Any, rows: list[tuple[Any, ...]], bits: int = 32) -> list[Any]:
    records = links.link_records(_links(spark, rows, bits))
    found = links.link_findings(records).collect()
    return sorted((f["category"], f["source_seq"], f["link_seq"]) for f in found)


def test_a_new_epoch_may_carry_again_and_snapshots_are_not_deliveries(spark: Any) -> None:
    rows = [
        (0, 0, 0, 0, "RESET", None, 1, False),
        (1, 1, 0, 0, "DATA", 1, 1, False),
        (2, 2, 0, 0, "DATA", 2, 1, False),
        (3, 3, 0, 0, "DATA", 1, 1, True),   # a snapshot copy of seq 1: not a delivery
        (4, 4, 1, 4, "RESET", None, 1, False),
        (5, 5, 1, 4, "DATA", 1, 1, False),  # the catch-up of a repair: carried again
        (6, 6, 1, 4, "DATA", 2, 1, False),
        (7, 6, 1, 4, "DATA", 2, 2, False),  # the same ordinal from a newer writer: kept alone
    ]
    assert _link_faults(spark, rows) == []
    rows += [(8, 7, 1, 4, "DATA", 4, 2, False),
             (9, 8, 1, 4, "DATA", 3, 2, False),    # below 4: out of order
             (10, 9, 1, 4, "DATA", 2, 2, False)]   # twice in epoch 1
    assert _link_faults(spark, rows) == [("duplicate", 2, 5), ("reorder", 3, 4)]


def test_link_seqs_wrap_to_one_after_the_resolution(spark: Any) -> None:
    """At 16 bits the ordinal 65535 after the reset is link seq 65535, the next one 1."""
    records = links.link_records(_links(spark, [
        (0, 0, 0, 0, "RESET", None, 1, False),
        (1, 65535, 0, 0, "DATA", 1, 1, False),
        (2, 65536, 0, 0, "DATA", 2, 1, False),
    ], bits=16))
    assert [r["link_seq"] for r in records.orderBy("ordinal").collect()] == [0, 65535, 1]


MESSAGES = ("source string, source_seq bigint, topic string, permission_token string, "
            "expiration_date string, fields map<string, array<string>>, at_ms bigint, "
            "kafka_partition int, kafka_offset bigint")
SUBS = ("label string, subscriber string, topic string, link string, sel_key int, "
        "start_ms bigint, visible_ms bigint, end_ms bigint")
ENTS = ("subscriber string, topic string, token string, from_ms bigint, to_ms bigint, "
        "allowed boolean")


def _wanted(spark: Any, messages: list[tuple[Any, ...]], subscribers: tuple[str, ...],
            topic: str, edge_ms: int = 1_000) -> dict[tuple[str, int], bool | str]:
    """(subscriber, seq) -> the replayed decision ('edge' where either outcome reconciles)."""
    from broker.spark.audit import decisions
    from broker.spark.audit.registry import FOREVER

    at0 = int(T0.timestamp() * 1000)
    msgs = spark.createDataFrame(
        [("p", seq, topic, None, exp, fields, at0 + dt, 0, seq)
         for seq, exp, fields, dt in messages], MESSAGES)
    subs = spark.createDataFrame(
        [(s, s, topic, s, None, 0, 0, FOREVER) for s in subscribers], SUBS)
    # (as the job does: whether any message is dated decides whether the expiry is read)
    _, any_dated = decisions.tokens_and_dates(msgs)
    rows = decisions.pairs(msgs, subs, spark.createDataFrame([], ENTS), {}, edge_ms,
                           any_dated=any_dated).collect()
    return {(r["subscriber"], r["source_seq"]): "edge" if r["edge"] else r["want"] for r in rows}


def test_expired_messages_are_not_expected(spark: Any) -> None:
    """The live fan-out's expiry rule: a date at or before the append never goes, `0` and `*`
    go, a date after goes; one expiring within the edge of its append reconciles either way."""
    got = _wanted(spark, [
        (1, "2026-11-24T00:00:00Z", {}, 0),      # expired a day before its append
        (2, "0", {}, 0),                          # to the current subscribers, once
        (3, "*", {}, 0),
        (4, None, {}, 0),
        (5, "2026-11-26T00:00:00Z", {}, 0),       # a day left
        (6, "2026-11-25T00:00:00", {}, 500),      # naive = UTC: expired 500 ms before: edge
        (7, "2026-11-25T00:00:00+01:00", {}, 0),  # an hour before, by its offset
    ], ("s",), "t")
    assert got == {("s", 1): False, ("s", 2): True, ("s", 3): True, ("s", 4): True,
                   ("s", 5): True, ("s", 6): "edge", ("s", 7): False}


@pytest.mark.parametrize("topic", ["WKT=Subscriptions", "WKT=Notify"])
def test_wkt_subscriptions_messages_are_expected_only_by_their_own_subscriber(
        spark: Any, topic: str) -> None:
    """WKT=Subscriptions messages and resource Notifies go to their own subscriber only."""
    got = _wanted(spark, [
        (1, None, {"subscriber": ["a@x"]}, 0),
        (2, None, {"subscriber": ["b@x"]}, 0),
        (3, None, {}, 0),
    ], ("a@x", "b@x"), topic)
    assert got == {("a@x", 1): True, ("a@x", 2): False, ("a@x", 3): False,
                   ("b@x", 1): False, ("b@x", 2): True, ("b@x", 3): False}


PAIRED = ("link string, source string, source_seq bigint, topic string, at_ms bigint, "
          "kafka_partition int, kafka_offset bigint, label string, subscriber string, "
          "in_life boolean, allowed boolean, selected boolean, edge boolean, want boolean, "
          "link_seq bigint, epoch bigint, rec_ms bigint, times bigint, is_carried boolean")


def test_judge_names_a_wanting_subscription_first_then_an_active_one(spark: Any) -> None:
    """Per (link, message) judge names one subscription: one that wants it before one that
    is only active, before the greatest name (as the max of a struct of them did); a pick
    that ignores `want` or `in_life` names the wrong one here."""
    from broker.spark.audit import decisions

    def pair(seq: int, label: str, in_life: bool, want: bool) -> tuple[Any, ...]:
        return ("L", "p", seq, "t", 0, 0, seq, label, label[0], in_life, True,
                want, False, want, None, None, None, None, False)

    paired = spark.createDataFrame([
        pair(1, "a/1", True, True), pair(1, "b/1", True, False),    # a wants it
        pair(2, "a/1", True, False), pair(2, "b/1", False, False),  # a is active
        pair(3, "a/1", True, False), pair(3, "b/1", True, False)], PAIRED)
    names = [("a/1", "a"), ("b/1", "b")]
    got = {r["source_seq"]: (r["label"], r["subscriber"], r["want"], r["in_life"])
           for r in decisions.judge(paired, names).collect()}
    assert got == {1: ("a/1", "a", True, True), 2: ("a/1", "a", False, True),
                   3: ("b/1", "b", False, True)}
