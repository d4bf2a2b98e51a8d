"""The watch state machine (broker/events/_watches.py) against a plain model, with hypothesis'
stateful testing: subscribe, refresh, update, cancel, expiry, resource and topic deletion, in any
order and at any time, and the administrator's decisions on watches pending for approval (every
watch on q.b waits for one). The model is a dict key -> (events, expires_at); every step checks the
table agrees with it, that each grant is never longer than asked, and that every Notify is the one
the draft calls for (current state after a grant, terminated with its reason at the end)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.events import (
    PERMANENT,
    Event,
    ExpiresPolicy,
    Reason,
    Resource,
    State,
    WatchTable,
)
from broker.kafka_io import Position
from broker.records import JournalEntry, PublishType, RecordKind
from common.errors import (
    ApexpsError,
    EventNotUnderstood,
    ExpiresTooBrief,
    NotTaken,
    UnknownSubscription,
)

POLICY = ExpiresPolicy(min_s=10, max_s=100, permanent=True)
SUBSCRIBERS = ("jade@example.com", "fred@example.com")
RESOURCES = (Resource("q.a", "IBM"), Resource("q.a", "MSFT"), Resource("q.b", "IBM"))
IDS = ("1", "2")
APPROVAL_TOPIC = "q.b"

EVENTS = st.frozensets(st.sampled_from([1, 2, 3, 4, 0x8000, 0x8001, 0]), max_size=3)
EXPIRES = st.sampled_from([0, 5, 10, 50, 100, 500, PERMANENT])


def _entry(topic: str, mid: str, source: str = "pub@example.com") -> JournalEntry:
    return JournalEntry(
        position=Position(0, 1), kind=RecordKind.DATA, topic=topic, source=source, source_seq=1,
        gap_to=None, gap_reason=None, publish_type=PublishType.UPDATE, publisher_seq=None,
        message_id=mid, revision_id=None, publication_date=None, expiration_date=None,
        permission_token=None, content_type="application/xml", content=b"<x />", fields={},
        options={}, appended_at=0)


def _understood(events: frozenset[int]) -> bool:
    return bool(events) and all(e in (1, 2, 3) or e >= 0x8000 for e in events)


class WatchMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = WatchTable(policy=POLICY, approve_topics=frozenset({APPROVAL_TOPIC}))
        self.now = 1_000_000
        #: key -> (events, expires_at or None)
        self.model: dict[tuple[str, Resource, str], tuple[frozenset[int], int | None]] = {}
        #: keys of the watches that wait for approval
        self.pending: set[tuple[str, Resource, str]] = set()

    @rule(who=st.sampled_from(SUBSCRIBERS), res=st.sampled_from(RESOURCES),
          wid=st.sampled_from(IDS), expires=EXPIRES, events=EVENTS,
          update=st.sampled_from([None, None, "add", "remove"]), pending=st.booleans())
    def subscribe(self, who: str, res: Resource, wid: str, expires: int,
                  events: frozenset[int], update: str | None, pending: bool) -> None:
        key = (who, res, wid)
        old = self.model.get(key)
        try:
            notes = self.table.subscribe(who, res, wid, expires=expires, events=events,
                                         now=self.now, link=who, update=update,
                                         pending=pending)
        except ApexpsError as exc:
            # refused: why, and nothing changed (checked by the invariant)
            if (expires == 0 or update is not None) and old is None:
                assert isinstance(exc, UnknownSubscription)
                return
            if expires == 0:
                raise AssertionError("a cancel of an existing watch is never refused") from exc
            if isinstance(exc, ExpiresTooBrief):
                assert 0 < expires < POLICY.min_s and exc.min_expires == POLICY.min_s
            else:
                assert isinstance(exc, EventNotUnderstood)
            return
        if expires == 0:
            assert old is not None
            (note,) = notes
            assert note.state is State.TERMINATED and note.reason is Reason.DEACTIVATED
            del self.model[key]
            self.pending.discard(key)
            return
        assert expires >= POLICY.min_s, "below min-expires was granted"
        if update is not None:
            assert old is not None and _understood(events)
            wanted = old[0] | events if update == "add" else old[0] - events
        else:
            assert _understood(events)
            wanted = events
        granted = self.table.get(key)
        assert granted is not None
        assert granted.expires <= expires, "the grant is longer than asked"
        assert granted.expires == (PERMANENT if expires == PERMANENT
                                   else min(expires, POLICY.max_s))
        # pending only while it never was active; an active watch is not sent back to wait
        waits = (pending or res.topic == APPROVAL_TOPIC) and (old is None or key in self.pending)
        (note,) = notes
        assert note.watch == granted
        if waits:
            assert note.state is State.PENDING and not note.current
            self.pending.add(key)
        else:
            assert note.current and note.state is State.ACTIVE
            self.pending.discard(key)
        self.model[key] = (wanted, None if granted.expires == PERMANENT
                           else self.now + granted.expires * 1000)

    @rule(who=st.sampled_from(SUBSCRIBERS), res=st.sampled_from(RESOURCES),
          wid=st.sampled_from(IDS), accept=st.booleans())
    def decide(self, who: str, res: Resource, wid: str, accept: bool) -> None:
        """An administrator's approval or refusal of a pending watch; of any other, 550 and
        nothing changed (the invariant checks that)."""
        key = (who, res, wid)
        if key not in self.pending:
            with pytest.raises(NotTaken):
                self.table.decide(key, approve=accept)
            return
        watch = self.table.get(key)
        assert watch is not None
        assert self.table.awaits_decision(watch) == (res.topic == APPROVAL_TOPIC)
        notes = self.table.decide(key, approve=accept)
        (note,) = notes
        self.pending.discard(key)
        if accept:
            assert note.current and note.state is State.ACTIVE
        else:
            assert (note.state, note.reason) == (State.TERMINATED, Reason.REJECTED)
            del self.model[key]

    @rule(seconds=st.integers(0, 120))
    def time_passes(self, seconds: int) -> None:
        self.now += seconds * 1000
        ended = self.table.expire_due(self.now)
        due = {k for k, (_, at) in self.model.items() if at is not None and at <= self.now}
        assert {n.watch.key for n in ended} == due
        assert all(n.state is State.TERMINATED and n.reason is Reason.TIMEOUT for n in ended)
        for key in due:
            del self.model[key]
            self.pending.discard(key)

    @rule(res=st.sampled_from(RESOURCES),
          caused=st.sampled_from([{1}, {2}, {3}, {2, 0x8001}, {3, 0x8000}]))
    def resource_changes(self, res: Resource, caused: set[int]) -> None:
        self.table.expire_due(self.now)
        self.time_passes(0)
        notes = self.table.on_change(res, _entry(res.topic, res.message_id),
                                     frozenset(caused), self.now)
        told = {n.watch.key: n.events for n in notes if n.state is State.ACTIVE}
        expect = {k: ev & caused for k, (ev, _) in self.model.items()
                  if k[1] == res and ev & caused and k not in self.pending}
        assert told == expect, "a Notify for each watch that asked, naming its events"
        if Event.DELETED in caused:
            ended = {n.watch.key for n in notes if n.state is State.TERMINATED}
            permanent = {k for k, (_, at) in self.model.items() if k[1] == res and at is None}
            assert ended == permanent
            assert all(n.reason is Reason.NORESOURCE for n in notes
                       if n.state is State.TERMINATED)
            for key in permanent:
                del self.model[key]
                self.pending.discard(key)

    @rule(topic=st.sampled_from(["q.a", "q.b"]))
    def topic_deleted(self, topic: str) -> None:
        notes = self.table.topic_deleted(topic)
        gone = {k for k in self.model if k[1].topic == topic}
        assert {n.watch.key for n in notes} == gone
        for key in gone:
            del self.model[key]
            self.pending.discard(key)

    @invariant()
    def table_is_the_model(self) -> None:
        got = {w.key: (w.events, w.expires_at) for w in self.table.all()}
        assert got == self.model
        assert {w.key for w in self.table.all() if w.state is State.PENDING} == self.pending


WatchMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                          deadline=None)
TestWatchMachine = WatchMachine.TestCase
