"""`WatchTable`: the notifier's subscriptions to resources and their state machine, no I/O.

Theory of operation
-------------------
A *watch* is the event draft's subscription (apexps says "watch" so that it is never confused
with a topic subscription): a subscriber, a resource, an id the subscriber chose, the events it
wants, and a granted Expires. Its key is (subscriber, resource, id): the draft refreshes a
subscription "which has the same resource id and subscription id" (§3.2.4), and apexps scopes
both by the subscriber so that nobody refreshes or cancels another's.

Every change the table makes is answered with the Notifies it calls for, as values; the adapter
journals them. The table never sends, never sleeps and never reads a clock: `now` (epoch ms) is
always given.

    subscribe (new or refresh)  -> ACTIVE (PENDING if the caller says so, or its topic is
                                   one of `approve_topics`) + a Notify carrying the resource's
                                   current state (§3.3.1, on every refresh too)
    subscribe with Expires 0    -> gone + a final TERMINATED/deactivated Notify (§3.2.5)
    update (add/remove events)  -> as a refresh, with the event set changed (§3.2.2)
    approve / reject (PENDING)  -> ACTIVE + current state, or gone + TERMINATED/rejected
    decide (an administrator)   -> approve or reject, 550 if there is no such pending watch
    expiry                      -> gone + TERMINATED/timeout
    an event in its list        -> a Notify naming the events that caused it (§3.3.3)
    its resource deleted        -> (after the Notify for `deleted`, if it asked) a permanent
                                   watch is gone + TERMINATED/noresource (§3.2.1)
    its topic deleted           -> every watch of it gone + TERMINATED/noresource
    give up on a subscriber     -> its watches gone + TERMINATED/giveup

Expires. The granted Expires is the policy's (`ExpiresPolicy.grant`): never longer than asked,
at most the maximum unless permanent, 572 below the minimum. A refresh grants afresh from the
moment it is made; it may shorten what the last grant left, as the draft allows.

Implicit watches (§3.1.2, §4.3, which the draft leaves "TBD"): publishing to a resource of a
topic whose policy enables it gives the publisher a watch (id `implicit`) on the changes *others*
make to it, for the policy's events and Expires, unless the publication opts out or the publisher
already watches the resource. Each endpoint holds at most `max_implicit` of them (the draft's
§5 warns that subscriptions multiply traffic); past that none is made, and the caller logs it.
Explicit watches are bounded too (`max_per_subscriber`, 554).

Approval (§4.2.1: "an administrator must approve"): on a topic of `approve_topics` every new
watch is granted PENDING and stays so, through refreshes, until `decide` approves or rejects it
(or it expires, like any watch). Only a decision ends that wait: `pending_on_access` watches
start when the access entries allow them, approval watches do not (`awaits_decision`). An
implicit watch is the operator's own policy and is not held for approval.

Checks first, change after: every refusal is raised before anything is touched.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from broker.records import JournalEntry
from common.errors import (
    EventNotUnderstood,
    NotTaken,
    TransactionFailed,
    UnknownSubscription,
)

from ._model import PERMANENT, Event, ExpiresPolicy, Reason, Resource, State, check_events

__all__ = ["IMPLICIT_ID", "ImplicitPolicy", "Notify", "Watch", "WatchKey", "WatchTable"]

#: The id of an implicit watch.
IMPLICIT_ID = "implicit"
#: (subscriber, resource, watch id)
WatchKey = tuple[str, Resource, str]


@dataclass(frozen=True, slots=True)
class Watch:
    """One watch as it stands. `expires_at` is epoch ms, None for a permanent one."""

    subscriber: str
    resource: Resource
    watch_id: str
    events: frozenset[int]
    expires: int
    expires_at: int | None
    state: State
    link: str
    created_at: int
    implicit: bool = False

    @property
    def key(self) -> WatchKey:
        return (self.subscriber, self.resource, self.watch_id)

    def remaining_s(self, now: int) -> int:
        """Seconds left (what a Notify says of Expires); 0xffffffff for a permanent one."""
        if self.expires_at is None:
            return PERMANENT
        return max(0, (self.expires_at - now + 999) // 1000)


@dataclass(frozen=True, slots=True)
class Notify:
    """One Notify to send (§4.2.1): about `watch` (as it was when the Notify was made), its
    state and reason, the events that caused it (none for a state Notify), whether it carries
    the resource's current state (`current`: the Notify after a subscribe or refresh), and the
    journaled message that caused it, if one did."""

    watch: Watch
    state: State
    reason: Reason | None = None
    events: frozenset[int] = frozenset()
    current: bool = False
    entry: JournalEntry | None = None


@dataclass(frozen=True, slots=True)
class ImplicitPolicy:
    """Which topics give publishers implicit watches, on which events, for how long, and how
    many one endpoint may hold."""

    topics: frozenset[str] = frozenset()
    events: frozenset[int] = frozenset({int(Event.MODIFIED), int(Event.DELETED)})
    expires_s: int = 3600
    max_implicit: int = 64


@dataclass
class WatchTable:
    """The watches of one notifier. Not thread-safe: its owner calls it from one thread."""

    policy: ExpiresPolicy = field(default_factory=ExpiresPolicy)
    implicit_policy: ImplicitPolicy = field(default_factory=ImplicitPolicy)
    max_per_subscriber: int = 1024
    #: a watch the access entries do not allow (yet) waits as PENDING instead of being
    #: refused (537), and becomes active when they do (the draft's §4.2.1 Pending)
    pending_on_access: bool = False
    #: topics on which every watch waits PENDING for an administrator's `decide`
    approve_topics: frozenset[str] = frozenset()
    _by_resource: dict[Resource, dict[WatchKey, Watch]] = field(default_factory=dict)
    _expiries: list[tuple[int, WatchKey]] = field(default_factory=list)

    # --- reading --------------------------------------------------------------------------

    def get(self, key: WatchKey) -> Watch | None:
        return self._by_resource.get(key[1], {}).get(key)

    def all(self) -> Iterator[Watch]:
        for watches in self._by_resource.values():
            yield from watches.values()

    def of(self, subscriber: str) -> list[Watch]:
        return [w for w in self.all() if w.subscriber == subscriber]

    def watched(self, resource: Resource) -> bool:
        return resource in self._by_resource

    def next_expiry(self) -> int | None:
        """The earliest time a watch may expire (stale entries are skipped lazily)."""
        while self._expiries:
            at, key = self._expiries[0]
            watch = self.get(key)
            if watch is not None and watch.expires_at == at:
                return at
            heapq.heappop(self._expiries)
        return None

    # --- the subscriber's requests --------------------------------------------------------

    def plan(self, subscriber: str, resource: Resource, watch_id: str, *, expires: int,
             events: Iterable[int], now: int, link: str, update: str | None = None,
             pending: bool = False) -> Watch | None:
        """What `subscribe` with these arguments would make the watch (None: a cancel), or the
        refusal it would raise, without changing anything: a caller with more checks of its
        own makes them between the two."""
        key: WatchKey = (subscriber, resource, watch_id)
        old = self.get(key)
        asked = frozenset(events)
        if expires == 0:
            if old is None:
                raise UnknownSubscription(f"no watch {watch_id!r} of {resource} to cancel")
            return None
        if update is not None:
            if old is None:
                raise UnknownSubscription(f"no watch {watch_id!r} of {resource} to update")
            check_events(asked)
            asked = old.events | asked if update == "add" else old.events - asked
            if not asked:
                raise EventNotUnderstood("an update may not remove every event (§3.2.2)")
        wanted = check_events(asked)
        granted = self.policy.grant(expires)
        pending = pending or resource.topic in self.approve_topics
        if old is None and sum(1 for w in self.of(subscriber)
                               if not w.implicit) >= self.max_per_subscriber:
            raise TransactionFailed(f"{subscriber} holds {self.max_per_subscriber} watches")
        return Watch(subscriber, resource, watch_id, wanted, granted,
                     None if granted == PERMANENT else now + granted * 1000,
                     State.PENDING if pending and (old is None or old.state is State.PENDING)
                     else State.ACTIVE,
                     link, now if old is None else old.created_at)

    def subscribe(self, subscriber: str, resource: Resource, watch_id: str, *, expires: int,
                  events: Iterable[int], now: int, link: str, update: str | None = None,
                  pending: bool = False) -> list[Notify]:
        """§3.2.3-3.2.5, §3.3.1: create, refresh, update (`update` 'add' or 'remove' the
        events from an existing watch's) or cancel (`expires` 0) a watch. Returns the Notifies:
        the current state after a grant, the final one after a cancel. The granted Expires is
        the watch's `expires` (`get`). Raises 571, 572, 568 (cancel or update of no watch),
        554 (too many watches) before changing anything."""
        watch = self.plan(subscriber, resource, watch_id, expires=expires, events=events,
                          now=now, link=link, update=update, pending=pending)
        if watch is None:
            old = self.get((subscriber, resource, watch_id))
            assert old is not None
            return [self._end(old, Reason.DEACTIVATED)]
        self._put(watch)
        return [Notify(watch, watch.state, current=watch.state is State.ACTIVE)]

    def pending(self) -> list[Watch]:
        return [w for w in self.all() if w.state is State.PENDING]

    def awaits_decision(self, watch: Watch) -> bool:
        """Whether `watch` waits for an administrator (not merely for the access entries)."""
        return watch.state is State.PENDING and watch.resource.topic in self.approve_topics

    def check_decision(self, key: WatchKey) -> Watch:
        """The pending watch a decision about `key` would concern; 550 if there is none (no
        such watch, or it is not pending), without changing anything."""
        watch = self.get(key)
        if watch is None or watch.state is not State.PENDING:
            raise NotTaken(f"no pending watch {key[2]!r} of {key[0]} on {key[1]}")
        return watch

    def decide(self, key: WatchKey, *, approve: bool) -> list[Notify]:
        """An administrator's verdict on a pending watch: `approve` or `reject` it; 550 (as
        `check_decision`) before changing anything."""
        self.check_decision(key)
        return self.approve(key) if approve else self.reject(key)

    def approve(self, key: WatchKey) -> list[Notify]:
        """A pending watch becomes active and gets the current state."""
        watch = self.get(key)
        if watch is None or watch.state is not State.PENDING:
            return []
        watch = replace(watch, state=State.ACTIVE)
        self._put(watch)
        return [Notify(watch, State.ACTIVE, current=True)]

    def reject(self, key: WatchKey) -> list[Notify]:
        watch = self.get(key)
        if watch is None or watch.state is not State.PENDING:
            return []
        return [self._end(watch, Reason.REJECTED)]

    # --- what happens to resources and time ------------------------------------------------

    def expire_due(self, now: int) -> list[Notify]:
        out = []
        while (at := self.next_expiry()) is not None and at <= now:
            _, key = heapq.heappop(self._expiries)
            watch = self.get(key)
            if watch is not None:
                out.append(self._end(watch, Reason.TIMEOUT))
        return out

    def on_change(self, resource: Resource, entry: JournalEntry, caused: frozenset[int],
                  now: int) -> list[Notify]:
        """The Notifies `entry`'s events `caused` on `resource` call for (§3.3.3): one per
        active, unexpired watch whose events it names (an implicit watch only for another
        publisher's change), then the end of every permanent watch if it was deleted."""
        watches = self._by_resource.get(resource)
        if not watches or not caused:
            return []
        out = []
        for watch in list(watches.values()):
            if watch.state is not State.ACTIVE or (watch.expires_at is not None
                                                   and watch.expires_at <= now):
                continue
            if watch.implicit and entry.source == watch.subscriber:
                continue
            hit = watch.events & caused
            if hit:
                out.append(Notify(watch, State.ACTIVE, events=hit, entry=entry))
        if Event.DELETED in caused:
            out += [self._end(w, Reason.NORESOURCE) for w in list(watches.values())
                    if w.expires_at is None]
        return out

    def topic_deleted(self, topic: str) -> list[Notify]:
        gone = [w for r, ws in self._by_resource.items() if r.topic == topic for w in ws.values()]
        return [self._end(w, Reason.NORESOURCE) for w in gone]

    def give_up(self, subscriber: str, link: str | None = None) -> list[Notify]:
        """The notifier gives up on `subscriber`'s watches (on `link`, or all): it can no
        longer reach them there."""
        return [self._end(w, Reason.GIVEUP) for w in self.of(subscriber)
                if link is None or w.link == link]

    def implicit(self, publisher: str, resource: Resource, now: int, *, link: str,
                 ) -> Watch | None:
        """§3.1.2: the implicit watch publishing `resource` gives `publisher`, if its topic's
        policy gives one and the publisher has none on it and is under its bound; else None
        (also when it already watches the resource: nothing changes)."""
        pol = self.implicit_policy
        if resource.topic not in pol.topics:
            return None
        if any(w.subscriber == publisher for w in self._by_resource.get(resource, {}).values()):
            return None
        if sum(1 for w in self.of(publisher) if w.implicit) >= pol.max_implicit:
            return None
        granted = self.policy.grant(pol.expires_s)
        watch = Watch(publisher, resource, IMPLICIT_ID, pol.events, granted,
                      None if granted == PERMANENT else now + granted * 1000, State.ACTIVE,
                      link, now, implicit=True)
        self._put(watch)
        return watch

    def restore(self, watch: Watch) -> None:
        """Put back a watch as it was granted (a restart rebuilding the table)."""
        self._put(watch)

    # --- bookkeeping ----------------------------------------------------------------------

    def _put(self, watch: Watch) -> None:
        self._by_resource.setdefault(watch.resource, {})[watch.key] = watch
        if watch.expires_at is not None:
            heapq.heappush(self._expiries, (watch.expires_at, watch.key))

    def _end(self, watch: Watch, reason: Reason) -> Notify:
        watches = self._by_resource.get(watch.resource, {})
        watches.pop(watch.key, None)
        if not watches:
            self._by_resource.pop(watch.resource, None)
        return Notify(replace(watch, state=State.TERMINATED), State.TERMINATED, reason)
