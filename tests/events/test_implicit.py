"""Implicit watches (broker/events/_watches.py, event draft §3.1.2): only on the policy's
topics, one per publisher and resource, bounded per endpoint, and never told of the publisher's
own changes."""

from __future__ import annotations

from broker.events import IMPLICIT_ID, ImplicitPolicy, Resource, State, WatchTable
from tests.events.test_watches_machine import _entry

POLICY = ImplicitPolicy(topics=frozenset({"q.shared"}), events=frozenset({2, 3}),
                        expires_s=60, max_implicit=2)


def test_implicit_watches_follow_the_policy() -> None:
    """Policy topics only; not twice; not past the bound; an explicit watch makes none."""
    table = WatchTable(implicit_policy=POLICY)
    fred = "fred@example.com"
    assert table.implicit(fred, Resource("q.other", "a"), 0, link=fred) is None
    made = table.implicit(fred, Resource("q.shared", "a"), 0, link=fred)
    assert made is not None and made.implicit and made.watch_id == IMPLICIT_ID
    assert made.expires_at == 60_000 and made.events == {2, 3}
    assert table.implicit(fred, Resource("q.shared", "a"), 5, link=fred) is None
    assert table.implicit(fred, Resource("q.shared", "b"), 0, link=fred) is not None
    assert table.implicit(fred, Resource("q.shared", "c"), 0, link=fred) is None  # bound
    jade = "jade@example.com"
    table.subscribe(jade, Resource("q.shared", "a"), "mine", expires=60, events={1}, now=0,
                    link=jade)
    assert table.implicit(jade, Resource("q.shared", "a"), 0, link=jade) is None
    assert len(list(table.all())) == 3


def test_an_implicit_watch_hears_others_only() -> None:
    """The publisher's own change causes no Notify to its implicit watch; another's does."""
    table = WatchTable(implicit_policy=POLICY)
    fred, res = "fred@example.com", Resource("q.shared", "a")
    table.implicit(fred, res, 0, link=fred)
    assert table.on_change(res, _entry("q.shared", "a", source=fred), frozenset({2}), 1) == []
    (note,) = table.on_change(res, _entry("q.shared", "a", source="jade@example.com"),
                              frozenset({2}), 1)
    assert (note.state, note.events, note.watch.subscriber) == (State.ACTIVE, {2}, fred)


def test_a_pending_watch_hears_nothing_until_approved() -> None:
    """§4.2.1 Pending: no event Notifies while it waits; approved, it gets the current state;
    refused, it ends with reason rejected."""
    from broker.events import Reason

    table = WatchTable()
    jade, res = "jade@example.com", Resource("q.a", "IBM")
    (waiting,) = table.subscribe(jade, res, "1", expires=60, events={2}, now=0, link=jade,
                                 pending=True)
    assert (waiting.state, waiting.current) == (State.PENDING, False)
    assert table.on_change(res, _entry("q.a", "IBM"), frozenset({2}), 1) == []
    (approved,) = table.approve((jade, res, "1"))
    assert (approved.state, approved.current) == (State.ACTIVE, True)
    assert len(table.on_change(res, _entry("q.a", "IBM"), frozenset({2}), 1)) == 1
    table.subscribe(jade, res, "2", expires=60, events={2}, now=0, link=jade, pending=True)
    (refused,) = table.reject((jade, res, "2"))
    assert (refused.state, refused.reason) == (State.TERMINATED, Reason.REJECTED)
