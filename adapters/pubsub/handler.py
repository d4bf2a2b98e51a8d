"""`PubsubHandler`: the apex=pubsub service on the wire — APEX data in, domain calls, data out.

What arrives (draft-schwartz-apex-pubsub §4):
- data to `apex=pubsub@D` holds a management document; the relay's `ok` says it was received
  and the service's answer is a separate data (reply or topiclist, carrying the transID) to the
  originator, exactly as the draft's message flows show. Only a document that cannot be parsed is
  refused on the data itself (500/501/553), since it has no transID to answer under.
  A `decide` (an administrator's verdict on a pending resource watch) has no transID either:
  it is answered on the data itself, `ok` or its refusal, as a publication is.
- data to `apex=pubsub/TOPIC@D` is a publication: refused on the data itself with 537 (no
  `core:data`) or 550 (no such topic), else appended to the journal and answered `ok` once Kafka
  holds it. A copy of one already journaled (the same publisher seq, robust-binding §8) is
  answered `ok` without a second record: `broker.publish_gate` decides, this maps its outcomes.
  A `pubstatus` query to `apex=pubsub@D` is answered with where the requester's publishing
  stands. A subscribe or cancel sent there by another domain's pubsub service is that service
  forwarding a request to us as its redistributor (§2.4, §4.5 step 4).

What leaves: forwarding of journaled messages (`forward`, called by the `ForwardCursor` with
each journal entry once, in offset order: our own publications as soon as Kafka acknowledged
them, from memory, everything else as the journal follower reads it back; it first advances the
data item state; with a link log, sequenced per subscriber
link by `sequenced.SequencedFanout`, which also serves gap requests, source repairs, capability
queries, snapshots and heartbeats), cancel notices on expiry and topic deletion, forwarded
requests to redistributors, and replies a redistributor sent us, passed on to whoever asked.
A data a subscriber receives names, in its InRe option, the ids of every subscription of its
that the message satisfied (content-based §5.10.1; the service's table decides, the renderer
writes it, per recipient);
and the well-known topics' messages (content-based §6, `_wkt_publisher`), journaled before the
250 of the operation that changed them.

Management runs in a worker thread (registry writes wait for Kafka) under one lock, so two
requests never interleave their check-then-write steps. A subscribe with snapshot='true' or
with `cached` (content-based §5.8) ends with one step on the event loop (`_open_with_snapshot`,
`_open_with_cache` on the plain path): the item state (the cached messages) is queued on the
link and the subscription made visible to `forward` together, between two forwards
(robust-binding §9).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import re
from collections.abc import Callable, Coroutine, Iterable, Sequence

import structlog

from adapters.apex.batch_codec import BATCH_ITEM_CONTENT
from adapters.apex.codec import BEEP_XML, Data, Option, TargetHop
from adapters.apex.endpoint import Endpoint
from adapters.apex.events_codec import EVENT_ELEMENTS, Decision
from adapters.apex.inre import in_re_option
from adapters.apex.options import hop_limit
from adapters.apex.publications_codec import PUBLICATIONS, decode_publications, durable_note
from adapters.apex.pubsub_codec import (
    SUBSCRIPTION_ID,
    Cancel,
    CreateTopic,
    DeleteTopic,
    ListTopics,
    PubsubOperation,
    Reply,
    Subscribe,
    TopicList,
    decode_pubsub,
    encode_pubsub,
)
from adapters.apex.relay import ServiceResult
from adapters.apex.robust_codec import (
    ROBUST_ELEMENTS,
    PubStatus,
    PubStatusQuery,
    decode_robust,
    encode_robust,
)
from adapters.apex.robust_stamp import PublishMeta, find_publish_meta
from adapters.apex.ticket import Ticket, TicketResult
from broker.delivery.cursor import ForwardCursor
from broker.events import APP_EVENT_OPTION, WatchTable
from broker.journal import Appended, Journal, PublisherPosition
from broker.names import DEFAULT_HOPS, REPORT_SERVICE, SERVICE
from broker.publish_gate import Outcome, PublishGate
from broker.pubsub import Forward, PubsubService
from broker.records import JournalEntry, Publication, Subscription
from broker.robust.config import RobustConfig
from broker.robust.fanout import FanoutMarks
from broker.robust.items import ItemStore
from broker.robust.linkid import default_link_id
from broker.robust.links import LinkLog
from common.errors import ApexpsError, OptionNotImplemented, ParameterSyntaxError

from ._deliveries import SendData, endpoint_of
from ._on_loop import on_loop
from ._plain_packs import PlainPacks
from ._wkt_publisher import WktPublisher
from .events import EventNotifier
from .sequenced import SequencedFanout

__all__ = ["PubsubHandler"]

#: Topics whose plain-path origin endpoint is kept (past it the cache starts over).
_ORIGINS_LIMIT = 65_536

log = structlog.get_logger(__name__)

#: How long a redistribution subscribe asks for; it is renewed at half that.
REDISTRIBUTION_DURATION_S = 24 * 3600
#: A publication without the apexps.publish option.
_PLAIN = PublishMeta()


#: The root element's name, after an optional XML declaration, comments or PIs.
_ROOT = re.compile(rb"\s*(?:<[?!][^>]*>\s*)*<([A-Za-z_][\w.:-]*)")


def _content_xml(op: PubsubOperation) -> bytes:
    return encode_pubsub(op)


def _root_tag(content: bytes) -> str | None:
    match = _ROOT.match(content[:4096])
    return None if match is None else match.group(1).decode("ascii", "replace")


class _AllOutcomes:
    """The answer to a publications document: `ticket` settles once each of its `count`
    publications has its outcome, `()` when all are durable, else with the first refusal,
    whose text then names the publications that are durable (publications_codec.durable_note)."""

    __slots__ = ("_left", "_outcomes", "ticket")

    def __init__(self, count: int) -> None:
        self.ticket = Ticket()
        self._left = count
        self._outcomes: list[TicketResult] = [()] * count
        if not count:
            self.ticket.settle(())

    def settled(self, n: int, result: TicketResult) -> None:
        self._outcomes[n] = result
        self._left -= 1
        if self._left:
            return
        failed = [r for r in self._outcomes if isinstance(r, BaseException)]
        if not failed:
            self.ticket.settle(())
            return
        first = failed[0]
        durable = [i for i, r in enumerate(self._outcomes) if not isinstance(r, BaseException)]
        if isinstance(first, ApexpsError) and durable:
            first = ApexpsError.for_code(first.code, f"{first}{durable_note(durable)}")
        self.ticket.settle(first)


class PubsubHandler:
    """Serve `service` as `apex=pubsub@domain`; `send` routes data the service initiates."""

    def __init__(self, service: PubsubService, journal: Journal,
                 send: SendData, links: LinkLog | None = None,
                 robust: RobustConfig | None = None, *, items: ItemStore | None = None,
                 marks: FanoutMarks | None = None, events: WatchTable | None = None) -> None:
        """`links`: the link log; with it, deliveries are sequenced (docs/robust-binding.md)
        and gap requests, source repairs, capability queries and heartbeats are served;
        without it, the plain topic path. `items`: the data item state `forward` advances;
        with the link log, snapshots are served from it (robust-binding §9). `events`: the
        resource watch table, with its Expires and implicit policies (event-binding.md)."""
        self.service, self.journal, self._send = service, journal, send
        self.links = links
        self.items = items
        self.endpoint = Endpoint(SERVICE, service.domain)
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._expiry_task: asyncio.Task[None] | None = None
        self._forward_ids = itertools.count(1)
        self.sequenced = None if links is None else SequencedFanout(
            service, journal, links, robust or RobustConfig(), send,
            trans_ids=self._forward_ids, items=items, marks=marks)
        #: transIDs of requests we forwarded to a redistributor -> (who asked, their transID)
        self._forwarded: dict[int, tuple[Endpoint, int]] = {}
        #: publications accepted in this event-loop turn, appended together
        self._batch: list[tuple[Publication, Ticket]] = []
        #: topic -> apex=pubsub/TOPIC@D, the plain path's origin of the topic's data
        self._origins: dict[str, Endpoint] = {}
        #: on the plain path, subscriber -> the most messages it takes in one data (the batch=
        #: of its latest subscribe); in memory only, as a link's is (broker/delivery/core.py)
        self._plain_batch: dict[str, int] = {}
        #: forwards each journal entry once, in offset order, from whichever road brings it
        #: first: Kafka's acknowledgement of our append, or the journal follower
        self.cursor = ForwardCursor(self.forward)
        #: also told what Kafka acknowledged (the journal follower's `acked`: what it need
        #: not decode when it reads those records back)
        self.on_acked: Callable[[Sequence[JournalEntry]], None] | None = None
        #: drops copies of publications already journaled (publisher seqs, §8)
        self.gate = PublishGate(journal, defer=on_loop(self._loop))
        #: journals WKT=Topics and WKT=Subscriptions as state changes (content-based §6)
        self.wkt = WktPublisher(service, self.gate, items, acked=self._forward_acked)
        #: transIDs of requests the service itself sent (redistribution) -> their reply
        self._own: dict[int, asyncio.Future[Reply]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        #: reports (statusResponse data from apex=report) about data this service forwarded
        self.reports: list[Data] = []
        #: topic@domain -> the origin's last reply to our redistribution subscribe
        self.redistributing: dict[str, Reply] = {}
        #: resource watches and their Notifies (docs/event-binding.md)
        self.events = EventNotifier(self, events)

    @property
    def lock(self) -> asyncio.Lock:
        """The management lock: one management operation at a time."""
        return self._lock

    def send(self, data: Data) -> None:
        """Send data the service initiates."""
        self._send(data)

    def spawn(self, work: Coroutine[object, object, None]) -> None:
        """Run `work` as a task of the handler's (cancelled on close)."""
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(work))

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._expiry_task = asyncio.create_task(self._expire_loop())
        self._tasks.append(asyncio.create_task(self.wkt.publish(self.wkt.reconcile())))
        self.events.start()
        if self.sequenced is not None:
            self.sequenced.start()

    async def close(self) -> None:
        await self.events.close()
        if self.sequenced is not None:
            await self.sequenced.close()
        for task in [self._expiry_task, *self._tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def redistribute(self, topic: str, origin_domain: str) -> None:
        """Redistribute `topic` of `origin_domain` here (§2.4): subscribe to it there as
        `apex=pubsub/TOPIC@our-domain`, retrying until the origin answers 250 and renewing at
        half the duration; its data then arrive as publications to our topic of that name."""
        self._tasks.append(asyncio.create_task(self._redistribution(topic, origin_domain)))

    async def _redistribution(self, topic: str, origin_domain: str) -> None:
        me = Endpoint(SERVICE, self.service.domain, topic)
        there = Endpoint(SERVICE, origin_domain.lower())
        key, delay = f"{topic}@{there.domain}", 1.0
        while True:
            trans = next(self._forward_ids)
            answer: asyncio.Future[Reply] = self._loop.create_future()
            self._own[trans] = answer
            request = Subscribe(me, topic, trans, REDISTRIBUTION_DURATION_S)
            self._send(Data(me, (there,), _content_xml(request), BEEP_XML,
                            content_ref="#Content"))
            try:
                async with asyncio.timeout(min(delay, 30.0)):
                    reply = await answer
            except TimeoutError:
                self._own.pop(trans, None)
                delay = min(delay * 2, 30.0)  # no route yet, or the origin is down: retry
                continue
            self.redistributing[key] = reply
            log.info("redistribution subscribe answered", topic=topic, origin=there.domain,
                     code=reply.code, text=reply.text)
            delay = 1.0
            await asyncio.sleep(REDISTRIBUTION_DURATION_S / 2 if reply.code == 250 else 30.0)

    # --- the relay's ServiceHandler -----------------------------------------------------

    def on_data(self, data: Data, recipient: Endpoint) -> ServiceResult:
        if recipient.subaddress is None:
            tag = _root_tag(data.content)
            if tag == "pubstatus":
                return self._pubstatus(data.originator, decode_robust(data.content))
            if tag in EVENT_ELEMENTS:
                event_doc = self.events.decode(data.content)
                if isinstance(event_doc, Decision):
                    return asyncio.ensure_future(self.events.decide(data.originator, event_doc))
                return asyncio.ensure_future(self.events.request(data.originator, event_doc))
            if tag == PUBLICATIONS:
                return self._publications(data)
            if self.sequenced is not None and tag in ROBUST_ELEMENTS:
                doc = decode_robust(data.content)
                return asyncio.ensure_future(self.sequenced.request(data.originator, doc))
            op = decode_pubsub(data.content)
            return asyncio.ensure_future(self._manage(data.originator, op))
        topic = recipient.subaddress
        origin = data.originator
        if origin.address == REPORT_SERVICE:
            # A relay's report about data we forwarded (e.g. dataHopping ran out, RFC 3342 §4).
            self.reports.append(data)
            log.info("delivery report", topic=topic, reporter=str(origin),
                     report=data.content[:300].decode("utf-8", "replace"))
            return ()
        if (origin.address == SERVICE and origin.subaddress is None
                and origin.domain != self.service.domain):
            # Another domain's pubsub service (not one of its topics, whose data are
            # publications): a request forwarded to us as redistributor (§4.5 step 4), or its
            # reply to the subscribe we sent as redistributor.
            op = decode_pubsub(data.content)
            if not isinstance(op, Subscribe | Cancel | Reply):
                raise ParameterSyntaxError("a pubsub service sends subscribe, cancel or reply")
            return asyncio.ensure_future(self._manage(origin, op))
        return self._publish(data, topic)

    def _publish(self, data: Data, topic: str) -> Ticket:
        """Checked now (537, 550); appended with whatever else arrived in this event-loop turn,
        in arrival order, as one journal batch; answered once Kafka holds it, the whole batch
        in one pass (a `Ticket` each, not an asyncio future: adapters/apex/ticket.py)."""
        hops = {"dataHopping": str(hop_limit(data.options) or DEFAULT_HOPS)}
        meta = find_publish_meta(data.options) or _PLAIN
        originator = str(data.originator)
        pub = self._accept(originator, topic, data.content, data.content_type, hops=hops,
                           meta=meta)
        return self._queue(originator, pub, meta)

    def _publications(self, data: Data) -> Ticket:
        """A `<publications>` document (adapters/apex/publications_codec.py): every
        publication checked as `_publish` checks one, all before any is queued, so that one
        refused refuses the document and nothing of it is journaled (its error names which);
        then queued in order, like as many data, and answered once all have their outcome."""
        hops = {"dataHopping": str(hop_limit(data.options) or DEFAULT_HOPS)}
        originator = str(data.originator)
        items = decode_publications(data.content)
        accepted = []
        for n, item in enumerate(items):
            if item.in_re is not None:
                raise ParameterSyntaxError(f"publication {n}: inre is the service's to say")
            meta = item.meta or _PLAIN
            try:
                pub = self._accept(originator, item.topic, item.content, item.content_type,
                                   hops=hops, meta=meta)
            except ApexpsError as exc:
                raise ApexpsError.for_code(exc.code, f"publication {n}: {exc}") from None
            accepted.append((pub, meta))
        answer = _AllOutcomes(len(accepted))
        for n, (pub, meta) in enumerate(accepted):
            self._queue(originator, pub, meta).then(functools.partial(answer.settled, n))
        return answer.ticket

    def _accept(self, originator: str, topic: str, content: bytes, content_type: str, *,
                hops: dict[str, str], meta: PublishMeta) -> Publication:
        if meta.event is not None:  # its application event (event-binding.md §2)
            hops = {**hops, APP_EVENT_OPTION: str(meta.event)}
        return self.service.accept(originator, topic, content, content_type, hops,
                                   publish_type=meta.publish_type, message_id=meta.message_id,
                                   permission_token=meta.token,
                                   publisher_seq=meta.publisher_seq)

    def _queue(self, originator: str, pub: Publication, meta: PublishMeta) -> Ticket:
        self.events.published(originator, pub, implicit=meta.implicit)
        done = Ticket()
        if not self._batch:
            self._loop.call_soon(self._append_batch)
        self._batch.append((pub, done))
        return done

    def _append_batch(self) -> None:
        batch, self._batch = self._batch, []
        self.gate.append_many([pub for pub, _ in batch], functools.partial(self._appended, batch))

    def _appended(self, batch: list[tuple[Publication, Ticket]],
                  results: list[Outcome]) -> None:
        """Forward what Kafka acknowledged, from memory (broker/delivery/cursor.py): no fetch
        of the journal between Kafka's acknowledgement and the subscribers; then answer the
        publishers. A copy answered without a record of its own forwards nothing.

        Subscribers first: the server writes each session once a turn, in the order the turn
        reached them, and the publisher's `ok` written first woke the publisher, which took a
        core from the broker before the subscriber's write. W2 at 1,000 msgs/s, three
        alternated pairs (ops/bench/bench_peers): plain p50 1.21-1.22 ms answering first,
        0.82-0.95 forwarding first. Whatever forwarding raises, every publisher is answered."""
        try:
            self._forward_acked([pub for pub, _ in batch], results)
        finally:
            for (_, done), result in zip(batch, results, strict=True):
                # Appended and AlreadyDurable are both `ok` (durable); an error is the data's.
                done.settle(result if isinstance(result, Exception) else ())

    def _forward_acked(self, pubs: Sequence[Publication], results: list[Outcome]) -> None:
        acked = [JournalEntry.of_publication(pub, r.source_seq, r.appended_at, r.position)
                 for pub, r in zip(pubs, results, strict=True) if type(r) is Appended]
        if acked:
            if self.on_acked is not None:
                self.on_acked(acked)
            self.cursor.acked(acked)

    def _pubstatus(self, originator: Endpoint, doc: object) -> asyncio.Future[Iterable[Data]]:
        """§8: the requester's position, once what it has in flight has settled."""
        if not isinstance(doc, PubStatusQuery):
            raise ParameterSyntaxError("<pubstatus> with a position is an answer, not a query")
        answered: asyncio.Future[Iterable[Data]] = self._loop.create_future()

        def answer(pos: PublisherPosition) -> None:
            status = PubStatus(str(originator), pos.publisher_seq, pos.source_seq, doc.trans_id)
            if not answered.done():
                answered.set_result([Data(self.endpoint, (originator,), encode_robust(status),
                                          BEEP_XML, content_ref="#Content")])

        self.gate.position(str(originator), answer)
        return answered

    async def _manage(self, originator: Endpoint, op: PubsubOperation) -> list[Data]:
        if isinstance(op, Reply):
            return self._pass_on(originator, op)
        async with self._lock:
            wkt: list[Publication] = []
            try:
                if isinstance(op, Subscribe) and op.cached and self.sequenced is not None:
                    # the cache holds what the journal held now, acknowledged or not
                    await self.sequenced.caught_up()
                answer = await asyncio.to_thread(self._apply, originator, op, wkt)
            except ApexpsError as exc:
                trans = getattr(op, "trans_id", None)
                log.info("pubsub refused", operation=type(op).__name__.lower(),
                         originator=str(originator), code=int(exc.code), reason=str(exc))
                answer = [self._data(originator, Reply(int(exc.code), trans, str(exc)))]
            await self.wkt.publish(wkt)  # before the 250: the lists show what it says
        self._wake.set()  # a subscription may now expire sooner than the timer thinks
        return answer

    def _apply(self, originator: Endpoint, op: PubsubOperation,
               wkt: list[Publication]) -> list[Data]:
        """One management operation, in a worker thread; returns the data to send and adds
        to `wkt` the well-known topics' messages about what changed."""
        who, svc = str(originator), self.service
        if isinstance(op, CreateTopic):
            wkt.append(self.wkt.topic_created(svc.create_topic(
                who, op.topic, description=op.description, message_schema=op.message_schema,
                selector_schemas=op.selector_schemas)))
            return [self._data(originator, Reply(250, op.trans_id))]
        if isinstance(op, DeleteTopic):
            ended = svc.delete_topic(who, op.topic)
            wkt.append(self.wkt.topic_deleted(op.topic))
            wkt.extend(self.wkt.ended(ended, "topic deleted"))
            if self.items is not None:  # on the loop, in order with forward
                self._loop.call_soon_threadsafe(self.items.forget_topic, op.topic)
            self._loop.call_soon_threadsafe(self.events.topic_deleted, op.topic)
            return [self._data(originator, Reply(250, op.trans_id)), *self._notices(ended)]
        if isinstance(op, ListTopics):
            names = svc.list_topics(who)
            return [self._data(originator, TopicList(tuple(names), op.trans_id))]
        if isinstance(op, Subscribe):
            whom = str(op.subscriber)
            link = op.link or default_link_id(whom)
            if op.snapshot and (self.sequenced is None or self.items is None):
                raise OptionNotImplemented("snapshot='true' needs sequenced delivery and item"
                                           " state")
            cached = op.cached and self.items is not None
            first = op.snapshot or cached
            claim = None
            if self.links is not None and self.sequenced is not None:
                self.links.check_owner(link, whom)  # 537 before anything is recorded
                claim = functools.partial(self.sequenced.claim, link, whom)
            result = svc.subscribe(who, whom, op.topic, op.duration, op.trans_id,
                                   link=op.link, claim=claim, activate=not first,
                                   selector_class=op.selector_class, selector=op.selector)
            if isinstance(result, Forward):
                return [self._forward(originator, op, result)]
            wkt.append(self.wkt.subscribed(result))
            if self.sequenced is not None:
                # before the 250: what follows it on the link already comes as asked
                self._loop.call_soon_threadsafe(self.sequenced.batch_live, link, op.batch)
            elif op.batch:  # the plain path packs the endpoint's live data from now on
                self._plain_batch[whom] = op.batch
            else:
                self._plain_batch.pop(whom, None)
            if first:
                self._on_loop(self._open_with_snapshot if self.sequenced is not None
                              else self._open_with_cache, result, link)
            return [self._data(originator, Reply(250, op.trans_id,
                                                 subscription_id=result.subscription_id))]
        if isinstance(op, Cancel):
            subject = op.subscriber or originator
            gone = svc.cancel(who, str(subject), op.topic, op.subscription_id)
            if isinstance(gone, Forward):
                return [self._forward(originator, op, gone)]
            wkt.extend(self.wkt.ended(gone, "cancelled"))
            self._loop.call_soon_threadsafe(self.events.routes_ended, gone)
            return [self._data(originator, Reply(250, op.trans_id))]
        if isinstance(op, Reply):
            return self._pass_on(originator, op)
        raise ParameterSyntaxError(f"<{type(op).__name__.lower()}> is an answer, not a request")

    def _forward(self, originator: Endpoint, op: Subscribe | Cancel, via: Forward) -> Data:
        """§4.5 step 4: send the request to the redistributor under a transID of ours, and
        remember whom its reply is for."""
        ours = next(self._forward_ids)
        self._forwarded[ours] = (originator, op.trans_id)
        moved = (Subscribe(op.subscriber, op.topic, ours, op.duration, snapshot=op.snapshot,
                           cached=op.cached, selector_class=op.selector_class,
                           selector=op.selector)
                 if isinstance(op, Subscribe)
                 else Cancel(op.topic, ours, op.subscriber or originator, op.subscription_id))
        log.info("pubsub request forwarded", to=via.to, topic=op.topic, originator=str(originator))
        return Data(self.endpoint, (Endpoint.parse(via.to),), _content_xml(moved), BEEP_XML,
                    content_ref="#Content")

    def _on_loop(self, step: Callable[[Subscription, str], None], sub: Subscription,
                 link: str) -> None:
        """From a worker thread: run `step` on the event loop, as one step, and wait for it."""
        async def run() -> None:
            step(sub, link)

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=60)

    def _open_with_snapshot(self, sub: Subscription, link: str) -> None:
        """One event-loop step: the topic's item state onto the link, then the subscription
        visible to `forward`. The item store advances in `forward`, so the state holds exactly
        what was forwarded before this step, and everything forwarded after it reaches the
        subscription live: no gap, no duplicate (robust-binding §9). The cached messages of
        a subscribe with `cached` (content-based §5.8) are this same state, unexpired."""
        assert self.sequenced is not None
        count = self.sequenced.queue_snapshot(sub.subscriber, link, sub.topic,
                                              select=self.service.selection(sub))
        self.service.activate(sub)
        log.info("subscribed with snapshot", topic=sub.topic, subscriber=sub.subscriber,
                 link=link, items=count)

    def _open_with_cache(self, sub: Subscription, link: str) -> None:
        """`_open_with_snapshot` on the plain path: the cached messages as plain data, then
        the subscription visible to `forward`, in one event-loop step."""
        assert self.items is not None
        select = self.service.selection(sub)
        cached = [e for e in self.items.snapshot(sub.topic, now=self.service.now())
                  if self.service.entitled(e, sub.subscriber)
                  and (select is None or select(e))]
        for entry in cached:
            self._send(self._plain(entry, (Endpoint.parse(sub.subscriber),),
                                   ((sub.subscription_id,),) if select else ()))
        self.service.activate(sub)
        log.info("subscribed with cached messages", topic=sub.topic, subscriber=sub.subscriber,
                 messages=len(cached))

    def _pass_on(self, origin: Endpoint, reply: Reply) -> list[Data]:
        mine = self._own.pop(reply.trans_id, None) if reply.trans_id else None
        if mine is not None:
            if not mine.done():
                mine.set_result(reply)
            return []
        asked = self._forwarded.pop(reply.trans_id, None) if reply.trans_id else None
        if asked is None:
            log.info("unsolicited pubsub reply dropped", originator=str(origin), code=reply.code)
            return []
        who, trans = asked
        return [self._data(who, Reply(reply.code, trans, reply.text, reply.subscription_id))]

    def _data(self, to: Endpoint, op: PubsubOperation) -> Data:
        return Data(self.endpoint, (to,), _content_xml(op), BEEP_XML, content_ref="#Content")

    def _notices(self, ended: list[Subscription]) -> list[Data]:
        """The cancel the service initiates (§4.6) for each subscription that ended, naming
        its id (draft-content §5.8.2)."""
        out = []
        for sub in ended:
            to = Endpoint.parse(sub.originator or sub.subscriber)
            sub_id = sub.subscription_id if SUBSCRIPTION_ID.fullmatch(sub.subscription_id) \
                else None
            out.append(self._data(to, Cancel(sub.topic, sub.trans_id or 1,
                                             Endpoint.parse(sub.subscriber), sub_id)))
        return out

    # --- what the service initiates -----------------------------------------------------

    def forward(self, entries: list[JournalEntry]) -> None:
        """Forward journaled messages to their topics' subscribers (on the event loop)."""
        if self.items is not None:
            # Before the items move: the Notifies read each change off the state before it
            # (event-binding.md §4). Only what the items have not applied: the rest was
            # observed, and its Notifies journaled, before a restart (the follower may start
            # before where the items' recovery ended), and would be sent twice.
            self.events.observe(self.items.unapplied(entries))
            # First, in the same step: a snapshot between two forwards holds exactly what was
            # forwarded (robust-binding §9).
            self.items.apply(entries)
        if self.sequenced is not None:
            self.sequenced.forward(entries)
            return
        # One pass over the batch: the table's lock taken once for all of it, each
        # subscriber's endpoint parsed once (endpoint_of), each topic's origin built once.
        # A subscriber that said batch= takes the turn's messages packed (_plain_packs.py),
        # but one too large for a pack, which goes alone after what was packed before it.
        entitled = self.service.entitled
        packed = self._plain_batch
        packs = PlainPacks(self.endpoint, self._send, self._forward_ids, packed.__getitem__,
                           self._plain_alone)
        for entry, recipients in zip(entries, self.service.recipients_for_many(entries),
                                     strict=True):
            chosen = [(r, ids) for r, ids in recipients
                      if entitled(entry, r, live=True)]  # tokens, expiry
            if packed and chosen:
                alone = len(entry.content) > BATCH_ITEM_CONTENT
                for r, ids in chosen:
                    if r in packed:
                        if alone:
                            packs.flush(r)
                        else:
                            packs.add(r, entry, ids)
                if not alone:
                    chosen = [(r, ids) for r, ids in chosen if r not in packed]
            if chosen:
                self._send(self._plain(entry, tuple(endpoint_of(r) for r, _ in chosen),
                                       tuple(ids for _, ids in chosen)))
        packs.close()

    def _plain_alone(self, subscriber: str, entry: JournalEntry,
                     in_re: tuple[str, ...] | None) -> None:
        self._send(self._plain(entry, (endpoint_of(subscriber),), (in_re,)))

    def _plain(self, entry: JournalEntry, to: tuple[Endpoint, ...],
               in_re: tuple[tuple[str, ...] | None, ...] = ()) -> Data:
        """A journaled message as plain data from its topic's endpoint (no link stamp), with
        each recipient's InRe (draft-content §5.10.1.1) where `in_re` names ids."""
        hops = int(entry.options.get("dataHopping", DEFAULT_HOPS))
        option = Option("dataHopping", next(self._forward_ids), target_hop=TargetHop.ALL,
                        must_understand=True,
                        content=f"<dataHopping noMoreThan='{hops}' reportErrors='true' />")
        origin = self._origins.get(entry.topic)
        if origin is None:  # built once per topic: an Endpoint checks its parts
            if len(self._origins) >= _ORIGINS_LIMIT:
                self._origins.clear()
            origin = self._origins[entry.topic] = Endpoint(SERVICE, self.service.domain,
                                                           entry.topic)
        per = tuple(() if ids is None else (in_re_option(ids),) for ids in in_re)
        return Data(origin, to, entry.content, entry.content_type, options=(option,),
                    recipient_options=per if any(per) else (),
                    content_ref="#Content" if entry.content_type == BEEP_XML else None)

    def forward_threadsafe(self, entries: list[JournalEntry], reached: dict[int, int]) -> None:
        """The journal follower's batch (any thread): to the cursor, on the event loop."""
        self._loop.call_soon_threadsafe(self.cursor.followed, entries, reached)

    async def _expire_loop(self) -> None:
        while True:
            due = self.service.next_expiry()
            self._wake.clear()
            delay = None if due is None else max(0.0, (due - self.service.now()) / 1000)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
                continue
            async with self._lock:
                ended = await asyncio.to_thread(self.service.expire_due)
                await self.wkt.publish(self.wkt.ended(ended, "expired"))
            for notice in self._notices(ended):
                self._send(notice)

