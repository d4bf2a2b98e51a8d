"""`SubscriptionTable`: the service's active subscriptions, and which of them a message satisfies.

Theory of operation
-------------------
A subscriber may hold several subscriptions to one topic (draft §5.8), each with its own id
and, optionally, a selector. The table keeps them per topic, keyed by (subscriber, id). Those
without a selector take every message of their topic; those with one are filed in the topic's
`SubscriptionIndex`, which finds the matching ones from the journal record's stored fields in
one pass (no XML is parsed here, ever).

What the fan-out asks, per message, is *where* it goes: one (subscriber, link) per endpoint
and link, however many of its subscriptions the message satisfies (§5.10: one copy, with InRe
naming them all). So `deliveries(entry, now)` returns those pairs, and remembers for a while
which subscription ids each pair stands for; the renderer asks `in_re(entry, who, link)` for
them when it writes the data. Refills come later and ask again: the ids are then recomputed
from the stored fields against the subscriptions as they are then.

InRe is left out (None) where it says nothing: the one subscription a subscriber has to the
topic on that link takes every message (the plain topic subscription of the topic-based draft,
whose wire stays as it was). Otherwise every data names the ids it satisfied.

The plain part is cached per topic until a subscription changes or the first of them runs out,
as the fan-out asks it once per message and subscriptions change rarely. Not thread-safe: the
service calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from broker.kafka_io import Position
from broker.records import JournalEntry, Subscription
from broker.robust.linkid import default_link_id
from broker.selectors import Selector, SubscriptionIndex

__all__ = ["FOREVER", "Key", "SubscriptionTable", "link_of"]

#: (subscriber, subscription id)
Key = tuple[str, str]
#: "Until" for what no expiry bounds.
FOREVER = 1 << 62
#: Topics whose plain recipients are kept (past it: start over).
_KEPT = 65_536
#: (entry, pair) InRe answers kept for the renderer at most (past it: start over; a miss is
#: recomputed from the stored fields, so this bounds memory, not correctness).
_PAIRS_KEPT = 1 << 20

_Pair = tuple[str, str]


def link_of(sub: Subscription) -> str:
    """The link a subscription's data travel on."""
    return sub.link_id or default_link_id(sub.subscriber)


def _live(sub: Subscription, now: int) -> bool:
    return sub.expires_at is None or sub.expires_at > now


class SubscriptionTable:
    def __init__(self) -> None:
        self._by_topic: dict[str, dict[Key, Subscription]] = {}
        self._indexes: dict[str, SubscriptionIndex[Key]] = {}
        #: topic -> who its live subscriptions are, from `since` until the first runs out
        self._plain: dict[str, _View] = {}
        #: journal position -> (pair -> InRe ids or None): what deliveries() decided, kept
        #: until the renderer asks (bounded by pairs, not entries: one message may go to
        #: thousands of pairs, and the entries themselves are not kept)
        self._in_re: dict[Position, dict[_Pair, tuple[str, ...] | None]] = {}
        self._in_re_pairs = 0
        #: topic -> (subscriber, link) -> how many subscriptions it has (live or not), and
        #: topic -> how many of its pairs have more than one: `quiet` in O(1)
        self._pair_counts: dict[str, dict[_Pair, int]] = {}
        self._crowded: dict[str, int] = {}

    # --- contents --------------------------------------------------------------------------

    def add(self, sub: Subscription, selector: Selector | None) -> None:
        """File `sub` (replacing one of the same key); `selector`: its compiled selector."""
        key = (sub.subscriber, sub.subscription_id)
        self.remove(sub.topic, key)
        self._by_topic.setdefault(sub.topic, {})[key] = sub
        self._count(sub, +1)
        if selector is not None:
            self._indexes.setdefault(sub.topic, SubscriptionIndex()).add(key, selector)
        self._changed()

    def remove(self, topic: str, key: Key) -> Subscription | None:
        subs = self._by_topic.get(topic)
        gone = None if subs is None else subs.pop(key, None)
        if gone is None:
            return None
        if not subs:
            del self._by_topic[topic]
        self._count(gone, -1)
        index = self._indexes.get(topic)
        if index is not None and key in index:
            index.remove(key)
            if not len(index):
                del self._indexes[topic]
        self._changed()
        return gone

    def get(self, topic: str, key: Key) -> Subscription | None:
        return self._by_topic.get(topic, {}).get(key)

    def of_topic(self, topic: str) -> list[Subscription]:
        return list(self._by_topic.get(topic, {}).values())

    def topics(self) -> list[str]:
        return list(self._by_topic)

    def all(self) -> Iterable[Subscription]:
        for subs in self._by_topic.values():
            yield from subs.values()

    def _count(self, sub: Subscription, step: int) -> None:
        counts = self._pair_counts.setdefault(sub.topic, {})
        pair = (sub.subscriber, link_of(sub))
        was = counts.get(pair, 0)
        now = was + step
        if now:
            counts[pair] = now
        else:
            del counts[pair]
            if not counts:
                del self._pair_counts[sub.topic]
        crowded = self._crowded.get(sub.topic, 0) + (now > 1) - (was > 1)
        if crowded:
            self._crowded[sub.topic] = crowded
        else:
            self._crowded.pop(sub.topic, None)

    def quiet(self, topic: str) -> bool:
        """No InRe on `topic`: no selectors, and no (subscriber, link) with more than one
        subscription (each copy stands for the pair's one plain subscription). Safe to ask
        without the lock: a dict lookup each."""
        return topic not in self._indexes and topic not in self._crowded

    def _changed(self) -> None:
        self._plain.clear()
        self._in_re.clear()
        self._in_re_pairs = 0

    # --- the fan-out's questions -----------------------------------------------------------

    def _view(self, topic: str, now: int) -> _View:
        view = self._plain.get(topic)
        if view is not None and view.since <= now < view.until:
            return view
        view = _View(now)
        index = self._indexes.get(topic)
        for key, sub in self._by_topic.get(topic, {}).items():
            if sub.expires_at is not None and sub.expires_at > now:
                view.until = min(view.until, sub.expires_at)
            if not _live(sub, now):
                continue
            pair = (sub.subscriber, link_of(sub))
            view.counts[pair] = view.counts.get(pair, 0) + 1
            if index is None or key not in index:
                view.plain_ids.setdefault(pair, []).append(sub.subscription_id)
            else:
                view.selecting.setdefault(pair, []).append(key)
        view.pairs = tuple(view.plain_ids)
        if len(self._plain) >= _KEPT:
            self._plain.clear()
        self._plain[topic] = view
        return view

    def deliveries(self, entry: JournalEntry, now: int) -> Sequence[_Pair]:
        """(subscriber, link) of each endpoint and link `entry` goes to: one per pair however
        many of its subscriptions it satisfies (see the module docstring)."""
        topic = entry.topic
        view = self._view(topic, now)
        index = self._indexes.get(topic)
        if index is None:
            return view.pairs  # no selectors: the cached tuple
        matched = index.match(entry.fields)
        if not matched:
            return view.pairs
        ids: dict[_Pair, list[str]] = {p: list(v) for p, v in view.plain_ids.items()}
        subs = self._by_topic[topic]
        for key in matched:
            sub = subs[key]
            if _live(sub, now):
                ids.setdefault((sub.subscriber, link_of(sub)), []).append(sub.subscription_id)
        if self._in_re_pairs + len(ids) > _PAIRS_KEPT:
            self._in_re.clear()
            self._in_re_pairs = 0
        self._in_re[entry.position] = {p: _say(view, p, v) for p, v in ids.items()}
        self._in_re_pairs += len(ids)
        return list(ids)

    def in_re(self, entry: JournalEntry, who: str, link: str, now: int,
              ) -> tuple[str, ...] | None:
        """The subscription ids of `who` on `link` that `entry` satisfies, for its InRe
        option; None: leave it out."""
        pair = (who, link)
        kept = self._in_re.get(entry.position)
        if kept is not None and pair in kept:
            return kept[pair]
        view = self._view(entry.topic, now)
        ids = list(view.plain_ids.get(pair, ()))
        selecting = view.selecting.get(pair)
        if selecting:
            matched = self._indexes[entry.topic].match(entry.fields)
            subs = self._by_topic[entry.topic]
            ids += [subs[k].subscription_id for k in selecting if k in matched]
        return _say(view, pair, ids) if ids else None

    def wants(self, link: str, entry: JournalEntry, now: int) -> bool:
        """Whether any live subscription on `link` satisfies `entry` (a repair's catch-up)."""
        view = self._view(entry.topic, now)
        pairs = [p for p in view.counts if p[1] == link]
        if any(p in view.plain_ids for p in pairs):
            return True
        keys = [k for p in pairs for k in view.selecting.get(p, ())]
        return bool(keys) and not self._indexes[entry.topic].match(entry.fields).isdisjoint(keys)

    def next_expiry(self) -> int:
        return min((s.expires_at for s in self.all() if s.expires_at is not None),
                   default=FOREVER)


@dataclass(slots=True)
class _View:
    """A topic's live subscriptions by (subscriber, link), as of `since`, until `until`."""

    since: int
    until: int = FOREVER
    #: pairs with a plain subscription (every message goes to them)
    pairs: tuple[_Pair, ...] = ()
    plain_ids: dict[_Pair, list[str]] = field(default_factory=dict)
    #: pair -> the keys of its selecting subscriptions
    selecting: dict[_Pair, list[Key]] = field(default_factory=dict)
    #: pair -> how many live subscriptions it has
    counts: dict[_Pair, int] = field(default_factory=dict)


def _say(view: _View, pair: _Pair, ids: list[str]) -> tuple[str, ...] | None:
    """The InRe of `pair` for a message satisfying `ids`: None where it says nothing (the
    pair's one subscription is a plain one)."""
    if view.counts.get(pair) == 1 and pair in view.plain_ids:
        return None
    return tuple(sorted(ids, key=_id_order))


def _id_order(sub_id: str) -> tuple[int, int | str]:
    """Numeric ids in numeric order, before any other (a pre-id record's topic name)."""
    return (0, int(sub_id)) if sub_id.isdigit() else (1, sub_id)
