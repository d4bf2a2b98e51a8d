"""`SequencedFanout`: the asyncio driver of the delivery core on the live pubsub path
(docs/robust-binding.md §2, §5, §6, §9).

The decisions — which link seq each delivery takes, coalescing, the fan-out mark, holds and
repair, heartbeats, snapshots — are `broker.delivery.DeliveryCore`'s; its theory of operation is
there. This shell turns events into its calls and its actions into I/O:
- the journal follower's entries (`forward`), on the event loop;
- the link log's delivery reports and the catch-up reads (worker threads), hopped onto the loop;
- timers: the heartbeat tick and the fan-out mark's periodic write;
- requests to apex=pubsub@D: gap fill (§5.1; the link records and journal entries read a chunk
  at a time in a worker thread while live data keep flowing; entitlement asked again for each
  refilled message), source repair (§5.2), the capability query (§6) and snapshots (§9);
- its `Send` and `RepairAnswer` actions rendered as APEX data (`_deliveries.Renderer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence

import structlog

from adapters.apex.codec import BEEP_XML, Data
from adapters.apex.endpoint import Endpoint
from adapters.apex.pubsub_codec import Reply, encode_pubsub
from adapters.apex.robust_codec import (
    Capabilities,
    CapabilityQuery,
    GapRequest,
    LinkReply,
    RepairRequest,
    RobustDocument,
    SnapshotRequest,
    encode_robust,
)
from broker.delivery import (
    Action,
    CatchUpDone,
    DeliveryCore,
    Durable,
    Outgoing,
    RepairAnswer,
    RepairJob,
    Send,
)
from broker.journal import Journal
from broker.kafka_io import Position
from broker.pubsub import PubsubService
from broker.records import JournalEntry, PublishType
from broker.robust.config import RobustConfig
from broker.robust.fanout import MARK_INTERVAL_S, FanoutMarks
from broker.robust.items import ItemStore
from broker.robust.linkid import default_link_id
from broker.robust.links import LinkLog
from broker.robust.refill import Refilled, refill_chunks
from broker.robust.repair import select_catch_up
from broker.selectors import SelectorClass
from common.errors import (
    ApexpsError,
    InvalidParameter,
    JournalUnavailable,
    OptionNotImplemented,
    RebuildRefused,
)

from ._catch_up import CatchUps
from ._deliveries import Packer, Renderer, SendData, endpoint_of
from ._on_loop import on_loop

__all__ = ["SequencedFanout"]

log = structlog.get_logger(__name__)

#: How long a snapshot waits for the journal follower to reach what the journal held when the
#: request came, before it answers 421 rather than serve a state that misses acknowledged data.
CATCH_UP_S = 10.0


class _CatchUpInThread:
    """The core's `CatchUpReader`: `select_catch_up` in a worker thread of `loop`."""

    def __init__(self, journal: Journal, service: PubsubService, limit: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._journal, self._service, self._limit, self._loop = journal, service, limit, loop

    def read(self, sources: Sequence[tuple[str, int]], since: int | None,
             topics: Mapping[str, str], until: Mapping[int, int] | None,
             done: CatchUpDone) -> None:
        def run() -> None:
            result: list[JournalEntry] | ApexpsError
            try:
                result = select_catch_up(self._journal, sources, since, topics,
                                         entitled=self._service.entitled, limit=self._limit,
                                         until=until)
            except ApexpsError as exc:
                result = exc
            except Exception as exc:  # a bug must still answer the requester
                log.exception("source repair read failed")
                result = JournalUnavailable(f"the repair failed: {exc}")
            try:
                done(result)
            except RuntimeError:  # the loop closed meanwhile (shutdown): nobody to answer
                log.info("source repair read finished after shutdown")

        self._loop.run_in_executor(None, run)


class SequencedFanout:
    """The robust side of `PubsubHandler`; `send` routes data (ApexServer.send)."""

    def __init__(self, service: PubsubService, journal: Journal, links: LinkLog,
                 config: RobustConfig, send: SendData, *,
                 trans_ids: itertools.count[int], items: ItemStore | None = None,
                 marks: FanoutMarks | None = None) -> None:
        """`items`: the data item state snapshots are taken from (none: no snapshots).
        `marks`: where the fan-out mark is kept (broker/robust/fanout.py; none: not kept)."""
        self.service, self.journal, self.links, self.config = service, journal, links, config
        self.items = items
        self._send = send
        self._loop = asyncio.get_running_loop()
        self.render = Renderer(service.domain, config.heartbeat_ms, send, trans_ids,
                               in_re=service.in_re)
        self.endpoint = self.render.endpoint
        self.core = DeliveryCore(
            links, service, _CatchUpInThread(journal, service, config.max_repair, self._loop),
            self._act, heartbeat_s=config.heartbeat_ms / 1000,
            defer=on_loop(self._loop), clock=self._loop.time)
        self._marks = marks
        self._tasks: list[asyncio.Task[None]] = []
        #: read-your-writes waits on the journal follower, shared (None: no follower)
        self._catch_ups: CatchUps | None = None
        #: link -> (link seq, future) of those awaiting `sent_through`
        self._sent_waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._heartbeats()))
        if self._marks is not None:
            self._tasks.append(asyncio.create_task(self._keep_marks(self._marks)))

    async def close(self) -> None:
        self.core.close()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._marks is not None:
            self._marks.write(self.core.mark())

    def follow(self, start: dict[int, int],
               carried: set[tuple[str, Position]] | None = None,
               when_read: Callable[[Callable[[], None]], None] | None = None) -> None:
        """See `DeliveryCore.follow`; `when_read`: the follower's `JournalFollower.when_read`,
        which snapshots wait on."""
        self.core.follow(start, carried or ())
        self._catch_ups = None if when_read is None else CatchUps(when_read, self._loop)

    def mark(self) -> dict[int, int]:
        return self.core.mark()

    async def _keep_marks(self, marks: FanoutMarks) -> None:
        while True:
            await asyncio.sleep(MARK_INTERVAL_S)  # a period, not a wait for an event
            try:
                marks.write(self.core.mark())
            except ApexpsError as exc:
                log.warning("fan-out mark not written", error=str(exc))

    async def _heartbeats(self) -> None:
        delay = max(self.core.heartbeat_s / 4, 0.01)
        while True:
            await asyncio.sleep(delay)  # the passing of time is the event here
            delay = self.core.tick()

    # --- the core's events and actions ------------------------------------------------------

    def forward(self, entries: list[JournalEntry]) -> None:
        """Sequence `entries` onto their subscribers' links and send them (event loop)."""
        self.core.forward(entries)

    def entitled(self, entry: JournalEntry, subscriber: str) -> bool:
        return self.core.entitled(entry, subscriber)

    def batch_live(self, link: str, limit: int | None) -> None:
        self.core.batch_live(link, limit)

    def claim(self, link: str, owner: str) -> None:
        """Claim `link` for `owner` (on subscribe, in a worker thread) and send the reset that
        begins it, if the claim made one. Called before the subscription is recorded, so the
        reset goes out before anything else on the link (the event loop runs callbacks in the
        order they were scheduled, and the subscription is recorded, and so routed to, only
        after this returns)."""
        record = self.links.claim(link, owner)
        if record is not None:
            self._loop.call_soon_threadsafe(self.core.claimed, owner, record)

    def _act(self, action: Action) -> None:
        if isinstance(action, Send):
            self.render.render(action)
        elif isinstance(action, Durable):
            if self._sent_waiters:
                self._wake_sent(action)
        else:
            self._answer_repair(action)

    async def sent_through(self, link: str, link_seq: int) -> None:
        """Until `link` has been sent link seq `link_seq` or a later one of its epoch and the
        link log holds it: what an operator or a test awaits instead of polling Kafka."""
        head = self.links.last(link)
        if head is not None and head.link_seq >= link_seq:
            return
        done: asyncio.Future[None] = self._loop.create_future()
        self._sent_waiters.setdefault(link, []).append((link_seq, done))
        await done

    def _wake_sent(self, action: Durable) -> None:
        for record in action.records:
            waiters = self._sent_waiters.get(record.link)
            if not waiters:
                continue
            seq = record.link_seq
            for want, done in [w for w in waiters if w[0] <= seq]:
                waiters.remove((want, done))
                if not done.done():
                    done.set_result(None)
            if not waiters:
                del self._sent_waiters[record.link]

    def _answer_repair(self, answer: RepairAnswer) -> None:
        job = answer.job
        to = endpoint_of(job.who)
        ms = round((self._loop.time() - job.began) * 1000)
        if answer.error is not None:
            log.info("repair refused", link=job.link, originator=job.who,
                     code=int(answer.error.code), reason=str(answer.error), ms=ms)
            self._send(self._link_reply(to, job.link, job.trans_id, answer.error))
            return
        self._send(self._doc(to, LinkReply(250, job.link, job.trans_id, answer.epoch,
                                           answer.link_seq)))
        log.info("repair sent", link=job.link, originator=job.who, trans_id=job.trans_id,
                 items=answer.resent, held=answer.held, batch=job.batch, ms=ms)

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
            selector_classes=tuple(c.value for c in SelectorClass),  # draft-content §7
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
            await self._settled(req.link)
            chunks = refill_chunks(self.links, self.journal, req.link, req.link_from,
                                   req.link_to, epoch=req.epoch)
            chunk = await asyncio.to_thread(next, chunks, None)
        except ApexpsError as exc:
            if chunks is not None:
                chunks.close()
            return [self._gap_refused(originator, req, exc)]
        packer = self.render.packer(req.link, req.batch) if req.batch else None
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

    async def _settled(self, link: str) -> None:
        """Until what `link` was sent so far is durable or failed (`DeliveryCore.when_settled`):
        records are sent before the link log holds them, and the request may be for them."""
        done: asyncio.Future[None] = self._loop.create_future()

        def settled() -> None:
            if not done.done():
                done.set_result(None)
        self.core.when_settled(link, settled)
        await done

    def _send_refill(self, to: Endpoint, chunk: Refilled, packer: Packer | None) -> int:
        """Send one chunk of a gap fill; how many of its messages were withheld."""
        withheld = 0
        who = str(to)
        for record, entry in chunk:
            hidden = entry is not None and not self.core.entitled(entry, who)
            withheld += hidden
            self.render.refill(to, Outgoing(who, record, entry), hidden, packer)
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

    def _link_reply(self, to: Endpoint, link: str, trans_id: int, exc: ApexpsError) -> Data:
        head = self.links.last(link)
        return self._doc(to, LinkReply.from_exception(
            exc, link, trans_id, epoch=None if head is None else head.epoch,
            link_seq=None if head is None else head.link_seq))

    def _repair(self, originator: Endpoint, req: RepairRequest) -> list[Data]:
        """Refuse at once what needs no reading (537, 553); otherwise the core takes it up and
        answers once the catch-up is sent, since the relay's `ok` says the request was
        received and a long catch-up must not hold it back."""
        try:
            self.links.check_owner(req.link, str(originator))
            if self.links.head(req.link) is None:
                raise InvalidParameter(f"link {req.link!r} is unknown here; subscribe naming it"
                                       " first")
        except ApexpsError as exc:
            log.info("repair refused", link=req.link, originator=str(originator),
                     code=int(exc.code), reason=str(exc))
            return [self._link_reply(originator, req.link, req.trans_id, exc)]
        self.core.repair(RepairJob(
            req.link, req.trans_id, str(originator),
            tuple((p.source, p.after) for p in req.sources), req.since, req.batch,
            began=self._loop.time()))
        return []

    # --- snapshots (§9) -----------------------------------------------------------------

    def queue_snapshot(self, subscriber: str, link: str, topic: str,
                       message_id: str | None = None,
                       then: Callable[[bool], None] | None = None, *,
                       select: Callable[[JournalEntry], bool] | None = None) -> int:
        """The current images and deltas of `topic`'s items (or of one item) onto `link`
        (`DeliveryCore.queue_snapshot`), less what has expired and, with `select` (a
        subscription's selector, content-based §5.8), less what it does not take; how many."""
        if self.items is None:
            return 0
        state = self.items.snapshot(topic, message_id, now=self.service.now())
        if select is not None:
            state = [e for e in state if select(e)]
        return self.core.queue_snapshot(subscriber, link, state, then)

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

    async def caught_up(self) -> None:
        """`_caught_up`, for a subscribe with cached messages (the handler)."""
        await self._caught_up()

    async def _caught_up(self) -> None:
        """Until the item state holds everything the journal held now, acknowledged to its
        publishers or not (JournalUnavailable if that takes over CATCH_UP_S)."""
        if self._catch_ups is None:
            return
        try:
            await self._catch_ups.wait(CATCH_UP_S)
        except TimeoutError:
            raise JournalUnavailable(f"the journal follower did not catch up in {CATCH_UP_S:g} s;"
                                     " ask again") from None

    def _reply(self, to: Endpoint, reply: Reply) -> Data:
        return Data(self.endpoint, (to,), encode_pubsub(reply), BEEP_XML, content_ref="#Content")
