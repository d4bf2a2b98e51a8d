"""The audit's reading of the acknowledgement log (broker/spark/audit/acks.py) on a real
SparkSession: a record counts as acknowledged when it is at or before the newest acknowledged
record of its own epoch, by ordinal (link seqs wrap); heartbeats and snapshot copies are not
deliveries; a link with no acknowledgement on record has none."""

from __future__ import annotations

from typing import Any

import pytest

from broker.spark.audit.acks import acknowledgements

pytestmark = [pytest.mark.spark]

_RECORDS = "link string, epoch bigint, ordinal bigint, kind string, snapshot boolean"
_ACKS = ("link string, epoch bigint, ordinal bigint, seq bigint, deleted boolean, "
         "decode_error string")


def _run(spark: Any, records: list[tuple[Any, ...]], acks: list[tuple[Any, ...]] | None,
         ) -> dict[str, tuple[int, int, dict[int, int] | None]]:
    rec = spark.createDataFrame(records, _RECORDS)
    ack = None if acks is None else spark.createDataFrame(acks, _ACKS)
    return {r["link"]: (r["carried"], r["acknowledged"], r["acked"])
            for r in acknowledgements(rec, ack).collect()}


def test_acknowledged_is_up_to_the_newest_ok_of_each_epoch(spark: Any) -> None:
    records = [
        ("a", 0, 0, "RESET", False),
        *[("a", 0, k, "DATA", False) for k in range(1, 6)],     # epoch 0: ordinals 1..5
        ("a", 0, 6, "HEARTBEAT", False),
        ("a", 1, 7, "RESET", False),
        *[("a", 1, k, "DATA", False) for k in range(8, 11)],    # epoch 1: ordinals 8..10
        ("a", 1, 11, "DATA", True),                              # a snapshot copy
        *[("b", 0, k, "DATA", False) for k in range(1, 4)],
    ]
    acks = [("a", 0, 3, 3, False, None), ("a", 0, 4, 4, False, None),  # the newest wins
            ("a", 1, 9, 2, False, None),
            ("a", 1, 99, 1, True, None),          # a tombstone is no acknowledgement
            ("a", 1, 99, 1, False, "bad bytes")]  # nor is a record that did not decode
    got = _run(spark, records, acks)
    assert got["a"] == (8, 4 + 2, {0: 4, 1: 2})
    assert got["b"] == (3, 0, None)  # carried, never acknowledged on record


def test_without_an_acknowledgement_log_nothing_is_acknowledged(spark: Any) -> None:
    got = _run(spark, [("a", 0, 1, "DATA", False)], None)
    assert got == {"a": (1, 0, {})}
