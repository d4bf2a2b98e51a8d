"""`DeliveryCore`: which link seq each delivery takes and when it may be sent — the sequenced
fan-out's decisions without I/O (docs/robust-binding.md §2, §5, §9).

Theory of operation
-------------------
Inputs are calls: `forward` (entries the journal follower handed over), the settling of an
append (through the link log's callback, hopped onto the core's thread with `defer`), `repair`
(a source repair request) and the catch-up read that answers it, `queue_snapshot`, `claimed`
(a link's first reset), `tick` (the passing of time) and `close`. Outputs are `Send`,
`Durable` and `RepairAnswer` actions through `emit`, plus appends to the link log. Kafka and
the clocks are behind `broker.delivery.ports`; nothing here does I/O or knows the wire.

Ordering: the link log off the critical path (robust-binding §2.5). What `forward` is handed
becomes a `LinkLogPort.append_many`, which assigns each item its link seq and queues the
records for Kafka; they are sent at once, in the order assigned (a link's seqs leave in
order), without waiting for Kafka to make them durable. The link log stays the evidence:
- a record that fails to become durable while the broker lives makes the link log begin a new
  epoch on that link (a reset) with its next item, so no (epoch, seq) a subscriber saw is ever
  given to another message; a gap fill of the failed seq is refused (569) and the subscriber
  repairs by source;
- a crash can lose records a subscriber already saw; a restarted broker cannot know a link's
  true head, so after a start that the log does not prove clean every link begins a new epoch
  on first use (`LinkLog.begin_new_epochs`, unless the last stop was clean), and the fan-out
  mark (below) puts what was not durable on its links again in that epoch: the subscriber's
  stub drops the source seqs it already has;
- a source repair's catch-up and a snapshot are not live traffic: they are sent only once
  durable (`_pump`; what is appended after them waits behind them, keeping link order), so
  every record a crash can lose unlogged carried live data, which the mark sends again and
  logs. (A snapshot is also rendered after the subscription it opens is active, as its InRe
  needs.)
So every range of an epoch the link log holds can be refilled exactly (invariant 4), and the
link log holds everything a subscriber saw except what a crash or a failed append lost, which
a reset reports.

Coalescing. An append costs much the same for one message as for twenty (a Kafka produce per
links partition, a delivery report). While `APPENDS_IN_FLIGHT` appends are unsettled, what
`forward`, the heartbeats and the end of a hold would append is *gathered* in order and
appended as one batch at the end of the owner's turn (a `defer`red flush), or at once when
`GATHER_LIMIT` items wait. An idle core appends at once, so a quiet link gains no latency. Any
other append (a repair's reset and catch-up, a snapshot) first appends what was gathered: link
order is call order.

The fan-out mark (`mark`): per journal partition, the offset below which every entry `forward`
was handed is durable on its links — what was handed, less what is still on its way to the
link log (unsettled, gathered) or held by a repair. A restarted broker follows the journal from
the mark, so what was sent but not durable is sent again, and logged.

Source repair (§5.2) starts a new epoch on the link: a reset stamped with the request's
transID, the catch-up, then live data, with no gap and no duplicate between them. While the
catch-up is read the link is *held*: what `forward` has for it waits (other links flow). The
catch-up ends exactly where `forward` stood when the hold began (`_until`), so what the old
epoch carried is in it and what `forward` gets later comes after it. Held entries the catch-up
already holds (by source and source seq) are dropped. The catch-up is appended a chunk per
`defer`red step, so an owner's event loop stays responsive; then the held entries, and the hold
ends. The `RepairAnswer` follows once the last catch-up item is durable. A refused repair
changes nothing: the held entries go on in the old epoch. One repair of a link runs at a
time; a request that comes while another of the same link waits replaces it (the subscriber
asked again, with the same positions, and takes the answer to any request of the round).

Snapshots (§9). `queue_snapshot` puts a topic's current item state onto a link as snapshot
copies, like any data; called in the same step as a subscription becomes visible to `forward`,
it meets the live stream with no gap and no duplicate.

Heartbeats (§2.1). `tick` puts a heartbeat on every subscribed link that has carried nothing for
a heartbeat interval, unless it is held.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from broker.kafka_io import Position
from broker.records import JournalEntry, now_ms
from broker.robust.link_records import LinkItem, LinkKind, LinkRecord
from common.errors import ApexpsError, JournalUnavailable

from .actions import Durable, Emit, Outgoing, RepairAnswer, RepairJob, RepairReset, Send
from .ports import CatchUpReader, Clock, Defer, LinkLogPort, Routes, WallClock

__all__ = ["APPENDS_IN_FLIGHT", "GATHER_LIMIT", "REPAIR_CHUNK", "DeliveryCore"]

log = structlog.get_logger(__name__)

#: Live appends unsettled before `forward` gathers until the end of the turn ("Coalescing").
APPENDS_IN_FLIGHT = 1
#: Link items gathered at most before they are appended regardless (a burst's batch: a few ms
#: of a flat-out publisher at ten subscribers, well inside a links pack's limits).
GATHER_LIMIT = 1024
#: Catch-up items per append: each chunk costs the owner's loop a few ms, not seconds.
REPAIR_CHUNK = 1000

_DATA, _HEARTBEAT, _RESET = LinkKind.DATA, LinkKind.HEARTBEAT, LinkKind.RESET
#: Per item of an append: the subscriber it goes to and, for DATA, the entry it carries.
_Targets = list[tuple[str, JournalEntry | None]]


def _now(call: Callable[[], None]) -> None:
    call()


@dataclass(slots=True)
class _Pending:
    """One append in flight: what each item was for, and (once known) the outcomes."""

    items: list[LinkItem]
    targets: _Targets
    outcomes: list[LinkRecord | JournalUnavailable] | None = None
    records: list[LinkRecord] = field(default_factory=list)
    #: the RESET item of this batch begins a source repair's epoch
    repair: RepairReset | None = None
    #: runs once the batch has been sent
    then: Callable[[_Pending], None] | None = None
    #: its items go packed up to this many per `<batch>` (one link's catch-up only)
    batch: int | None = None
    #: sent only once settled, and only what became durable (a repair's catch-up)
    durable_first: bool = False

    @property
    def ok(self) -> bool:
        """Every record of the batch became durable."""
        return self.outcomes is not None and not any(
            isinstance(o, JournalUnavailable) for o in self.outcomes)


@dataclass(slots=True)
class _RepairRun:
    """One source repair on its way: what it holds, what it has put on the link so far."""

    job: RepairJob
    topics: dict[str, str]
    held: list[tuple[str, JournalEntry]]
    chunks: list[list[JournalEntry]] = field(default_factory=list)
    next: int = 0
    reset: RepairReset | None = None
    #: source -> the highest source seq the catch-up put on the link
    covered: dict[str, int] = field(default_factory=dict)
    failed: JournalUnavailable | None = None


class DeliveryCore:
    """See the module docstring. Not thread-safe: call it on one thread."""

    def __init__(self, links: LinkLogPort, routes: Routes, reader: CatchUpReader, emit: Emit,
                 *, heartbeat_s: float, defer: Defer = _now, clock: Clock = time.monotonic,
                 wall: WallClock = now_ms) -> None:
        self._links, self._routes, self._reader, self._emit = links, routes, reader, emit
        self.heartbeat_s = heartbeat_s
        self._defer, self._clock, self._wall = defer, clock, wall
        #: appends not yet settled (the mark stays below what they carry)
        self._pending: list[_Pending] = []
        #: appends not yet sent, in assignment order: they wait behind a catch-up's
        self._unsent: deque[_Pending] = deque()
        #: a flush of what was gathered is deferred to the end of the turn
        self._flush_due = False
        #: `when_settled` callers: the appends they wait for, and their callback
        self._settle_waiters: list[tuple[set[int], Callable[[], None]]] = []
        self._gathered: list[LinkItem] = []
        self._gathered_targets: _Targets = []
        #: link -> clock time of the last item put on it (heartbeats)
        self._active: dict[str, float] = {}
        #: link under repair -> what forward() had for it meanwhile
        self._held: dict[str, list[tuple[str, JournalEntry]]] = {}
        #: links with a repair running, and the request waiting behind each
        self._repairing: set[str] = set()
        self._waiting: dict[str, RepairJob] = {}
        #: journal partition -> offset of the last entry forward() was handed
        self._forwarded: dict[int, int] = {}
        #: journal partition -> where the follower began (None: not known)
        self._follow_start: dict[int, int] | None = None
        #: (link, journal position) already on the link from before a restart
        self._carried: set[tuple[str, Position]] = set()
        #: link -> the most items one `<batch>` of its live data holds
        self._live_batch: dict[str, int] = {}

    # --- setup ----------------------------------------------------------------------------

    def follow(self, start: dict[int, int],
               carried: Iterable[tuple[str, Position]] = ()) -> None:
        """The journal follower starts at `start` (offset per partition): what precedes it was
        never forwarded, so a repair's catch-up reaches at least that far. `carried`: (link,
        journal position) pairs already on their links though beyond the fan-out mark (a
        restart, broker/robust/fanout.py): not put on those links again."""
        self._follow_start = dict(start)
        self._carried = set(carried)

    def batch_live(self, link: str, limit: int | None) -> None:
        """From now on `link`'s live items go packed, up to `limit` per `<batch>` (§5.4); None:
        one data each again. In memory only: after a restart a link goes unbatched until its
        subscriber subscribes again."""
        if limit is None:
            self._live_batch.pop(link, None)
        else:
            self._live_batch[link] = limit

    def release(self, link: str) -> None:
        """Forget what is kept for `link` beyond the link log (its heartbeat time, batching):
        it is no longer served here."""
        self._active.pop(link, None)
        self._live_batch.pop(link, None)

    def close(self) -> None:
        """Append what was gathered (the owner flushes the link log after)."""
        self._append_gathered()

    # --- what leaves ----------------------------------------------------------------------

    def entitled(self, entry: JournalEntry, subscriber: str) -> bool:
        """The permission-token and expiry filter (XEP-0040 §5.1, content-based §5.2.1):
        asked before a link seq is assigned, so a link never carries a seq for a message its
        subscriber may not see, and asked again for every refilled message (a gap fill sends
        `withheld` where it says no: a message expired since, or a token denied since)."""
        return self._routes.entitled(entry, subscriber)

    def forward(self, entries: Sequence[JournalEntry]) -> None:
        """Sequence `entries` onto their subscribers' links and send them (see "Ordering")."""
        items: list[LinkItem] = []
        targets: _Targets = []
        held, forwarded, carried = self._held, self._forwarded, self._carried
        recipient_links, entitled = self._routes.recipient_links_for, self._routes.entitled
        for entry in entries:
            part, offset = position = entry.position
            forwarded[part] = offset
            source, source_seq = entry.source, entry.source_seq
            for who, link in recipient_links(entry):  # selection: by the stored fields
                if carried and (link, position) in carried:
                    carried.discard((link, position))  # on the link before a restart
                    continue
                if entitled(entry, who, live=True):
                    if held and link in held:  # under repair: after the catch-up
                        held[link].append((who, entry))
                        continue
                    # LinkItem.data(link, entry), built inline: once per delivery
                    items.append(LinkItem(link, _DATA, position, source, source_seq, None,
                                          False))
                    targets.append((who, entry))
        self._queue(items, targets)

    def claimed(self, owner: str, record: LinkRecord) -> None:
        """`record` (durable) is the reset that began a link `owner` just claimed: send it."""
        self._emit(Send((Outgoing(owner, record, None),)))

    def queue_snapshot(self, subscriber: str, link: str, entries: Iterable[JournalEntry],
                       then: Callable[[bool], None] | None = None) -> int:
        """Put the item state `entries` (images and deltas in apply order) that `subscriber`
        is entitled to onto `link` as snapshot copies; what `forward` queues after this call
        follows them. Returns how many; `then` hears, once they are sent (or refused),
        whether they all became durable. Nothing to put: `then` is not called."""
        items: list[LinkItem] = []
        targets: _Targets = []
        for entry in entries:
            if self._routes.entitled(entry, subscriber):
                items.append(LinkItem.data(link, entry, snapshot=True))
                targets.append((subscriber, entry))
        if not items:
            return 0
        slot = self._append(items, targets, durable_first=True,
                            then=None if then is None else lambda done: then(done.ok))
        if slot is None and then is not None:
            then(False)  # the link log refused the batch: nothing was sent
        return len(items)

    def tick(self) -> float:
        """Heartbeats on the subscribed links idle for an interval; the seconds until the next
        tick is due."""
        now = self._clock()
        items: list[LinkItem] = []
        targets: _Targets = []
        subscribed = self._routes.links_of_subscribers()
        for gone in self._active.keys() - subscribed.keys():
            del self._active[gone]  # no subscription travels on it any more
        for gone in self._live_batch.keys() - subscribed.keys():
            del self._live_batch[gone]
        for link, who in subscribed.items():
            last = self._active.setdefault(link, now)
            if now - last >= self.heartbeat_s and link not in self._held:
                items.append(LinkItem.heartbeat(link))
                targets.append((who, None))
        self._queue(items, targets)
        return max(self.heartbeat_s / 4, 0.01)

    def when_settled(self, link: str, callback: Callable[[], None]) -> None:
        """Call `callback` once every record of `link` sent so far is durable or has failed
        (at once if none is settling): a gap fill reads the link log only then, since a
        subscriber may ask for seqs it was sent a moment ago."""
        self._append_gathered()
        waiting = {id(slot) for slot in self._pending
                   if any(r.link == link for r in slot.records)}
        if not waiting:
            callback()
            return
        self._settle_waiters.append((waiting, callback))

    def mark(self) -> dict[int, int]:
        """Per journal partition, the offset below which every entry `forward` was handed is
        durable on its links (see the module docstring)."""
        mark = {part: offset + 1 for part, offset in self._forwarded.items()}
        waiting = [entry for slot in self._pending for _, entry in slot.targets
                   if entry is not None]
        waiting += [entry for _, entry in self._gathered_targets if entry is not None]
        waiting += [entry for held in self._held.values() for _, entry in held]
        for entry in waiting:  # lowers a partition's mark, never makes one up
            part, offset = entry.position
            if offset < mark.get(part, -1):
                mark[part] = offset
        return mark

    # --- appends and their settling -------------------------------------------------------

    def _queue(self, items: list[LinkItem], targets: _Targets) -> None:
        """Append `items` at once if fewer than APPENDS_IN_FLIGHT appends are unsettled, else
        gather them for one append at the end of the turn."""
        if not items:
            return
        gathered = self._gathered
        gathered += items
        self._gathered_targets += targets
        if len(self._pending) < APPENDS_IN_FLIGHT or len(gathered) >= GATHER_LIMIT:
            self._append_gathered()
            return
        now = self._clock()
        for item in items:  # waiting to be appended: no heartbeat meanwhile
            self._active[item.link] = now
        if not self._flush_due:
            self._flush_due = True
            self._defer(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        self._append_gathered()

    def _append_gathered(self) -> None:
        if self._gathered:
            items, targets = self._gathered, self._gathered_targets
            self._gathered, self._gathered_targets = [], []
            self._append(items, targets)

    def _append(self, items: list[LinkItem], targets: _Targets, *,
                repair: RepairReset | None = None, then: Callable[[_Pending], None] | None = None,
                batch: int | None = None, durable_first: bool = False) -> _Pending | None:
        """Assign seqs to `items`, queue them and send them (`durable_first`: once settled),
        after whatever was gathered; the slot, or None if nothing was appended (no items, or
        the link log refused the batch)."""
        if not items:
            return None
        if self._gathered:
            self._append_gathered()
        now = self._clock()
        for item in items:
            self._active[item.link] = now
        slot = _Pending(items, targets, repair=repair, then=then, batch=batch,
                        durable_first=durable_first)
        self._pending.append(slot)
        defer = self._defer

        def durable(outcomes: list[LinkRecord | JournalUnavailable]) -> None:
            defer(lambda: self._settled(slot, outcomes))

        try:
            slot.records = self._links.append_many(items, durable)
        except ApexpsError as exc:
            self._pending.remove(slot)
            log.error("link log append refused; deliveries dropped (the link resets)",
                      items=len(items), error=str(exc))
            return None
        self._unsent.append(slot)
        self._pump()
        return slot

    def _pump(self) -> None:
        """Send what may go, in assignment order: everything up to the first catch-up append
        still settling."""
        unsent = self._unsent
        while unsent and (not unsent[0].durable_first or unsent[0].outcomes is not None):
            slot = unsent.popleft()
            try:
                self._send(slot)
            except Exception:  # one bad batch must not stall every later one
                log.exception("sequenced fan-out failed for a batch", items=len(slot.items))

    def _settled(self, slot: _Pending, outcomes: list[LinkRecord | JournalUnavailable]) -> None:
        slot.outcomes = outcomes
        self._pending.remove(slot)
        if self._unsent:
            self._pump()
        if self._settle_waiters:
            self._wake_settled(id(slot))
        durable = [o for o in outcomes if isinstance(o, LinkRecord)]
        if len(durable) < len(outcomes):
            failed = next(o for o in outcomes if isinstance(o, JournalUnavailable))
            log.warning("link records sent but not durable; their links begin a new epoch",
                        records=len(outcomes) - len(durable), error=str(failed))
        if durable:
            self._emit(Durable(durable))
        if slot.then is not None:
            try:
                slot.then(slot)
            except Exception:
                log.exception("after-settle hook failed for a batch")

    def _wake_settled(self, slot: int) -> None:
        due: list[Callable[[], None]] = []
        for waiting, callback in self._settle_waiters:
            waiting.discard(slot)
            if not waiting:
                due.append(callback)
        self._settle_waiters = [w for w in self._settle_waiters if w[0]]
        for callback in due:
            try:
                callback()
            except Exception:
                log.exception("a when_settled callback failed")

    def _send(self, slot: _Pending) -> None:
        """Emit the records of an append, in link order, as it was made (a catch-up's: those
        that became durable; a failed one's link begins a new epoch with its next append)."""
        out: list[Outgoing] = []
        outcomes = slot.outcomes if slot.durable_first else None
        packed: dict[str, int] = {}
        live = self._live_batch
        items, targets, batch = slot.items, slot.targets, slot.batch
        j = 0
        for i, record in enumerate(slot.records):
            kind = record.kind
            # a reset the link log put before an item of ours (a new or broken link)
            inserted = kind is _RESET and items[j].kind is not _RESET
            who, entry = targets[j]
            if not inserted:
                j += 1
            if outcomes is not None and isinstance(outcomes[i], JournalUnavailable):
                continue
            link = record.link
            if batch:
                packed[link] = batch
            elif link in live:
                packed[link] = live[link]
            repair = slot.repair if kind is _RESET and not inserted else None
            out.append(Outgoing(who, record, entry if kind is _DATA else None, repair))
        if out:
            self._emit(Send(out, packed))

    # --- source repair (§5.2) -------------------------------------------------------------

    def repair(self, job: RepairJob) -> None:
        """Take up a source repair of `job.link` (its requester's ownership checked by the
        owner); the answer comes as a `RepairAnswer` after the catch-up."""
        link = job.link
        if link in self._repairing:
            superseded = self._waiting.get(link)
            self._waiting[link] = job
            if superseded is not None:
                log.info("repair superseded by a newer request", link=link,
                         trans_id=superseded.trans_id)
            return
        self._start_repair(job)

    def repairing(self, link: str) -> bool:
        """Whether a repair of `link` runs (its live data are held)."""
        return link in self._repairing

    def _until(self) -> dict[int, int] | None:
        """Per journal partition, the first offset forward() has not been handed."""
        if self._follow_start is None:
            return None
        return {p: max(start, self._forwarded.get(p, -1) + 1)
                for p, start in self._follow_start.items()}

    def _start_repair(self, job: RepairJob) -> None:
        link = job.link
        self._repairing.add(link)
        run = _RepairRun(job, dict(self._routes.link_topics(link)), [])
        self._held[link] = run.held
        defer = self._defer

        def done(result: list[JournalEntry] | ApexpsError) -> None:
            defer(lambda: self._guarded(run, self._caught_up, result))

        try:
            self._reader.read(job.sources, job.since, run.topics, self._until(), done)
        except ApexpsError as exc:
            self._caught_up(run, exc)

    def _guarded(self, run: _RepairRun, step: Callable[..., None], *args: object) -> None:
        """Run a step of a repair; a bug still answers the requester and frees the link."""
        try:
            step(run, *args)
        except Exception as exc:
            log.exception("source repair failed", link=run.job.link)
            self._emit(RepairAnswer(run.job, JournalUnavailable(f"the repair failed: {exc}")))
            if run.job.link in self._repairing:
                self._end_repair(run)

    def _caught_up(self, run: _RepairRun, result: list[JournalEntry] | ApexpsError) -> None:
        job = run.job
        if isinstance(result, ApexpsError):
            log.info("repair refused", link=job.link, requester=job.who,
                     code=int(result.code), reason=str(result))
            self._emit(RepairAnswer(job, result))
            self._end_repair(run)
            return
        # The journal read selects by topic; a link's selectors take only what they match,
        # as forward() did (a message no selector of the link takes has no seq on it).
        wants = self._routes.wants
        result = [e for e in result if wants(job.link, e)]
        times = [e.appended_at for e in result] + [e.appended_at for _, e in run.held]
        run.reset = RepairReset(job.trans_id, min([self._wall(), *times]))
        run.chunks = [result[i:i + REPAIR_CHUNK]
                      for i in range(0, len(result), REPAIR_CHUNK)] or [[]]
        self._repair_step(run)

    def _repair_step(self, run: _RepairRun) -> None:
        """Append the next chunk of the catch-up (the first behind the reset); the rest in
        later steps, so live links keep flowing."""
        n = run.next
        run.next += 1
        last = n == len(run.chunks) - 1
        if self._put_catch_up(run, run.chunks[n], first=n == 0, last=last) and not last:
            self._defer(lambda: self._guarded(run, self._repair_step))
            return
        self._end_repair(run)

    def _put_catch_up(self, run: _RepairRun, chunk: list[JournalEntry], *, first: bool,
                      last: bool) -> bool:
        """Append one chunk; False if the link log refused it (the requester is told)."""
        job = run.job
        link = job.link
        items = [LinkItem.data(link, e) for e in chunk]
        targets: _Targets = [(run.topics.get(e.topic, job.who), e) for e in chunk]
        if first:
            items.insert(0, LinkItem.reset(link))
            targets.insert(0, (job.who, None))
        slot = self._append(items, targets, repair=run.reset if first else None,
                            batch=job.batch, durable_first=True,
                            then=functools.partial(self._repair_sent, run, last))
        if slot is None:
            if not first:
                # The catch-up is cut short: a reset nobody asked for tells the subscriber.
                self._append([LinkItem.reset(link)], [(job.who, None)])
            self._emit(RepairAnswer(job, JournalUnavailable(
                "the link log refused the repair's records")))
            return False
        for e in chunk:
            run.covered[e.source] = e.source_seq
        return True

    def _repair_sent(self, run: _RepairRun, last: bool, slot: _Pending) -> None:
        """A batch of a repair settled; after its last one, the answer."""
        assert slot.outcomes is not None
        for outcome in slot.outcomes:
            if isinstance(outcome, JournalUnavailable) and run.failed is None:
                run.failed = outcome
        if not last:
            return
        resent = sum(len(c) for c in run.chunks)
        if run.failed is not None:
            self._emit(RepairAnswer(run.job, run.failed, resent=resent, held=len(run.held)))
            return
        final = slot.records[-1]  # the last catch-up item, or the reset if there was none
        self._emit(RepairAnswer(run.job, None, final.epoch, final.link_seq, resent,
                                len(run.held)))

    def _end_repair(self, run: _RepairRun) -> None:
        """What `forward` held goes on the link after what the repair put on it (in the old
        epoch if it was refused), less what the catch-up carried; the next repair starts."""
        link = run.job.link
        if self._held.get(link) is run.held:
            del self._held[link]
            items: list[LinkItem] = []
            targets: _Targets = []
            for who, entry in run.held:
                if entry.source_seq > run.covered.get(entry.source, 0):
                    items.append(LinkItem.data(link, entry))
                    targets.append((who, entry))
            self._queue(items, targets)
        self._repairing.discard(link)
        waiting = self._waiting.pop(link, None)
        if waiting is not None:
            self._start_repair(waiting)
