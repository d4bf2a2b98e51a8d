"""`SubscriptionTable` (broker/pubsub/_table.py): which (subscriber, link) pairs a message goes
to, one per pair, and the InRe ids each pair's copy names."""

from __future__ import annotations

from typing import Any

from broker import selectors
from broker.kafka_io import Position
from broker.pubsub._table import SubscriptionTable
from broker.records import JournalEntry, PublishType, RecordKind, Subscription, SubscriptionState

T = "equity.quote.service"
_offsets = iter(range(1_000_000))


def _entry(**fields: str) -> JournalEntry:
    return JournalEntry(Position(0, next(_offsets)), RecordKind.DATA, T, "pub@example.com", 1,
                        None, None, PublishType.UPDATE, None, None, None, None, None, None,
                        "application/xml", b"", {k: [v] for k, v in fields.items()}, {}, 0)


def _add(table: SubscriptionTable, who: str, sub_id: str, selector: str | None = None,
         link: str | None = None, expires_at: int | None = None) -> None:
    sub = Subscription(who, sub_id, T, 60, SubscriptionState.ACTIVE, 0,
                       selector_class=None if selector is None else "JMS", selector=selector,
                       expires_at=expires_at, link_id=link)
    table.add(sub, None if selector is None else selectors.compile("JMS", selector))


def _go(table: SubscriptionTable, entry: JournalEntry, now: int = 1) -> dict[str, Any]:
    pairs = list(table.deliveries(entry, now))
    assert len(pairs) == len(set(pairs)), "one copy per (subscriber, link)"
    return {who: table.in_re(entry, who, link, now) for who, link in pairs}


def test_one_copy_per_endpoint_naming_every_satisfied_subscription() -> None:
    table = SubscriptionTable()
    _add(table, "jade", "1", "symbol = 'XMPL' AND pct > 5")
    _add(table, "jade", "2", "symbol = 'XMPL'")
    _add(table, "jade", "3", "symbol = 'TEST'")
    _add(table, "fred", "1")  # plain: every message, no InRe
    assert _go(table, _entry(symbol="XMPL", pct="9")) == {"jade": ("1", "2"), "fred": None}
    assert _go(table, _entry(symbol="XMPL", pct="1")) == {"jade": ("2",), "fred": None}
    assert _go(table, _entry(symbol="IBM")) == {"fred": None}


def test_a_plain_subscription_beside_others_is_named_too() -> None:
    table = SubscriptionTable()
    _add(table, "jade", "1")
    _add(table, "jade", "2", "symbol = 'XMPL'")
    assert _go(table, _entry(symbol="XMPL")) == {"jade": ("1", "2")}
    assert _go(table, _entry(symbol="IBM")) == {"jade": ("1",)}


def test_each_link_gets_its_own_copy() -> None:
    table = SubscriptionTable()
    _add(table, "jade", "1", "symbol = 'XMPL'", link="desk-1")
    _add(table, "jade", "2", "symbol = 'XMPL'", link="desk-2")
    entry = _entry(symbol="XMPL")
    assert sorted(table.deliveries(entry, 1)) == [("jade", "desk-1"), ("jade", "desk-2")]
    assert table.in_re(entry, "jade", "desk-2", 1) == ("2",)


def test_expired_and_removed_subscriptions_take_nothing() -> None:
    table = SubscriptionTable()
    _add(table, "jade", "1", "symbol = 'XMPL'", expires_at=100)
    _add(table, "jade", "2", "symbol = 'XMPL'")
    _add(table, "fred", "1", expires_at=100)
    assert _go(table, _entry(symbol="XMPL"), now=200) == {"jade": ("2",)}
    table.remove(T, ("jade", "2"))
    assert _go(table, _entry(symbol="XMPL"), now=50) == {"jade": ("1",), "fred": None}


def test_a_refill_asks_again_from_the_stored_fields() -> None:
    """An entry the fan-out never decided (a gap fill) gets the same answer, recomputed."""
    table = SubscriptionTable()
    _add(table, "jade", "1", "symbol = 'XMPL'")
    _add(table, "jade", "2", "pct > 5")
    assert table.in_re(_entry(symbol="XMPL", pct="9"), "jade", "jade", 1) == ("1", "2")
    assert table.in_re(_entry(symbol="IBM", pct="1"), "jade", "jade", 1) is None


def test_wants_is_what_a_links_subscriptions_select() -> None:
    table = SubscriptionTable()
    _add(table, "jade", "1", "symbol = 'XMPL'")
    _add(table, "fred", "1")
    assert table.wants("jade", _entry(symbol="XMPL"), 1)
    assert not table.wants("jade", _entry(symbol="IBM"), 1)
    assert table.wants("fred", _entry(symbol="IBM"), 1)
    assert not table.wants("nobody", _entry(symbol="XMPL"), 1)


def test_quiet_topics_are_those_where_inre_says_nothing() -> None:
    table = SubscriptionTable()
    _add(table, "jade", "1")
    _add(table, "fred", "1")
    assert table.quiet(T)
    _add(table, "jade", "2")  # a second subscription on jade's link
    assert not table.quiet(T)
    table.remove(T, ("jade", "2"))
    assert table.quiet(T)
    _add(table, "fred", "2", "symbol = 'XMPL'", link="elsewhere")  # a selector
    assert not table.quiet(T)
    table.remove(T, ("fred", "2"))
    assert table.quiet(T) and table.quiet("no.such.topic")
