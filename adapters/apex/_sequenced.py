"""Sequenced fan-out: every delivery takes the next link seq of its subscriber's link
(docs/robust-binding.md §2), gap fill by link range (§5.1), heartbeats on idle links (§2.1) and
the capability query (§6), on the live pubsub path.

Ordering. What `forward` is handed becomes a `LinkLog.append_many`; a link record is sent only
once Kafka holds it, so every seq a subscriber saw is one a restarted broker can refill and will
not hand out again. Batches become durable out of order when they span partitions, so they wait
in a FIFO and are sent in the order they were assigned: a link's seqs leave in order. A record
that failed is not sent; the link log then begins a new epoch on that link (a reset), which is
what tells the subscriber.

Coalescing. An append costs the event loop much the same for one message as for twenty: a
Kafka produce per links partition, a delivery report hop, and above all one data (one socket
write) per subscriber when it is sent. At paced rates the follower hands over one message at a
time, so while `APPENDS_IN_FLIGHT` appends are unsettled, what `forward` (and the heartbeats,
and the end of a hold) would append is *gathered* instead, in order, and appended as one batch
when the oldest settles, or at once when `GATHER_LIMIT` link items are waiting. An idle fan-out
appends at once, so a quiet link gains no latency. Any other append (a repair's reset and
catch-up, a snapshot) first appends what was gathered: link order is call order. The fan-out
mark counts gathered entries as not yet durable.

Gap fill reads Kafka (the links topic, then the journal) in a worker thread; live data keep
flowing on the event loop meanwhile, so refill items interleave with live ones. Entitlement
(permission tokens, broker/entitlements.py) is asked again for every refilled message: one the
subscriber may no longer see is sent as a `withheld` stamp without content (§2.4), so its link
stays contiguous and nothing leaks.

Source repair (§5.2) starts a new epoch on the link: a reset stamped with the request's transID,
the catch-up (`broker.robust.repair`), then live data, with no gap and no duplicate between
them. While the catch-up is read (in a worker thread) the link is *held*: whatever `forward`
has for it waits (other links keep flowing). The catch-up ends exactly where `forward` stood
when the hold began — per journal partition, the offset after the last entry it was handed
(or the follower's start) — so what the old epoch carried is in the catch-up if the subscriber
lacks it, and what `forward` gets later comes after it. Held entries the catch-up already holds
(by source and source seq) are dropped, which only happens when the follower's position is not
known. The reset and catch-up are appended in chunks (the event loop stays responsive), then
the held entries, and the hold ends; `linkreply 250` follows the last catch-up item on the
wire. A refused repair (570, 537, 553) changes nothing: the held entries go on in the old
epoch. Repairs of one link run one after another.

Snapshots (§9). `queue_snapshot` puts the current images and deltas of a topic's data items
(broker/robust/items.py) onto a link like any data, marked as snapshot copies; run in the same
event-loop step as a subscription becomes visible to `forward`, it meets the live stream with
no gap and no duplicate. A `snapshot` request gets the same items on the requester's link, then
a reply once they are sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from broker.errors import (
    ApexpsError,
    InvalidParameter,
    JournalUnavailable,
    OptionNotImplemented,
    RebuildRefused,
)
from broker.journal import Journal
from broker.kafka_io import Position
from broker.pubsub import PubsubService
from broker.records import JournalEntry, PublishType, now_ms
from broker.robust.config import RobustConfig
from broker.robust.fanout import MARK_INTERVAL_S, FanoutMarks
from broker.robust.items import ItemStore
from broker.robust.linkid import default_link_id
from broker.robust.links import LinkItem, LinkKind, LinkLog, LinkRecord
from broker.robust.refill import Refilled, refill_chunks
from broker.robust.repair import select_catch_up

from ._batch_codec import BATCH_ITEM_CONTENT, BatchPacker, batch_item, batch_item_content
from ._codec import BEEP_XML, Data, Option, TargetHop, plain_data
from ._endpoint import Endpoint
from ._pubsub_codec import Reply, encode_pubsub
from ._robust_codec import (
    STAMP_OPTION,
    Capabilities,
    CapabilityQuery,
    GapRequest,
    Heartbeat,
    LinkReply,
    LinkReset,
    RepairRequest,
    RobustDocument,
    SnapshotRequest,
    Stamp,
    StampKind,
    Withheld,
    data_stamp_link,
    data_stamp_message,
    data_stamp_xml,
    encode_robust,
    encode_stamp,
    stamp_option,
)

__all__ = ["SequencedFanout"]

log = structlog.get_logger(__name__)

SERVICE = "apex=pubsub"
DEFAULT_HOPS = 8
#: Catch-up items per append_many: each chunk costs the event loop a few ms, not seconds.
REPAIR_CHUNK = 1000
#: Topics whose origin endpoint is kept (past it the cache starts over).
_ORIGINS_LIMIT = 65_536
_DATA, _HEARTBEAT, _RESET = LinkKind.DATA, LinkKind.HEARTBEAT, LinkKind.RESET
#: Live appends unsettled before `forward` gathers (see "Coalescing" above).
APPENDS_IN_FLIGHT = 1
#: Link items gathered at most before they are appended regardless (a burst's batch: a few ms
#: of a flat-out publisher at ten subscribers, well inside a links pack's limits).
GATHER_LIMIT = 1024
#: How long a snapshot waits for the journal follower to reach what the journal held when the
#: request came, before it answers 421 rather than serve a state that misses acknowledged data.
CATCH_UP_S = 10.0


@dataclass(frozen=True, slots=True)
class _RepairReset:
    """What the reset that begins a repair epoch says beyond the record: the request's transID
    and a time at or before every journal time the epoch carries (§2)."""

    trans_id: int
    time: int


@dataclass(slots=True)
class _Pending:
    """One append_many in flight: what each item was for, and (once known) the outcomes."""

    items: list[LinkItem]
    #: per item: the subscriber it goes to and, for DATA, the journal entry it carries
    targets: list[tuple[str, JournalEntry | None]]
    outcomes: list[LinkRecord | JournalUnavailable] | None = None
    records: list[LinkRecord] = field(default_factory=list)
    #: the RESET item of this batch answers a source repair
    repair: _RepairReset | None = None
    #: runs once the batch has been sent (after its last item)
    then: Callable[[_Pending], None] | None = None
    #: its data go packed up to this many per `<batch>` (§5.4; one link's catch-up only)
    batch: int | None = None

    @property
    def ok(self) -> bool:
        """Every record of the batch became durable (and was sent)."""
        return self.outcomes is not None and not any(
            isinstance(o, JournalUnavailable) for o in self.outcomes)


@dataclass(slots=True)
class _Repair:
    """One source repair on its way out: whether any of its records failed."""

    link: str
    trans_id: int
    to: Endpoint
    failed: JournalUnavailable | None = None
    #: the request's `batch`
    batch: int | None = None
    #: loop time the repair was taken up
    began: float = 0.0


@functools.lru_cache(maxsize=65536)
def _endpoint(who: str) -> Endpoint:
    """Subscribers recur on every delivery; parse each once."""
    return Endpoint.parse(who)


def _stamp_xml(rec: LinkRecord, entry: JournalEntry, refilled: bool = False) -> str:
    return data_stamp_xml(
        rec.link, rec.link_seq, epoch=rec.epoch, source=entry.source,
        source_seq=entry.source_seq, publish_type=str(entry.publish_type), topic=entry.topic,
        token=entry.permission_token, message_id=entry.message_id, time=entry.appended_at,
        refill=refilled, snapshot=rec.snapshot)


#: id(entry) -> (entry, its stamp's message part, its batch item's content part), for the
#: messages of one fan-out turn; the entry is kept so that a reused id never matches
_ItemParts = dict[int, tuple[JournalEntry, str, str]]


def _batch_data_item(rec: LinkRecord, entry: JournalEntry, refilled: bool,
                     known: _ItemParts) -> str:
    """`batch_data_item(_stamp_xml(rec, entry, refilled), …)`, with what depends only on the
    message (its stamp's message part, its content in base64) made once per message however
    many links of a fan-out turn it goes to (`known` keeps them for the turn)."""
    parts = known.get(id(entry))
    if parts is None or parts[0] is not entry:
        message = data_stamp_message(
            entry.source, entry.source_seq, str(entry.publish_type), entry.topic,
            token=entry.permission_token, message_id=entry.message_id, time=entry.appended_at)
        parts = known[id(entry)] = (
            entry, message, batch_item_content(entry.content, entry.content_type))
    stamp = data_stamp_link(rec.link, rec.link_seq, parts[1], epoch=rec.epoch,
                            refill=refilled, snapshot=rec.snapshot)
    return f"<item>{stamp}{parts[2]}"


def _data_stamp(rec: LinkRecord, entry: JournalEntry, refilled: bool = False) -> Option:
    return Option(STAMP_OPTION, content=_stamp_xml(rec, entry, refilled))


def _hop_option(entry: JournalEntry, trans_id: int) -> Option:
    hops = int(entry.options.get("dataHopping", DEFAULT_HOPS))
    return Option("dataHopping", trans_id, target_hop=TargetHop.ALL, must_understand=True,
                  content=f"<dataHopping noMoreThan='{hops}' reportErrors='true' />")


def _withheld_stamp(record: LinkRecord) -> Stamp:
    return Stamp(record.link, record.link_seq, StampKind.WITHHELD, record.epoch, refill=True)


class _Packer:
    """Sends one link's items packed into `<batch>` documents (§5.4), in link order: what
    cannot travel in a batch (a reset, content over BATCH_ITEM_CONTENT) goes on its own, after
    what was packed before it."""

    def __init__(self, fanout: SequencedFanout, link: str, limit: int,
                 send: Callable[[Data], None] | None = None,
                 known: _ItemParts | None = None) -> None:
        """`known`: the message parts of the turn, shared by the turn's packers."""
        self._fanout = fanout
        self._known: _ItemParts = {} if known is None else known
        self._send = send or fanout._send
        self._packer = BatchPacker(link, limit)
        self._to: Endpoint | None = None

    def data(self, to: Endpoint, record: LinkRecord, entry: JournalEntry,
             refilled: bool = False) -> None:
        if len(entry.content) > BATCH_ITEM_CONTENT:
            self.single(to, self._fanout._delivery(to, record, entry, refilled))
        else:
            self._add(to, _batch_data_item(record, entry, refilled, self._known))

    def item(self, to: Endpoint, stamp: Stamp, doc: RobustDocument) -> None:
        """A heartbeat or withheld item."""
        self._add(to, batch_item(encode_stamp(stamp), encode_robust(doc)))

    def single(self, to: Endpoint, data: Data) -> None:
        self.close()
        self._send(data)

    def close(self) -> None:
        done = self._packer.flush()
        if done is not None and self._to is not None:
            self._send(plain_data(self._fanout.endpoint, (self._to,), done, BEEP_XML))

    def _add(self, to: Endpoint, item: str) -> None:
        if self._to is not None and to is not self._to and to != self._to:
            self.close()  # a batch goes to one subscriber
        self._to = to
        done = self._packer.add(item)
        if done is not None:
            self._send(plain_data(self._fanout.endpoint, (to,), done, BEEP_XML))


class SequencedFanout:
    """The robust side of `PubsubHandler`; `send` routes data (ApexServer.send)."""

    def __init__(self, service: PubsubService, journal: Journal, links: LinkLog,
                 config: RobustConfig, send: Callable[[Data], None], *,
                 trans_ids: itertools.count[int], items: ItemStore | None = None,
                 marks: FanoutMarks | None = None) -> None:
        """`items`: the data item state snapshots are taken from (none: no snapshots).
        `marks`: where the fan-out mark is kept (broker/robust/fanout.py; none: not kept)."""
        self.service, self.journal, self.links, self.config = service, journal, links, config
        self.items = items
        self._send = send
        self._trans_ids = trans_ids
        self._loop = asyncio.get_running_loop()
        self.endpoint = Endpoint(SERVICE, service.domain)
        self._pending: deque[_Pending] = deque()
        #: what plain appends gathered while appends were in flight ("Coalescing" above)
        self._gathered: list[LinkItem] = []
        self._gathered_targets: list[tuple[str, JournalEntry | None]] = []
        #: link -> loop time of the last item put on it (for heartbeats)
        self._active: dict[str, float] = {}
        self._heartbeat_task: asyncio.Task[None] | None = None
        #: link under repair -> what forward() had for it meanwhile (subscriber, entry)
        self._held: dict[str, list[tuple[str, JournalEntry]]] = {}
        #: journal partition -> offset of the last entry forward() was handed
        self._forwarded: dict[int, int] = {}
        #: journal partition -> where the follower began (set by `follow`)
        self._follow_start: dict[int, int] | None = None
        #: link -> the repair that runs last on it (the next waits for it)
        self._repair_tail: dict[str, asyncio.Future[None]] = {}
        self._repairs: set[asyncio.Task[None]] = set()
        self._marks = marks
        #: (link, journal position) already on the link, from before a restart (`follow`)
        self._carried: set[tuple[str, Position]] = set()
        self._when_read: Callable[[Callable[[], None]], None] | None = None
        #: link -> the most items one `<batch>` of its live data holds (batch_live)
        self._live_batch: dict[str, int] = {}
        self._mark_task: asyncio.Task[None] | None = None
        #: topic -> the endpoint its data come from (`_origin`)
        self._origins: dict[str, Endpoint] = {}

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._heartbeat_task = asyncio.create_task(self._heartbeats())
        if self._marks is not None:
            self._mark_task = asyncio.create_task(self._keep_marks(self._marks))

    async def close(self) -> None:
        self._append_gathered()
        for task in [self._heartbeat_task, self._mark_task, *self._repairs]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._marks is not None:
            self._marks.write(self.mark())

    # --- the fan-out mark (broker/robust/fanout.py) -------------------------------------

    def mark(self) -> dict[int, int]:
        """Per journal partition, the offset below which every entry `forward` was handed is
        durable on its links: what was handed, less anything still on its way to the link
        log (a pending or gathered batch) or held back by a source repair."""
        mark = {part: offset + 1 for part, offset in self._forwarded.items()}
        waiting = [entry for slot in self._pending for _, entry in slot.targets
                   if entry is not None]
        waiting += [entry for _, entry in self._gathered_targets if entry is not None]
        waiting += [entry for held in self._held.values() for _, entry in held]
        for entry in waiting:
            part, offset = entry.position
            if offset < mark.get(part, offset + 1):
                mark[part] = offset
        return mark

    async def _keep_marks(self, marks: FanoutMarks) -> None:
        while True:
            await asyncio.sleep(MARK_INTERVAL_S)  # a period, not a wait for an event
            try:
                marks.write(self.mark())
            except ApexpsError as exc:
                log.warning("fan-out mark not written", error=str(exc))

    def follow(self, start: dict[int, int],
               carried: set[tuple[str, Position]] | None = None,
               when_read: Callable[[Callable[[], None]], None] | None = None) -> None:
        """The journal follower starts at `start` (offset per partition): what precedes it was
        never forwarded, so a repair's catch-up reaches at least that far. `carried`: (link,
        journal position) pairs already on their links although beyond the fan-out mark (a
        restart, broker/robust/fanout.py): not put on those links again. `when_read`: the
        follower's `JournalFollower.when_read`, which snapshots wait on."""
        self._follow_start = dict(start)
        self._carried = set(carried or ())
        self._when_read = when_read

    def claim(self, link: str, owner: str) -> None:
        """Claim `link` for `owner` (on subscribe, in a worker thread) and send the reset that
        begins it, if the claim made one. Called before the subscription is recorded, so the
        reset goes out before anything else on the link (the event loop runs callbacks in the
        order they were scheduled, and deliveries are scheduled only once durable)."""
        record = self.links.claim(link, owner)
        if record is not None:
            self._loop.call_soon_threadsafe(self._send,
                                            self._link_data(_endpoint(owner), record))

    # --- live fan-out -------------------------------------------------------------------

    def entitled(self, entry: JournalEntry, subscriber: str) -> bool:
        """The permission-token filter (XEP-0040 §5.1, `PubsubService.entitled`): it runs
        before a link seq is assigned, so a link never carries a seq for a message its
        subscriber was not entitled to; a gap fill asks again. A source repair's catch-up calls
        it from a worker thread: the access cache behind it is thread-safe."""
        return self.service.entitled(entry, subscriber)

    def forward(self, entries: list[JournalEntry]) -> None:
        """Sequence `entries` onto their subscribers' links (event loop); sent once durable."""
        items: list[LinkItem] = []
        targets: list[tuple[str, JournalEntry | None]] = []
        held, forwarded, carried = self._held, self._forwarded, self._carried
        recipient_links, entitled = self.service.recipient_links_now, self.entitled
        for entry in entries:
            part, offset = position = entry.position
            forwarded[part] = offset
            # what LinkItem.data(link, entry) makes, but built here: once per delivery
            source, source_seq = entry.source, entry.source_seq
            for who, link in recipient_links(entry.topic):
                if carried and (link, position) in carried:
                    carried.discard((link, position))  # on the link before a restart
                    continue
                if entitled(entry, who):
                    if held and link in held:  # under repair: after the catch-up
                        held[link].append((who, entry))
                        continue
                    items.append(LinkItem(link, _DATA, position, source, source_seq, None,
                                          False))
                    targets.append((who, entry))
        self._queue(items, targets)

    def _queue(self, items: list[LinkItem],
               targets: list[tuple[str, JournalEntry | None]]) -> None:
        """Append `items` at once if fewer than APPENDS_IN_FLIGHT appends are unsettled, else
        gather them for the next one ("Coalescing" in the module docstring)."""
        if not items:
            return
        gathered = self._gathered
        gathered += items
        self._gathered_targets += targets
        if len(self._pending) < APPENDS_IN_FLIGHT or len(gathered) >= GATHER_LIMIT:
            self._append_gathered()
        else:
            now = self._loop.time()
            for item in items:  # waiting to be appended: no heartbeat meanwhile
                self._active[item.link] = now

    def _append_gathered(self) -> None:
        if self._gathered:
            items, targets = self._gathered, self._gathered_targets
            self._gathered, self._gathered_targets = [], []
            self._append(items, targets)

    def _append(self, items: list[LinkItem], targets: list[tuple[str, JournalEntry | None]],
                *, repair: _RepairReset | None = None,
                then: Callable[[_Pending], None] | None = None,
                batch: int | None = None) -> _Pending | None:
        """Assign seqs to `items` and queue them, after whatever was gathered; the slot, or
        None if nothing was appended (no items, or the link log refused the batch)."""
        if not items:
            return None
        if self._gathered:
            self._append_gathered()
        now = self._loop.time()
        for item in items:
            self._active[item.link] = now
        slot = _Pending(items, targets, repair=repair, then=then, batch=batch)
        self._pending.append(slot)

        def durable(outcomes: list[LinkRecord | JournalUnavailable]) -> None:
            self._loop.call_soon_threadsafe(self._settled, slot, outcomes)

        try:
            slot.records = self.links.append_many(items, durable)
        except ApexpsError as exc:
            self._pending.remove(slot)
            log.error("link log append refused; deliveries dropped (the link resets)",
                      items=len(items), error=str(exc))
            return None
        return slot

    def _settled(self, slot: _Pending, outcomes: list[LinkRecord | JournalUnavailable]) -> None:
        slot.outcomes = outcomes
        while self._pending and self._pending[0].outcomes is not None:
            done = self._pending.popleft()
            try:
                self._emit(done)
            except Exception:  # one bad batch must not stall every later one
                log.exception("sequenced fan-out failed for a batch", items=len(done.items))
            if done.then is not None:
                try:
                    done.then(done)
                except Exception:
                    log.exception("after-send hook failed for a batch")
        if self._gathered and len(self._pending) < APPENDS_IN_FLIGHT:
            self._append_gathered()

    def _emit(self, slot: _Pending) -> None:
        """Send what became durable: resets first (each precedes its link's items), then one
        data per journal entry addressed to all its recipients, each with its own stamp. A
        link that takes batches (a repair's catch-up that asked, or a subscriber that asked on
        subscribe, §5.4) gets its items of the slot packed instead, in link order."""
        assert slot.outcomes is not None
        by_entry: dict[int, tuple[JournalEntry, list[Endpoint], list[tuple[Option, ...]]]] = {}
        packers: dict[str, _Packer] = {}
        known: _ItemParts = {}
        live = self._live_batch
        items, targets, batch = slot.items, slot.targets, slot.batch
        j = 0
        for outcome, record in zip(slot.outcomes, slot.records, strict=True):
            kind = record.kind
            inserted = kind is _RESET and items[j].kind is not _RESET
            who, entry = targets[j]
            if not inserted:
                j += 1
            if isinstance(outcome, JournalUnavailable):
                log.warning("link record not durable; not sent", link=record.link,
                            link_seq=record.link_seq, error=str(outcome))
                continue
            link = record.link
            packer = packers.get(link)
            if packer is None and (batch or link in live):
                packer = packers[link] = _Packer(self, link, batch or live[link], known=known)
            if entry is None or kind is not _DATA:
                if packer is not None and kind is _HEARTBEAT:
                    packer.item(_endpoint(who), *self._link_stamp(record))
                    continue
                repair = slot.repair if kind is _RESET and not inserted else None
                data = self._link_data(_endpoint(who), record, repair=repair)
                if packer is not None:
                    packer.single(_endpoint(who), data)
                else:
                    self._send(data)
                continue
            if packer is not None:
                packer.data(_endpoint(who), record, entry)
                continue
            group = by_entry.get(id(entry))
            if group is None:
                group = by_entry[id(entry)] = (entry, [], [])
            group[1].append(_endpoint(who))
            group[2].append((_data_stamp(record, entry),))
        for entry, recipients, options in by_entry.values():
            self._send(Data(self._origin(entry.topic), tuple(recipients), entry.content,
                            entry.content_type,
                            options=(_hop_option(entry, next(self._trans_ids)),),
                            recipient_options=tuple(options),
                            content_ref="#Content" if entry.content_type == BEEP_XML else None))
        for packer in packers.values():
            packer.close()

    def _origin(self, topic: str) -> Endpoint:
        """apex=pubsub/TOPIC@D, what a topic's data come from (built once per topic: an
        Endpoint checks its parts)."""
        origin = self._origins.get(topic)
        if origin is None:
            if len(self._origins) >= _ORIGINS_LIMIT:
                self._origins.clear()
            origin = self._origins[topic] = Endpoint(SERVICE, self.service.domain, topic)
        return origin

    def batch_live(self, link: str, limit: int | None) -> None:
        """From now on `link`'s live items go packed, up to `limit` per `<batch>` (§5.4; the
        subscriber asked on subscribe); None: one data each again. Kept in memory: after a
        restart a link goes unbatched until its subscriber subscribes again."""
        if limit is None:
            self._live_batch.pop(link, None)
        else:
            self._live_batch[link] = limit

    def _delivery(self, to: Endpoint, record: LinkRecord, entry: JournalEntry,
                  refilled: bool = False) -> Data:
        """One data carrying `entry` on `record`'s link seq to `to` alone."""
        return Data(self._origin(entry.topic), (to,), entry.content, entry.content_type,
                    recipient_options=((_data_stamp(record, entry, refilled),),),
                    content_ref="#Content" if entry.content_type == BEEP_XML else None)

    def _link_data(self, to: Endpoint, record: LinkRecord, refilled: bool = False, *,
                   repair: _RepairReset | None = None) -> Data:
        """A heartbeat or reset of `record`'s link, as data from apex=pubsub@D; `repair`: the
        reset answers that source repair."""
        stamp, doc = self._link_stamp(record, refilled, repair)
        return Data(self.endpoint, (to,), encode_robust(doc), BEEP_XML,
                    recipient_options=((stamp_option(stamp),),), content_ref="#Content")

    def _link_stamp(self, record: LinkRecord, refilled: bool = False,
                    repair: _RepairReset | None = None) -> tuple[Stamp, RobustDocument]:
        doc: RobustDocument
        if record.kind is LinkKind.RESET and repair is not None:
            stamp = Stamp(record.link, 0, StampKind.RESET, record.epoch,
                          time=min(repair.time, record.recorded_at), repair=repair.trans_id)
            doc = LinkReset("source repair")
        elif record.kind is LinkKind.RESET:
            stamp = Stamp(record.link, 0, StampKind.RESET, record.epoch, time=record.recorded_at)
            doc = LinkReset("new link" if record.ordinal == 0 else None)
        else:
            stamp = Stamp(record.link, record.link_seq, StampKind.HEARTBEAT, record.epoch,
                          time=record.recorded_at, refill=refilled)
            doc = Heartbeat(self.config.heartbeat_ms)
        return stamp, doc

    # --- snapshots (§9) -----------------------------------------------------------------

    def queue_snapshot(self, subscriber: str, link: str, topic: str,
                       message_id: str | None = None,
                       then: Callable[[bool], None] | None = None) -> int:
        """Put the current images and deltas of `topic`'s items (or of one item) that
        `subscriber` is entitled to onto `link`, as snapshot copies, in the order they were
        applied: per item the image first, per source rising source seqs (event loop; what
        `forward` queues after this call follows them on the link). Returns how many; `then`
        hears whether they all became durable once they are sent (not called for none)."""
        if self.items is None:
            return 0
        items: list[LinkItem] = []
        targets: list[tuple[str, JournalEntry | None]] = []
        for entry in self.items.snapshot(topic, message_id):
            if self.entitled(entry, subscriber):
                items.append(LinkItem.data(link, entry, snapshot=True))
                targets.append((subscriber, entry))
        slot = self._append(items, targets,
                            then=None if then is None else lambda done: then(done.ok))
        if slot is None and then is not None:
            then(False)  # the link log refused the batch: nothing was sent
        return len(items)

    def _snapshot_checks(self, who: str, topic: str, link: str) -> None:
        """In a worker thread: 537/550 before anything is recorded, then the link claimed."""
        if self.items is None:
            raise OptionNotImplemented("this service keeps no data item state")
        self.service.check_snapshot(who, topic)
        self.links.check_owner(link, who)
        self.links.claim(link, who)

    async def _snapshot(self, originator: Endpoint, req: SnapshotRequest) -> list[Data]:
        """The items' images and deltas on the requester's link, then `reply` 250 once they
        are sent; a refusal is one reply with its code, and nothing else sent or changed."""
        who = str(originator)
        link = req.link or default_link_id(who)
        try:
            await self._caught_up()
            await asyncio.to_thread(self._snapshot_checks, who, req.topic, link)
        except ApexpsError as exc:
            log.info("snapshot refused", topic=req.topic, originator=who, code=int(exc.code),
                     reason=str(exc))
            return [self._reply(originator, Reply(int(exc.code), req.trans_id, str(exc)))]
        sent: asyncio.Future[bool] = self._loop.create_future()

        def then(ok: bool) -> None:
            if not sent.done():
                sent.set_result(ok)

        count = self.queue_snapshot(who, link, req.topic, req.message_id, then)
        if count and not await sent:
            return [self._reply(originator, Reply(
                int(JournalUnavailable.code), req.trans_id,
                f"the snapshot did not become durable on link {link}; the link was reset"))]
        log.info("snapshot sent", topic=req.topic, message_id=req.message_id, originator=who,
                 link=link, items=count)
        return [self._reply(originator, Reply(250, req.trans_id))]

    async def _caught_up(self) -> None:
        """Until the item state holds everything the journal held now, acknowledged to its
        publishers or not (JournalUnavailable if that takes over CATCH_UP_S)."""
        if self._when_read is None:
            return
        loop, read = self._loop, self._loop.create_future()

        def done() -> None:
            if not read.done():
                read.set_result(None)

        def hop() -> None:
            loop.call_soon_threadsafe(done)
        await asyncio.to_thread(self._when_read, hop)
        try:
            await asyncio.wait_for(read, CATCH_UP_S)
        except TimeoutError:
            raise JournalUnavailable(f"the journal follower did not catch up in {CATCH_UP_S:g} s;"
                                     " ask again") from None

    def _reply(self, to: Endpoint, reply: Reply) -> Data:
        return Data(self.endpoint, (to,), encode_pubsub(reply), BEEP_XML, content_ref="#Content")

    # --- heartbeats ---------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        interval = self.config.heartbeat_ms / 1000
        tick = max(interval / 4, 0.01)
        while True:
            await asyncio.sleep(tick)
            now = self._loop.time()
            items: list[LinkItem] = []
            targets: list[tuple[str, JournalEntry | None]] = []
            subscribed = self.service.links_of_subscribers()
            for gone in self._active.keys() - subscribed.keys():
                del self._active[gone]  # no subscription travels on it any more: no heartbeats
            for gone in self._live_batch.keys() - subscribed.keys():
                del self._live_batch[gone]
            for link, who in subscribed.items():
                last = self._active.setdefault(link, now)
                if now - last >= interval and link not in self._held:
                    items.append(LinkItem.heartbeat(link))
                    targets.append((who, None))
            self._queue(items, targets)

    # --- requests -----------------------------------------------------------------------

    def _doc(self, to: Endpoint, doc: RobustDocument) -> Data:
        return Data(self.endpoint, (to,), encode_robust(doc), BEEP_XML, content_ref="#Content")

    async def request(self, originator: Endpoint, doc: RobustDocument) -> list[Data]:
        """Answer a robust document sent to apex=pubsub@D (a gap, a source repair, a
        capability query or a snapshot request)."""
        if isinstance(doc, GapRequest):
            return await self._gap(originator, doc)
        if isinstance(doc, RepairRequest):
            return self._repair(originator, doc)
        if isinstance(doc, CapabilityQuery):
            return [self._doc(originator, self.capabilities(doc.trans_id))]
        if isinstance(doc, SnapshotRequest):
            return await self._snapshot(originator, doc)
        log.info("robust document ignored", originator=str(originator),
                 document=type(doc).__name__)
        return []

    def capabilities(self, trans_id: int | None = None) -> Capabilities:
        c = self.config
        return Capabilities(
            seq_bits=self.links.space.bits, heartbeat_ms=c.heartbeat_ms,
            link_retention_ms=self.links.retention_ms, max_gap=self.links.max_gap,
            max_repair=c.max_repair,
            journal_retention_ms=self.journal.config.journal_retention_ms,
            selector_classes=(),  # subscribe takes no selector yet
            # snapshot is a request, served when there is item state to serve it from
            publish_types=tuple(t for t in PublishType
                                if self.items is not None or t is not PublishType.SNAPSHOT),
            permissions="tokens",  # in-band permission tokens, grant and deny
            trans_id=trans_id)

    async def _gap(self, originator: Endpoint, req: GapRequest) -> list[Data]:
        """§5.1: the exact items again (refill='true'), then linkreply 250; or one linkreply
        with the error, and nothing else sent and nothing changed. The items go out a chunk at
        a time while the journal is still being read (`refill_chunks`); a message found gone
        from the journal part-way gets the 569 after the items before it."""
        began = self._loop.time()
        chunks = None
        try:
            self.links.check_owner(req.link, str(originator))
            chunks = refill_chunks(self.links, self.journal, req.link, req.link_from,
                                   req.link_to, epoch=req.epoch)
            chunk = await asyncio.to_thread(next, chunks, None)
        except ApexpsError as exc:
            if chunks is not None:
                chunks.close()
            return [self._gap_refused(originator, req, exc)]
        packer = _Packer(self, req.link, req.batch) if req.batch else None
        items = withheld = 0
        last: int | None = None
        try:
            while chunk is not None:
                withheld += self._send_refill(originator, chunk, packer)
                items += len(chunk)
                last = chunk[-1][0].link_seq
                try:
                    chunk = await asyncio.to_thread(next, chunks, None)
                except ApexpsError as exc:
                    return [self._gap_refused(originator, req, exc)]
        finally:
            chunks.close()
        head = self.links.last(req.link)
        if last is None:
            last = None if head is None else head.link_seq
        log.info("gap filled", link=req.link, originator=str(originator), items=items,
                 withheld=withheld, batch=req.batch,
                 ms=round((self._loop.time() - began) * 1000))
        return [self._doc(originator, LinkReply(
            250, req.link, req.trans_id, None if head is None else head.epoch, last))]

    def _send_refill(self, to: Endpoint, chunk: Refilled, packer: _Packer | None) -> int:
        """Send one chunk of a gap fill; how many of its messages were withheld."""
        withheld = 0
        who = str(to)
        for record, entry in chunk:
            if entry is None:
                if packer is not None and record.kind is not LinkKind.RESET:
                    packer.item(to, *self._link_stamp(record, refilled=True))
                    continue
                data = self._link_data(to, record, refilled=True)
            elif not self.entitled(entry, who):
                withheld += 1
                if packer is not None:
                    packer.item(to, _withheld_stamp(record), Withheld())
                    continue
                data = self._withheld(to, record)
            elif packer is not None:
                packer.data(to, record, entry, refilled=True)
                continue
            else:
                data = self._delivery(to, record, entry, refilled=True)
            if packer is not None:
                packer.single(to, data)
            else:
                self._send(data)
        if packer is not None:
            packer.close()  # on its way before the next chunk is read
        return withheld

    def _gap_refused(self, originator: Endpoint, req: GapRequest, exc: ApexpsError) -> Data:
        head = self.links.last(req.link)
        reply = LinkReply.from_exception(
            exc, req.link, req.trans_id, epoch=None if head is None else head.epoch,
            link_seq=None if head is None else head.link_seq,
            max_gap=self.links.max_gap if isinstance(exc, RebuildRefused) else None)
        log.info("gap refused", link=req.link, originator=str(originator),
                 code=reply.code, reason=str(exc))
        return self._doc(originator, reply)

    def _withheld(self, to: Endpoint, record: LinkRecord) -> Data:
        """§2.4: the seq `record` holds, refilled without its message: no content, no source
        attributes, no time (the journal time would say when the message was published)."""
        stamp = _withheld_stamp(record)
        return Data(self.endpoint, (to,), encode_robust(Withheld()), BEEP_XML,
                    recipient_options=((stamp_option(stamp),),), content_ref="#Content")

    # --- source repair (§5.2) -----------------------------------------------------------

    def _link_reply(self, to: Endpoint, link: str, trans_id: int, exc: ApexpsError) -> Data:
        head = self.links.last(link)
        return self._doc(to, LinkReply.from_exception(
            exc, link, trans_id, epoch=None if head is None else head.epoch,
            link_seq=None if head is None else head.link_seq))

    def _repair(self, originator: Endpoint, req: RepairRequest) -> list[Data]:
        """Refuse at once what needs no reading (537, 553); otherwise answer from a task,
        since the relay's `ok` says the request was received and a long catch-up must not
        hold it back."""
        try:
            self.links.check_owner(req.link, str(originator))
            if self.links.head(req.link) is None:
                raise InvalidParameter(f"link {req.link!r} is unknown here; subscribe naming it"
                                       " first")
        except ApexpsError as exc:
            log.info("repair refused", link=req.link, originator=str(originator),
                     code=int(exc.code), reason=str(exc))
            return [self._link_reply(originator, req.link, req.trans_id, exc)]
        task = asyncio.create_task(self._repair_in_turn(originator, req))
        self._repairs.add(task)
        task.add_done_callback(self._repairs.discard)
        return []

    async def _repair_in_turn(self, originator: Endpoint, req: RepairRequest) -> None:
        """One repair of a link at a time: the next starts once the previous has appended."""
        link = req.link
        before = self._repair_tail.get(link)
        mine: asyncio.Future[None] = self._loop.create_future()
        self._repair_tail[link] = mine
        try:
            if before is not None:
                await asyncio.wait([before])
            if self._repair_tail.get(link) is not mine:
                # The subscriber asked again meanwhile (the same positions: they do not move
                # while it repairs) and takes the answer to any request of the round: serving
                # this one too would only send the same catch-up twice.
                log.info("repair superseded by a newer request", link=link,
                         trans_id=req.trans_id)
                return
            await self._repair_now(originator, req)
        except Exception as exc:  # a bug here must still answer, and free the next repair
            log.exception("source repair failed", link=link)
            self._send(self._link_reply(originator, link, req.trans_id,
                                        JournalUnavailable(f"the repair failed: {exc}")))
        finally:
            mine.set_result(None)
            if self._repair_tail.get(link) is mine:
                del self._repair_tail[link]

    def _until(self) -> dict[int, int] | None:
        """Per journal partition, the first offset forward() has not been handed."""
        if self._follow_start is None:
            return None
        return {p: max(start, self._forwarded.get(p, -1) + 1)
                for p, start in self._follow_start.items()}

    async def _repair_now(self, originator: Endpoint, req: RepairRequest) -> None:
        """Hold the link, read the catch-up, then the new epoch (or the refusal), then what
        was held; see the module docstring."""
        link = req.link
        topics = self.service.link_topics(link)
        held: list[tuple[str, JournalEntry]] = []
        self._held[link] = held
        covered: dict[str, int] = {}  # source -> highest source seq the catch-up put on
        began = self._loop.time()
        try:
            try:
                entries = await asyncio.to_thread(
                    select_catch_up, self.journal, [(p.source, p.after) for p in req.sources],
                    req.since, topics, entitled=self.entitled, limit=self.config.max_repair,
                    until=self._until())
            except ApexpsError as exc:
                log.info("repair refused", link=link, originator=str(originator),
                         code=int(exc.code), reason=str(exc))
                self._send(self._link_reply(originator, link, req.trans_id, exc))
                return
            read = self._loop.time()
            state = _Repair(link, req.trans_id, originator, batch=req.batch, began=began)
            times = [e.appended_at for e in entries] + [e.appended_at for _, e in held]
            reset = _RepairReset(req.trans_id, min([now_ms(), *times]))
            chunks = [entries[i:i + REPAIR_CHUNK]
                      for i in range(0, len(entries), REPAIR_CHUNK)] or [[]]
            for n, chunk in enumerate(chunks):
                if n:
                    await asyncio.sleep(0)  # let other links flow between chunks
                if not self._put_catch_up(state, chunk, topics, covered,
                                          reset=reset if n == 0 else None,
                                          last=n == len(chunks) - 1):
                    break
            log.info("repair answered", link=link, originator=str(originator),
                     items=len(entries), held=len(held), batch=req.batch,
                     read_ms=round((read - began) * 1000),
                     ms=round((self._loop.time() - began) * 1000))
        finally:
            # Whatever forward() held goes on the link after what was put on it (in the old
            # epoch if the repair was refused), less what the catch-up already carried.
            if self._held.pop(link, None) is held:
                items: list[LinkItem] = []
                targets: list[tuple[str, JournalEntry | None]] = []
                for who, entry in held:
                    if entry.source_seq > covered.get(entry.source, 0):
                        items.append(LinkItem.data(link, entry))
                        targets.append((who, entry))
                self._queue(items, targets)

    def _put_catch_up(self, state: _Repair, chunk: list[JournalEntry], topics: dict[str, str],
                      covered: dict[str, int], *, reset: _RepairReset | None,
                      last: bool) -> bool:
        """Append one chunk of the catch-up, the first one behind the `reset`; False if the
        link log refused it (then the subscriber has been told)."""
        link, to = state.link, str(state.to)
        items = [LinkItem.data(link, e) for e in chunk]
        targets: list[tuple[str, JournalEntry | None]] = [(topics[e.topic], e) for e in chunk]
        if reset is not None:
            items.insert(0, LinkItem.reset(link))
            targets.insert(0, (to, None))
        slot = self._append(items, targets, repair=reset, batch=state.batch,
                            then=functools.partial(self._repair_sent, state, last))
        if slot is None:
            if reset is None:
                # The catch-up is cut short: a reset nobody asked for tells the subscriber.
                self._append([LinkItem.reset(link)], [(to, None)])
            self._send(self._link_reply(state.to, link, state.trans_id, JournalUnavailable(
                "the link log refused the repair's records")))
            return False
        for e in chunk:
            covered[e.source] = e.source_seq
        return True

    def _repair_sent(self, state: _Repair, last: bool, slot: _Pending) -> None:
        """A batch of a repair was sent; after its last one, the linkreply."""
        assert slot.outcomes is not None
        for outcome in slot.outcomes:
            if isinstance(outcome, JournalUnavailable) and state.failed is None:
                state.failed = outcome
        if not last:
            return
        if state.failed is not None:
            self._send(self._link_reply(state.to, state.link, state.trans_id, state.failed))
            return
        final = slot.records[-1]  # the last catch-up item, or the reset if there was none
        self._send(self._doc(state.to, LinkReply(250, state.link, state.trans_id, final.epoch,
                                                 final.link_seq)))
        log.info("repair sent", link=state.link, trans_id=state.trans_id,
                 ms=round((self._loop.time() - state.began) * 1000))
