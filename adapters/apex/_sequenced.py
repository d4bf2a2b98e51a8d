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
flowing on the event loop meanwhile, so refill items interleave with live ones. Entitlement
(permission tokens, broker/entitlements.py) is asked again for every refilled message: one the
subscriber may no longer see is sent as a `withheld` stamp without content (§2.4), so its link
stays contiguous and nothing leaks.
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

from broker.errors import ApexpsError, JournalUnavailable, RebuildRefused
from broker.journal import Journal
from broker.pubsub import PubsubService
from broker.records import JournalEntry
from broker.robust.config import RobustConfig
from broker.robust.links import LinkItem, LinkKind, LinkLog, LinkRecord
from broker.robust.refill import refill

from ._codec import BEEP_XML, Data, Option, TargetHop
from ._endpoint import Endpoint
from ._robust_codec import (
    STAMP_OPTION,
    Capabilities,
    CapabilityQuery,
    GapRequest,
    Heartbeat,
    LinkReply,
    LinkReset,
    RobustDocument,
    Stamp,
    StampKind,
    Withheld,
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


@functools.lru_cache(maxsize=65536)
def _endpoint(who: str) -> Endpoint:
    """Subscribers recur on every delivery; parse each once."""
    return Endpoint.parse(who)


def _data_stamp(rec: LinkRecord, entry: JournalEntry, refilled: bool = False) -> Option:
    return Option(STAMP_OPTION, content=data_stamp_xml(
        rec.link, rec.link_seq, epoch=rec.epoch, source=entry.source,
        source_seq=entry.source_seq, publish_type=str(entry.publish_type), topic=entry.topic,
        token=entry.permission_token, message_id=entry.message_id, time=entry.appended_at,
        refill=refilled))


def _hop_option(entry: JournalEntry, trans_id: int) -> Option:
    hops = int(entry.options.get("dataHopping", DEFAULT_HOPS))
    return Option("dataHopping", trans_id, target_hop=TargetHop.ALL, must_understand=True,
                  content=f"<dataHopping noMoreThan='{hops}' reportErrors='true' />")


class SequencedFanout:
    """The robust side of `PubsubHandler`; `send` routes data (ApexServer.send)."""

    def __init__(self, service: PubsubService, journal: Journal, links: LinkLog,
                 config: RobustConfig, send: Callable[[Data], None], *,
                 trans_ids: itertools.count[int]) -> None:
        self.service, self.journal, self.links, self.config = service, journal, links, config
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
        """The permission-token filter (XEP-0040 §5.1, `PubsubService.entitled`): it runs
        before a link seq is assigned, so a link never carries a seq for a message its
        subscriber was not entitled to; a gap fill asks again."""
        return self.service.entitled(entry, subscriber)

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
                ) -> None:
        if not items:
            return
        now = self._loop.time()
        for item in items:
            self._active[item.link] = now
        slot = _Pending(items, targets)
        self._pending.append(slot)

        def durable(outcomes: list[LinkRecord | JournalUnavailable]) -> None:
            self._loop.call_soon_threadsafe(self._settled, slot, outcomes)

        try:
            slot.records = self.links.append_many(items, durable)
        except ApexpsError as exc:
            self._pending.remove(slot)
            log.error("link log append refused; deliveries dropped (the link resets)",
                      items=len(items), error=str(exc))

    def _settled(self, slot: _Pending, outcomes: list[LinkRecord | JournalUnavailable]) -> None:
        slot.outcomes = outcomes
        while self._pending and self._pending[0].outcomes is not None:
            done = self._pending.popleft()
            try:
                self._emit(done)
            except Exception:  # one bad batch must not stall every later one
                log.exception("sequenced fan-out failed for a batch", items=len(done.items))

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
        """Answer a robust document sent to apex=pubsub@D (a gap or a capability query)."""
        if isinstance(doc, GapRequest):
            return await self._gap(originator, doc)
        if isinstance(doc, CapabilityQuery):
            return [self._doc(originator, self.capabilities(doc.trans_id))]
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
            permissions="tokens",  # in-band permission tokens, grant and deny
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
        withheld = 0
        for record, entry in found:
            if entry is None:
                out.append(self._link_data(originator, record, refilled=True))
            elif not self.entitled(entry, str(originator)):
                withheld += 1
                out.append(self._withheld(originator, record))
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
        log.info("gap filled", link=req.link, originator=str(originator), items=len(found),
                 withheld=withheld)
        return out

    def _withheld(self, to: Endpoint, record: LinkRecord) -> Data:
        """§2.4: the seq `record` holds, refilled without its message: no content, no source
        attributes, no time (the journal time would say when the message was published)."""
        stamp = Stamp(record.link, record.link_seq, StampKind.WITHHELD, record.epoch,
                      refill=True)
        return Data(self.endpoint, (to,), encode_robust(Withheld()), BEEP_XML,
                    recipient_options=((stamp_option(stamp),),), content_ref="#Content")
