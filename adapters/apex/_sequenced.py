"""Sequenced fan-out: every delivery takes the next link seq of its subscriber's link
(docs/robust-binding.md §2), gap fill by link range (§5.1), heartbeats on idle links (§2.1) and
the capability query (§6), on the live pubsub path.

Ordering. One `forward` call (what the journal follower read back in one poll) becomes one
`LinkLog.append_many`; a link record is sent only once Kafka holds it, so every seq a subscriber
saw is one a restarted broker can refill and will not hand out again. Batches become durable
out of order when they span partitions, so they wait in a FIFO and are sent in the order they
were assigned: a link's seqs leave in order. A record that failed is not sent; the link log
then begins a new epoch on that link (a reset), which is what tells the subscriber.

Gap fill reads Kafka (the links topic, then the journal) in a worker thread; live data keep
flowing on the event loop meanwhile, so refill items interleave with live ones.

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
    JournalUnavailable,
    OptionNotImplemented,
    RebuildRefused,
)
from broker.journal import Journal
from broker.pubsub import PubsubService
from broker.records import JournalEntry, PublishType
from broker.robust.config import RobustConfig
from broker.robust.items import ItemStore
from broker.robust.linkid import default_link_id
from broker.robust.links import LinkItem, LinkKind, LinkLog, LinkRecord
from broker.robust.refill import refill

from ._codec import BEEP_XML, Data, Option, TargetHop
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
    RobustDocument,
    SnapshotRequest,
    Stamp,
    StampKind,
    data_stamp_xml,
    encode_robust,
    stamp_option,
)

__all__ = ["SequencedFanout"]

log = structlog.get_logger(__name__)

SERVICE = "apex=pubsub"
DEFAULT_HOPS = 8


@dataclass(slots=True)
class _Pending:
    """One append_many in flight: what each item was for, and (once known) the outcomes."""

    items: list[LinkItem]
    #: per item: the subscriber it goes to and, for DATA, the journal entry it carries
    targets: list[tuple[str, JournalEntry | None]]
    outcomes: list[LinkRecord | JournalUnavailable] | None = None
    records: list[LinkRecord] = field(default_factory=list)
    #: told, once the batch was sent, whether every record of it became durable
    then: Callable[[bool], None] | None = None


@functools.lru_cache(maxsize=65536)
def _endpoint(who: str) -> Endpoint:
    """Subscribers recur on every delivery; parse each once."""
    return Endpoint.parse(who)


def _data_stamp(rec: LinkRecord, entry: JournalEntry, refilled: bool = False) -> Option:
    return Option(STAMP_OPTION, content=data_stamp_xml(
        rec.link, rec.link_seq, epoch=rec.epoch, source=entry.source,
        source_seq=entry.source_seq, publish_type=str(entry.publish_type), topic=entry.topic,
        token=entry.permission_token, message_id=entry.message_id, time=entry.appended_at,
        refill=refilled, snapshot=rec.snapshot))


def _hop_option(entry: JournalEntry, trans_id: int) -> Option:
    hops = int(entry.options.get("dataHopping", DEFAULT_HOPS))
    return Option("dataHopping", trans_id, target_hop=TargetHop.ALL, must_understand=True,
                  content=f"<dataHopping noMoreThan='{hops}' reportErrors='true' />")


class SequencedFanout:
    """The robust side of `PubsubHandler`; `send` routes data (ApexServer.send)."""

    def __init__(self, service: PubsubService, journal: Journal, links: LinkLog,
                 config: RobustConfig, send: Callable[[Data], None], *,
                 trans_ids: itertools.count[int], items: ItemStore | None = None) -> None:
        """`items`: the data item state snapshots are taken from (none: no snapshots)."""
        self.service, self.journal, self.links, self.config = service, journal, links, config
        self.items = items
        self._send = send
        self._trans_ids = trans_ids
        self._loop = asyncio.get_running_loop()
        self.endpoint = Endpoint(SERVICE, service.domain)
        self._pending: deque[_Pending] = deque()
        #: link -> loop time of the last item put on it (for heartbeats)
        self._active: dict[str, float] = {}
        self._heartbeat_task: asyncio.Task[None] | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._heartbeat_task = asyncio.create_task(self._heartbeats())

    async def close(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat_task

    # --- live fan-out -------------------------------------------------------------------

    def entitled(self, entry: JournalEntry, subscriber: str) -> bool:
        """The permission-token filter hook (issue 6 item 7): it runs before a link seq is
        assigned, so a link never carries a seq for a message its subscriber may not see.
        Everything is delivered until permission tokens land."""
        return True

    def forward(self, entries: list[JournalEntry]) -> None:
        """Sequence `entries` onto their subscribers' links (event loop); sent once durable."""
        items: list[LinkItem] = []
        targets: list[tuple[str, JournalEntry | None]] = []
        for entry in entries:
            for who, link in self.service.recipient_links(entry.topic):
                if self.entitled(entry, who):
                    items.append(LinkItem.data(link, entry))
                    targets.append((who, entry))
        self._append(items, targets)

    def _append(self, items: list[LinkItem], targets: list[tuple[str, JournalEntry | None]],
                then: Callable[[bool], None] | None = None) -> None:
        if not items:
            return
        now = self._loop.time()
        for item in items:
            self._active[item.link] = now
        slot = _Pending(items, targets, then=then)
        self._pending.append(slot)

        def durable(outcomes: list[LinkRecord | JournalUnavailable]) -> None:
            self._loop.call_soon_threadsafe(self._settled, slot, outcomes)

        try:
            slot.records = self.links.append_many(items, durable)
        except ApexpsError as exc:
            self._pending.remove(slot)
            log.error("link log append refused; deliveries dropped (the link resets)",
                      items=len(items), error=str(exc))
            if then is not None:
                then(False)

    def _settled(self, slot: _Pending, outcomes: list[LinkRecord | JournalUnavailable]) -> None:
        slot.outcomes = outcomes
        while self._pending and self._pending[0].outcomes is not None:
            done = self._pending.popleft()
            try:
                self._emit(done)
            except Exception:  # one bad batch must not stall every later one
                log.exception("sequenced fan-out failed for a batch", items=len(done.items))
            if done.then is not None:
                done.then(not any(isinstance(o, JournalUnavailable) for o in done.outcomes
                                  or ()))

    def _emit(self, slot: _Pending) -> None:
        """Send what became durable: resets first (each precedes its link's items), then one
        data per journal entry addressed to all its recipients, each with its own stamp."""
        assert slot.outcomes is not None
        by_entry: dict[int, tuple[JournalEntry, list[Endpoint], list[tuple[Option, ...]]]] = {}
        j = 0
        for outcome, record in zip(slot.outcomes, slot.records, strict=True):
            inserted = record.kind is LinkKind.RESET and slot.items[j].kind is not LinkKind.RESET
            who, entry = slot.targets[j]
            if not inserted:
                j += 1
            if isinstance(outcome, JournalUnavailable):
                log.warning("link record not durable; not sent", link=record.link,
                            link_seq=record.link_seq, error=str(outcome))
                continue
            if entry is None or record.kind is not LinkKind.DATA:
                self._send(self._link_data(_endpoint(who), record))
                continue
            group = by_entry.get(id(entry))
            if group is None:
                group = by_entry[id(entry)] = (entry, [], [])
            group[1].append(_endpoint(who))
            group[2].append((_data_stamp(record, entry),))
        for entry, recipients, options in by_entry.values():
            self._send(Data(Endpoint(SERVICE, self.service.domain, entry.topic),
                            tuple(recipients), entry.content, entry.content_type,
                            options=(_hop_option(entry, next(self._trans_ids)),),
                            recipient_options=tuple(options),
                            content_ref="#Content" if entry.content_type == BEEP_XML else None))

    def _link_data(self, to: Endpoint, record: LinkRecord, refilled: bool = False) -> Data:
        """A heartbeat or reset of `record`'s link, as data from apex=pubsub@D."""
        doc: RobustDocument
        if record.kind is LinkKind.RESET:
            stamp = Stamp(record.link, 0, StampKind.RESET, record.epoch, time=record.recorded_at)
            doc = LinkReset("new link" if record.ordinal == 0 else None)
        else:
            stamp = Stamp(record.link, record.link_seq, StampKind.HEARTBEAT, record.epoch,
                          time=record.recorded_at, refill=refilled)
            doc = Heartbeat(self.config.heartbeat_ms)
        return Data(self.endpoint, (to,), encode_robust(doc), BEEP_XML,
                    recipient_options=((stamp_option(stamp),),), content_ref="#Content")

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
        self._append(items, targets, then)
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
            for link, who in subscribed.items():
                last = self._active.setdefault(link, now)
                if now - last >= interval:
                    items.append(LinkItem.heartbeat(link))
                    targets.append((who, None))
            self._append(items, targets)

    # --- requests -----------------------------------------------------------------------

    def _doc(self, to: Endpoint, doc: RobustDocument) -> Data:
        return Data(self.endpoint, (to,), encode_robust(doc), BEEP_XML, content_ref="#Content")

    async def request(self, originator: Endpoint, doc: RobustDocument) -> list[Data]:
        """Answer a robust document sent to apex=pubsub@D (a gap, a capability query or a
        snapshot request)."""
        if isinstance(doc, GapRequest):
            return await self._gap(originator, doc)
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
            permissions="none",  # permission tokens are not enforced yet
            trans_id=trans_id)

    async def _gap(self, originator: Endpoint, req: GapRequest) -> list[Data]:
        """§5.1: the exact items again (refill='true'), then linkreply 250; or one linkreply
        with the error, and nothing else sent and nothing changed."""
        try:
            self.links.check_owner(req.link, str(originator))
            found = await asyncio.to_thread(refill, self.links, self.journal, req.link,
                                            req.link_from, req.link_to, epoch=req.epoch)
        except ApexpsError as exc:
            head = self.links.last(req.link)
            reply = LinkReply.from_exception(
                exc, req.link, req.trans_id, epoch=None if head is None else head.epoch,
                link_seq=None if head is None else head.link_seq,
                max_gap=self.links.max_gap if isinstance(exc, RebuildRefused) else None)
            log.info("gap refused", link=req.link, originator=str(originator),
                     code=reply.code, reason=str(exc))
            return [self._doc(originator, reply)]
        out: list[Data] = []
        for record, entry in found:
            if entry is None:
                out.append(self._link_data(originator, record, refilled=True))
            else:
                out.append(Data(Endpoint(SERVICE, self.service.domain, entry.topic),
                                (originator,), entry.content, entry.content_type,
                                recipient_options=((_data_stamp(record, entry, True),),),
                                content_ref="#Content" if entry.content_type == BEEP_XML
                                else None))
        head = self.links.last(req.link)
        last = found[-1][0].link_seq if found else (None if head is None else head.link_seq)
        out.append(self._doc(originator, LinkReply(
            250, req.link, req.trans_id, None if head is None else head.epoch, last)))
        log.info("gap filled", link=req.link, originator=str(originator), items=len(found))
        return out
