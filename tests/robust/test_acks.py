"""The acknowledgement log's rules without Kafka: `Receipts` settles tags by BEEP's in-order
answers, and `AckLog` keeps the newest acknowledged record per (link, epoch) and writes only
what moved."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from adapters.apex._receipts import Receipts
from broker.codec import Codec
from broker.kafka_io import KafkaConfig
from broker.robust.acks import SCHEMA, AckLog, AckTag, ack_key


class _Producer:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None]] = []

    def produce(self, topic: str, key: bytes | None, value: bytes | None, _cb: Any,
                partition: int | None = None) -> None:
        self.records.append((topic, key, value))


def _log() -> tuple[AckLog, _Producer, Codec]:
    producer, codec = _Producer(), Codec()
    return AckLog(KafkaConfig(bootstrap="x:1", namespace="t"), producer, codec), producer, codec  # type: ignore[arg-type]


def test_an_ok_settles_its_own_tags_and_drops_the_unanswered_before_it() -> None:
    got: list[object] = []
    r = Receipts(got.append)
    r.sent(1, 3, 10, ["a"])
    r.sent(1, 3, 11, ["b", "c"])
    r.sent(1, 5, 11, ["other channel"])
    r.replied(1, 3, 11, ok=True)
    assert got == ["b", "c"]  # 10's answer never came: not acknowledged
    r.replied(1, 5, 11, ok=False)  # an ERR acknowledges nothing
    assert got == ["b", "c"] and len(r) == 0


def test_a_session_that_ends_acknowledges_nothing_it_left_unanswered() -> None:
    got: list[object] = []
    r = Receipts(got.append)
    r.sent(1, 3, 1, ["a"])
    r.sent(2, 3, 1, ["b"])
    r.session_ended(1)
    r.replied(1, 3, 1, ok=True)  # a late answer of a dropped session
    r.replied(2, 3, 1, ok=True)
    assert got == ["b"]


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=40))
def test_only_what_was_answered_ok_is_acknowledged(plan: list[tuple[bool, bool]]) -> None:
    """MSGs 1..n on one channel; each answered or not (answers in order), ok or ERR: exactly
    the tags of the ones answered ok come out, in order."""
    got: list[object] = []
    r = Receipts(got.append)
    for msgno in range(1, len(plan) + 1):
        r.sent(7, 1, msgno, [msgno])
    for msgno, (answered, ok) in enumerate(plan, start=1):
        if answered:
            r.replied(7, 1, msgno, ok=ok)
    assert got == [m for m, (a, ok) in enumerate(plan, start=1) if a and ok]


def test_the_log_keeps_the_newest_per_epoch_and_writes_what_moved() -> None:
    log, producer, codec = _log()
    assert log.acked(AckTag("L", 0, 5, 5), at_ms=1)
    assert not log.acked(AckTag("L", 0, 3, 3), at_ms=2)  # an older answer moves nothing
    assert log.acked(AckTag("L", 1, 9, 1), at_ms=3)  # a new epoch is its own number
    assert log.flush() == 2 and log.flush() == 0
    written = {key: codec.decode(value, expect=SCHEMA)[1] for _, key, value in producer.records}
    assert written[ack_key("L", 0)] == {"link": "L", "epoch": 0, "ordinal": 5, "seq": 5,
                                        "acked_at": written[ack_key("L", 0)]["acked_at"]}
    assert written[ack_key("L", 1)]["ordinal"] == 9
    assert log.acknowledged("L", 0) == AckTag("L", 0, 5, 5)
    # wrapped seqs: the ordinal decides, not the seq
    assert log.acked(AckTag("L", 1, 10, 2), at_ms=4) and log.acknowledged("L", 1).seq == 2  # type: ignore[union-attr]
    log.forget("L")
    assert log.acknowledged("L", 0) is None and log.pending == 0
