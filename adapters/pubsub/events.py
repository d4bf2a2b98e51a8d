"""`EventNotifier`: resource event notification on the wire (docs/event-binding.md) — watch
requests in, Notifies journaled and delivered like data.

Theory of operation
-------------------
The decisions are broker/events' (`WatchTable`: grants, states, reasons, which watch a change
concerns; `events_of`: which events a message causes). This module feeds it and carries out
what it returns:

- A `watch` (data to `apex=pubsub@D`) is checked here for what the table cannot know (the
  subscriber is the originator, 537; the topic exists, 550; `pubsub:subscribe` on it, 537),
  then planned by the table (571, 572, 568, 554), then the subscriber's *notify subscription*
  is made sure of, and only then is the watch recorded. So a refusal at any step changes
  nothing. Before all that it waits until the item state holds everything the journal held
  when the watch arrived (the follower's catch-up, as for a subscribe with `cached`), so the
  current state includes every publication acknowledged before the watch; it waits outside
  the management lock, so that watches arriving together wait for one follower fetch, not one
  each. The `watchreply` is sent at once, before the Notify is journaled, so it always
  precedes the Notify on the wire (§3.3.1: "immediately after the answer").

- Notifies ride the delivery path. A Notify is a journal record on the service's topic
  `WKT=Notify`, published by `apex=pubsub@D` and stored with the fields `subscriber` and `link`.
  The notify subscription is an ordinary subscription of the subscriber to `WKT=Notify`,
  travelling on the watch's link, with the selector `link = 'LINK'`; the service's entitlement
  check lets a subscriber see only the Notifies addressed to it. So the delivery core routes a
  Notify exactly as it routes data: it takes the link's next seq, is in the link log, can be
  refilled by a gap request and resent by a source repair, and the audit sees it in the
  journal. Nothing in the delivery core knows Notifies exist. One notify subscription serves
  every watch of the subscriber on that link; it stays when the watches end (the final
  Notify must still reach it, and it costs a registry record).

- Events are read in `observe`, which the handler calls with each batch the journal follower
  hands it, just *before* the item store applies the batch: the state before a message is the
  item store's, the state after is the store's own reducer applied to it, so a Notify's events
  never disagree with what a snapshot serves. A Notify thus follows the change it reports on
  the journal, never precedes it. The handler hands over only what the item store has not
  applied (`ItemStore.unapplied`): after a restart the follower may start before where the
  store's recovery ended, and those changes were observed, their Notifies journaled, by the
  broker before. The cost, a known limit: a change Kafka acknowledged that the dead broker had
  not yet forwarded (the moment between the acknowledgement and the forward) is applied by the
  store's recovery and notified by no one.

- Permissions. A Notify carries content, so it obeys the resource's permission tokens and
  expiry as a delivery would (the service's `entitled`, XEP-0040 §5.1): the current state holds
  only the versions the subscriber may see, and a change it may not see causes no Notify at
  all, so that it cannot tell the change happened (robust-binding §2.4).

- Pending (§4.2.1). With `WatchTable.pending_on_access`, a watch whose subscriber the access
  entries do not allow on the topic is granted as PENDING (a Notify saying so, no state)
  instead of refused with 537; when the entries change (`access_changed`, from the access
  registry's watcher) each pending watch they now allow becomes ACTIVE with the current state.

- Approval (§4.2.1: "an administrator must approve"). On a topic of the table's
  `approve_topics` every watch is granted PENDING, and waits for a `decide` (data to
  `apex=pubsub@D`, answered on the data itself: `ok`, or the refusal). Who may decide: whoever
  holds `pubsub:deletetopic` on the watch's topic -- the strongest right the access entries
  give over one topic (whoever may end a topic for everyone may say who watches it); nothing
  else is 537, checked before anything else, so a non-administrator learns nothing of the
  watches. Then 550 if there is no such pending watch; an approval is 537 too while the access
  entries do not allow the subscriber (the administrator fixes them and decides again). An
  approval waits for the item state to catch up, as a watch does, so the current state it
  sends holds what was acknowledged before it. The `ok` comes once Kafka holds the new state
  in WKT=Subscriptions, so a decision answered is a decision that survives a restart.

- Expiry: one task sleeps until the table's next expiry and journals the terminated Notifies.

- WKT=Subscriptions: every state change of a watch (granted, pending, refreshed, ended) is
  journaled
  there too, as the service's other subscriptions are (content-based §6.3).

- Restarts: the table lives in memory, and its durable form is the WKT=Subscriptions messages
  above, which the item store recovers from Kafka like any cached message; `start` rebuilds the
  table from them (`_restore`) before the first journal batch is forwarded, and ends at once
  what expired meanwhile. Nothing else is kept, so nothing else has to be recovered.

Known limit: an implicit watch's notify subscription is made just after the publication that
created the watch is accepted: a change by another publisher within those milliseconds is not
notified.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import structlog

from adapters.apex.codec import BEEP_XML, Data
from adapters.apex.endpoint import Endpoint
from adapters.apex.events_codec import (
    Decision,
    NotifyDoc,
    Version,
    WatchReply,
    WatchRequest,
    decode_events,
    encode_events,
    format_events,
)
from broker.events import (
    IMPLICIT_ID,
    PERMANENT,
    Notify,
    Resource,
    State,
    Watch,
    WatchTable,
    events_of,
)
from broker.names import NOTIFY_TOPIC
from broker.publish_gate import Outcome
from broker.pubsub.service import MAX_DURATION_S
from broker.pubsub.wkt import SUBSCRIPTIONS_TOPIC, WATCH_MARK
from broker.records import JournalEntry, Publication, PublishType, RecordKind, Subscription
from broker.robust.items import ItemState, ItemVersion, reduce, unexpired
from broker.robust.linkid import default_link_id
from common.errors import AccessDenied, ApexpsError, ParameterSyntaxError, UnknownResource

if TYPE_CHECKING:
    from .handler import PubsubHandler

__all__ = ["EventNotifier"]

log = structlog.get_logger(__name__)


def _versions(entries: Iterable[JournalEntry]) -> tuple[Version, ...]:
    return tuple(Version(e.source, e.source_seq, e.publish_type, e.content_type, e.content)
                 for e in entries)


def _watch_of(entry: JournalEntry) -> Watch | None:
    """The watch a WKT=Subscriptions message describes (None if it is not a live one)."""
    f = {name: values[0] for name, values in entry.fields.items() if values}
    try:
        state = State(f["current-status"].lower())
        expires = int(f["duration"])
        watch = Watch(f["subscriber"], Resource.parse(f["resource"]), f["subscription-id"],
                      frozenset(int(e) for e in f["events"].split()), expires,
                      None if expires == PERMANENT else int(f["expires-at"]),
                      state, f["link"], int(f["created-at"]),
                      implicit=f["subscription-id"] == IMPLICIT_ID)
    except (KeyError, ValueError, ApexpsError) as exc:
        log.warning("watch message not understood", message_id=entry.message_id,
                    error=str(exc))
        return None
    return None if state is State.TERMINATED else watch


def _selector(link: str) -> str:
    return "link = '" + link.replace("'", "''") + "'"


class EventNotifier:
    """The event binding for `handler`'s service (see the module docstring)."""

    def __init__(self, handler: PubsubHandler, table: WatchTable | None = None) -> None:
        self.handler = handler
        self.table = table or WatchTable()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: (subscriber, link) whose notify subscription is known to exist
        self._routes: set[tuple[str, str]] = set()

    def start(self) -> None:
        self._restore()
        self._task = asyncio.create_task(self._expire_loop())

    def _restore(self) -> None:
        """Rebuild the watches from their WKT=Subscriptions messages, which the item store
        recovered from Kafka (§7): each live one as it was granted, with what was left of its
        Expires; one that expired while the service was down ends now, with reason timeout; a
        pending one the access entries now allow starts now."""
        items = self.handler.items
        if items is None:
            return
        restored = 0
        for entry in items.snapshot(SUBSCRIPTIONS_TOPIC):
            if WATCH_MARK not in (entry.message_id or ""):
                continue
            watch = _watch_of(entry)
            if watch is not None:
                self.table.restore(watch)
                restored += 1
        if restored:
            log.info("watches restored", watches=restored)
        self.emit(self.table.expire_due(self.handler.service.now()))
        # entries may have changed while the service was down (or the file it starts with)
        self.access_changed()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- watch requests -------------------------------------------------------------------

    @staticmethod
    def decode(content: bytes) -> WatchRequest | Decision:
        """The `watch` or `decide` in `content`; 500/501/553 refuse the data itself (nothing
        to answer under), as a notify or watchreply sent to the service does (501)."""
        doc = decode_events(content)
        if not isinstance(doc, WatchRequest | Decision):
            raise ParameterSyntaxError(f"<{type(doc).__name__}> is not a request")
        return doc

    async def request(self, originator: Endpoint, doc: WatchRequest) -> list[Data]:
        """A `watch` from `originator`: answered by a `watchreply`, then its Notify."""
        svc = self.handler.service
        whom = str(doc.subscriber or originator)
        link = doc.link or default_link_id(whom)
        try:
            if doc.expires and self.handler.sequenced is not None:
                # The current state holds what the journal held now, acknowledged or not, as
                # for a subscribe with cached (421 if that takes too long). Awaited before the
                # lock, not under it: the follower fetches lazily (up to FETCH_WAIT_MS), and
                # under the lock every watch waited for a fetch of its own, one after another
                # (81 ms a watch measured at load 6, so the last of 1,000 gateway watches passed
                # the client's 30 s); outside it, the watches that arrive together share one.
                await self.handler.sequenced.caught_up()
            async with self.handler.lock:
                if whom != str(originator):
                    raise AccessDenied(f"{originator} may not watch for {whom}")
                if svc.core.topics.get(doc.resource.topic) is None:
                    raise UnknownResource(f"no topic {doc.resource.topic!r} here")
                allowed = svc.access.allowed(whom, "pubsub:subscribe", doc.resource.topic)
                if not allowed and not self.table.pending_on_access:
                    raise AccessDenied(f"{whom} lacks pubsub:subscribe on"
                                       f" {doc.resource.topic}")
                plan = functools.partial(self.table.plan, whom, doc.resource, doc.watch_id,
                                         expires=doc.expires, events=doc.events, link=link,
                                         update=doc.update, pending=not allowed)
                plan(now=svc.now())
                if doc.expires:
                    await asyncio.to_thread(self._route, whom, link)
                notes = self.table.subscribe(whom, doc.resource, doc.watch_id,
                                             expires=doc.expires, events=doc.events,
                                             now=svc.now(), link=link, update=doc.update,
                                             pending=not allowed)
        except ApexpsError as exc:
            log.info("watch refused", originator=str(originator), resource=str(doc.resource),
                     code=int(exc.code), reason=str(exc))
            self._answer(originator, WatchReply(
                int(exc.code), doc.trans_id, doc.resource, doc.watch_id, text=str(exc),
                min_expires=getattr(exc, "min_expires", None)))
            return []
        watch = self.table.get((whom, doc.resource, doc.watch_id))
        self._answer(originator, WatchReply(
            250, doc.trans_id, doc.resource, doc.watch_id,
            0 if watch is None else watch.expires,
            frozenset() if watch is None else watch.events))
        log.info("watch", subscriber=whom, resource=str(doc.resource), id=doc.watch_id,
                 expires=0 if watch is None else watch.expires, link=link)
        self.emit(notes)
        self._wake.set()
        return []

    async def decide(self, originator: Endpoint, doc: Decision) -> list[Data]:
        """An administrator's `decide`: answered `ok` once the watch's new state is durable,
        or refused on the data (537, 550; see the module docstring) with nothing changed."""
        svc, table = self.handler.service, self.table
        topic, whom = doc.resource.topic, str(doc.subscriber)
        key = (whom, doc.resource, doc.watch_id)
        verdict = "approve" if doc.approve else "reject"
        try:
            async with self.handler.lock:
                if not svc.access.allowed(str(originator), "pubsub:deletetopic", topic):
                    raise AccessDenied(f"{originator} lacks pubsub:deletetopic on {topic},"
                                       " which deciding on its watches takes")
                table.check_decision(key)
                if doc.approve:
                    if not svc.access.allowed(whom, "pubsub:subscribe", topic):
                        raise AccessDenied(f"the access entries do not allow {whom} to watch"
                                           f" {topic} yet: change them, then approve")
                    if self.handler.sequenced is not None:
                        await self.handler.sequenced.caught_up()
                notes = table.decide(key, approve=doc.approve)
        except ApexpsError as exc:
            log.info("decision refused", originator=str(originator), verdict=verdict,
                     resource=str(doc.resource), subscriber=whom, id=doc.watch_id,
                     code=int(exc.code), reason=str(exc))
            raise
        log.info("watch decided", originator=str(originator), verdict=verdict,
                 resource=str(doc.resource), subscriber=whom, id=doc.watch_id)
        durable: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()

        def journaled(outcomes: list[Outcome]) -> None:
            if not durable.done():
                durable.set_result(outcomes)

        self.emit(notes, journaled)
        self._wake.set()
        for outcome in await durable:
            if isinstance(outcome, ApexpsError):
                raise outcome
        return []

    def _answer(self, to: Endpoint, reply: WatchReply) -> None:
        h = self.handler
        h.send(Data(h.endpoint, (to,), encode_events(reply), BEEP_XML, content_ref="#Content"))

    def _route(self, whom: str, link: str) -> None:
        """(Worker thread, under the management lock.) Make sure `whom` has its notify
        subscription on `link`: 537 if the link is another's, and nothing recorded then."""
        if (whom, link) in self._routes:
            return
        h, svc = self.handler, self.handler.service
        if any((s.link_id or default_link_id(whom)) == link
               for s in svc.subscriptions(NOTIFY_TOPIC, whom)):
            self._routes.add((whom, link))
            return
        claim = None
        if h.links is not None and h.sequenced is not None:
            h.links.check_owner(link, whom)
            claim = functools.partial(h.sequenced.claim, link, whom)
        svc.subscribe(whom, whom, NOTIFY_TOPIC, MAX_DURATION_S,
                      link=None if link == default_link_id(whom) else link, claim=claim,
                      selector_class="JMS", selector=_selector(link))
        self._routes.add((whom, link))

    # --- what the journal says happened ---------------------------------------------------

    def observe(self, entries: Iterable[JournalEntry]) -> None:
        """(On the event loop, before the item store applies `entries`.) The Notifies the
        changes among `entries` call for."""
        items, table = self.handler.items, self.table
        if items is None or not any(True for _ in table.all()):
            return
        now = self.handler.service.now()
        seen: dict[Resource, ItemState | None] = {}
        notes: list[Notify] = []
        for entry in entries:
            if entry.kind is not RecordKind.DATA or entry.message_id is None:
                continue
            res = Resource(entry.topic, entry.message_id)
            if not table.watched(res):
                continue
            before = seen[res] if res in seen else items.get(res.topic, res.message_id)
            after = reduce(before, ItemVersion(0, entry))
            seen[res] = after
            caused = events_of(entry, before is not None, after is not None, after is not before)
            notes += table.on_change(res, entry, caused, now)
        self.emit(notes)

    def access_changed(self) -> None:
        """(On the event loop.) The access entries changed: each pending watch they now allow
        becomes active and gets the current state."""
        svc, notes = self.handler.service, []
        for watch in self.table.pending():
            if self.table.awaits_decision(watch):
                continue  # an administrator's to start, not the entries'
            if svc.access.allowed(watch.subscriber, "pubsub:subscribe", watch.resource.topic):
                notes += self.table.approve(watch.key)
        self.emit(notes)

    def routes_ended(self, subs: Iterable[Subscription]) -> None:
        """(On the event loop.) Notify subscriptions that ended (the subscriber cancelled
        them, e.g. `cancel` with neither id nor topic): the watches they carried cannot reach
        their subscriber any more, and end with reason giveup."""
        for sub in subs:
            if sub.topic != NOTIFY_TOPIC:
                continue
            link = sub.link_id or default_link_id(sub.subscriber)
            self._routes.discard((sub.subscriber, link))
            self.emit(self.table.give_up(sub.subscriber, link))

    def topic_deleted(self, topic: str) -> None:
        self.emit(self.table.topic_deleted(topic))

    def published(self, publisher: str, pub: Publication, *, implicit: bool) -> None:
        """A publication was accepted: its publisher may get an implicit watch (§3.1.2)."""
        if not implicit or pub.message_id is None:
            return
        res = Resource(pub.topic, pub.message_id)
        link = default_link_id(publisher)
        watch = self.table.implicit(publisher, res, self.handler.service.now(), link=link)
        if watch is None:
            return
        log.info("implicit watch", subscriber=publisher, resource=str(res))
        self.handler.spawn(self._implicit_route(watch))

    async def _implicit_route(self, watch: Watch) -> None:
        try:
            async with self.handler.lock:
                await asyncio.to_thread(self._route, watch.subscriber, watch.link)
        except ApexpsError as exc:
            log.info("implicit watch without a route", subscriber=watch.subscriber,
                     code=int(exc.code), reason=str(exc))
            return
        self.emit([Notify(watch, State.ACTIVE, current=True)])
        self._wake.set()

    # --- journaling Notifies --------------------------------------------------------------

    def emit(self, notes: list[Notify],
             journaled: Callable[[list[Outcome]], object] | None = None) -> None:
        """Journal `notes` (and the watches' states for WKT=Subscriptions), in order; then
        `journaled` gets the outcomes."""
        if not notes:
            if journaled is not None:
                journaled([])
            return
        h = self.handler
        now = h.service.now()
        pubs: list[Publication] = []
        for note in notes:
            if note.entry is not None and not h.service.entitled(
                    note.entry, note.watch.subscriber, live=True):
                continue  # a change it may not see: not even that it happened
            pubs.append(self._notify(note, now))
            if note.current or note.state is not State.ACTIVE:  # granted, pending, ended
                w = note.watch
                pubs.append(h.wkt.watch_state(
                    subscriber=w.subscriber, resource=str(w.resource), watch_id=w.watch_id,
                    events=format_events(w.events), expires=w.expires, state=str(note.state),
                    reason=None if note.reason is None else str(note.reason),
                    created_at=w.created_at, link=w.link, expires_at=w.expires_at))

        def settled(outcomes: list[Outcome]) -> None:
            for pub, outcome in zip(pubs, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    log.error("notify not journaled", topic=pub.topic, error=str(outcome))
            # forwarded on acknowledgement, as publications are (broker/delivery/cursor.py)
            h._forward_acked(pubs, outcomes)
            if journaled is not None:
                journaled(outcomes)

        h.gate.append_many(pubs, settled)

    def _notify(self, note: Notify, now: int) -> Publication:
        w, h = note.watch, self.handler
        versions: tuple[Version, ...] = ()
        if note.current and h.items is not None:
            state = h.items.get(w.resource.topic, w.resource.message_id)
            if state is not None:
                versions = _versions(v.entry for v in unexpired(state, now)
                                     if h.service.entitled(v.entry, w.subscriber))
        elif note.entry is not None:
            versions = _versions((note.entry,))
        doc = NotifyDoc(w.resource, w.watch_id, w.subscriber, note.state, note.reason,
                        note.events, None if note.state is State.TERMINATED
                        else w.remaining_s(now), note.current, versions)
        return Publication(
            topic=NOTIFY_TOPIC, source=h.service.endpoint, content=encode_events(doc),
            content_type=BEEP_XML, publish_type=PublishType.UPDATE, publication_date=now,
            fields={"subscriber": [w.subscriber], "link": [w.link],
                    "resource": [str(w.resource)], "id": [w.watch_id]})

    async def _expire_loop(self) -> None:
        svc = self.handler.service
        while True:
            due = self.table.next_expiry()
            self._wake.clear()
            delay = None if due is None else max(0.0, (due - svc.now()) / 1000)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
                continue
            self.emit(self.table.expire_due(svc.now()))
