"""The checkpoint flush rule shared by the journal and the link log (broker/flush.py)."""

from __future__ import annotations

from broker.flush import FlushPolicy


def test_nothing_changed_is_never_due() -> None:
    assert not FlushPolicy(every=1, interval_s=0.0).due()


def test_due_after_enough_changes_then_not_once_flushed() -> None:
    policy = FlushPolicy(every=3, interval_s=3600.0)
    policy.changed(2)
    assert not policy.due()
    policy.changed()
    assert policy.due()
    policy.flushed()
    assert not policy.due() and policy.changes == 0


def test_due_once_the_interval_passed_with_any_change() -> None:
    policy = FlushPolicy(every=10**9, interval_s=0.0)
    policy.changed()
    assert policy.due()
