"""`PubsubClient`: an application's handle on `apex=pubsub@domain` (the client library).

It attaches as one endpoint and then: manages topics, subscribes and cancels (each call returns
when the service's reply with the same transID arrives, and raises the `ApexpsError` of any code
other than 250), publishes (returns once the broker holds the message durably), and yields what
the service sends unprompted — forwarded messages and the cancel that ends a subscription — from
`events()`.

Robust delivery (docs/robust-binding.md): each `Delivered` carries its sequence stamp when the
broker sequences deliveries; heartbeats and resets are yielded as `LinkEvent` when asked for
(`link_events=True`); `gap` asks for a link range again and `capabilities` what the service
offers. A subscriber stub takes one link over with `listen_link`: everything of that link --
stamped deliveries, heartbeats, resets, and each `linkreply` no request of this client awaits --
goes to its listener instead of `events()`, and it sends its requests with `post` under transIDs
from `new_trans_id`, so they never collide with this client's own (see robust_client.py).
`pubstatus` asks where our publishing stands (§8); `adapters.client.publisher` builds
duplicate-free, resending publishing on it.
`subscribe(..., snapshot=True)` first gets the current state of the topic's data items
and `snapshot` gets it once, without subscribing (§9): those items' stamps say `snapshot`.

With `connect(..., reconnect=ReconnectPolicy(...))` it rides a `ReconnectingApexClient`: a lost
connection is re-dialled and the endpoint re-attached, and `events()` goes on across it. A
subscription lives in the broker, not in the connection, so a subscriber that comes back keeps
receiving without subscribing again (what was forwarded while it was away is not replayed by
this service; gap repair comes with robust delivery). A request whose reply was still due when
the connection went raises `ServiceNotAvailable`: the reply, if any, went to the old session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Iterable
from enum import Enum
from typing import Any

import structlog

from adapters.apex.batch_codec import DEFAULT_BATCH, ItemFields, batch_items
from adapters.apex.codec import BEEP_XML, Data
from adapters.apex.endpoint import Endpoint
from adapters.apex.events_codec import (
    Decision,
    WatchReply,
    WatchRequest,
    decode_events,
    encode_events,
)
from adapters.apex.inre import find_in_re
from adapters.apex.publications_codec import (
    Publication,
    decode_publications,
    durable_items,
    encode_publications,
)
from adapters.apex.pubsub_codec import (
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
from adapters.apex.robust_codec import (
    MAX_TRANS_ID,
    ROBUST_ELEMENTS,
    Capabilities,
    CapabilityQuery,
    GapRequest,
    LinkReply,
    PubStatus,
    PubStatusQuery,
    RepairRequest,
    RobustDocument,
    SnapshotRequest,
    SourcePosition,
    decode_robust,
    encode_robust,
)
from adapters.apex.robust_stamp import PublishMeta, Stamp, find_stamp, publish_option
from broker.events import Resource
from broker.names import SERVICE
from broker.records import PublishType
from common.errors import ApexpsError, ServiceNotAvailable

from ._received import Delivered, Ended, Inbox, LinkEvent, LinkListener, LinkTraffic
from .client import DEFAULT_TIMEOUT, ApexClient
from .reconnect import ConnectionEvent, Disconnected, ReconnectingApexClient, ReconnectPolicy

__all__ = ["Delivered", "Ended", "LinkEvent", "LinkListener", "LinkTraffic", "PubsubClient"]

log = structlog.get_logger(__name__)

_PLAIN = PublishMeta()
#: Topics whose address and originator text one client keeps (more start the caches over).
_ORIGINS_LIMIT = _TOPICS_LIMIT = 1024
#: What one `<publications>` document carries at most: publications, and octets of content
#: (a quarter of the broker's MAX_PUBLICATIONS_XML, with room for base64's third more).
PUBLICATIONS_BATCH = 1024
PUBLICATIONS_BYTES = 256 * 1024
#: Content larger than this goes in a data of its own.
PUBLICATION_ALONE = 64 * 1024

#: A publication waiting for the end of the turn: topic, content, type, meta, its answer.
_Unsent = tuple[str, bytes, str, PublishMeta | None, "asyncio.Future[None]"]


def _answer_run(run: list[_Unsent], sent: asyncio.Future[None]) -> None:
    """Answer each publication of a run from its data's reply: a refusal names the ones that
    are durable nonetheless (publications_codec.durable_note)."""
    exc: BaseException | None
    if sent.cancelled():
        exc = ServiceNotAvailable("the publication was cancelled")
    else:
        exc = sent.exception()
    durable = durable_items(str(exc), len(run)) if isinstance(exc, ApexpsError) else set()
    for n, (*_, done) in enumerate(run):
        if done.done():
            continue  # its caller gave up on it
        if exc is None or n in durable:
            done.set_result(None)
        else:
            done.set_exception(exc)


class _Own(Enum):
    """`subscribe`'s default batch: DEFAULT_BATCH for ourselves, none for another."""

    OWN = "own"


OWN = _Own.OWN


_Answer = Reply | TopicList | LinkReply | Capabilities | PubStatus | WatchReply
_PUBSUB_OPS = (Cancel, CreateTopic, DeleteTopic, ListTopics, Reply, Subscribe, TopicList)


class PubsubClient:
    def __init__(self, client: ApexClient | ReconnectingApexClient, endpoint: Endpoint,
                 service_domain: str | None = None, *, link_events: bool = False,
                 batch_publish: bool = True) -> None:
        """`service_domain`: whose apex=pubsub to use (default: our own domain's; another
        domain's is reached through our relay's relay-relay links). `link_events`: also
        yield heartbeats and resets from `events()`. `batch_publish`: a turn's publications
        in one data (`publish`; False: a data each, for a service that does not read
        `<publications>`)."""
        self.client, self.endpoint = client, endpoint
        self.batch_publish = batch_publish
        self._unsent: list[_Unsent] = []
        self.link_events = link_events
        self.service = Endpoint(SERVICE, service_domain or endpoint.domain)
        self._trans_ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[_Answer]] = {}
        self._events = Inbox()
        #: where each `Delivered` no link listener takes goes: `events()`, or `deliver_to`'s
        self._deliver: Callable[[Delivered], None] = self._events.put_nowait
        self._links: dict[str, LinkListener] = {}
        #: each topic's publication address, `apex=pubsub/TOPIC@D`
        self._topics: dict[str, Endpoint] = {}
        #: each topic's originator text, for the deliveries a batch holds
        self._origins: dict[tuple[str, str], str] = {}
        self._closed = False
        # Each data is routed in the connection's read loop as it is decoded, not by a task of
        # ours woken per data.
        client.deliver_to(self._received)
        if isinstance(client, ReconnectingApexClient):
            client.add_listener(self._connection_event)

    @classmethod
    async def connect(cls, host: str, port: int, endpoint: Endpoint | str, *,
                      timeout: float = DEFAULT_TIMEOUT,
                      service_domain: str | None = None, link_events: bool = False,
                      reconnect: ReconnectPolicy | None = None, batch_publish: bool = True,
                      **security: Any) -> PubsubClient:
        """`security`: ApexClient.connect's tls, sasl, mechanism and server_hostname (and its
        max_in_flight, the requests on the wire at once: 288 by default).
        `reconnect`: survive lost connections by this policy (see the module docstring); the
        `ReconnectingApexClient` is `.client`, for its `add_listener`."""
        me = Endpoint.parse(endpoint) if isinstance(endpoint, str) else endpoint
        client: ApexClient | ReconnectingApexClient
        if reconnect is None:
            client = await ApexClient.connect(host, port, timeout, **security)
        else:
            client = await ReconnectingApexClient.connect(host, port, timeout,
                                                          policy=reconnect, **security)
        try:
            await client.attach(me)
        except BaseException:
            await client.close()
            raise
        return cls(client, me, service_domain, link_events=link_events,
                   batch_publish=batch_publish)

    async def close(self) -> None:
        self._closed = True  # what the connection hands on from here is nobody's
        await self.client.close()

    async def __aenter__(self) -> PubsubClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # --- requests -----------------------------------------------------------------------

    async def _ask(self, op: PubsubOperation | RobustDocument | WatchRequest,
                   trans_id: int) -> _Answer:
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._waiting[trans_id] = future
        content = (encode_pubsub(op) if isinstance(op, _PUBSUB_OPS) else
                   encode_events(op) if isinstance(op, WatchRequest) else
                   encode_robust(op))
        try:
            await self.client.send(self.endpoint, [self.service], content,
                                   BEEP_XML)
            async with asyncio.timeout(self.client.timeout):
                answer = await future
        finally:
            self._waiting.pop(trans_id, None)
        if isinstance(answer, Reply) and answer.code != 250:
            raise ApexpsError.for_code(answer.code, answer.text or None)
        if isinstance(answer, LinkReply | WatchReply) and (exc := answer.exception()) is not None:
            raise exc
        return answer

    async def watch(self, resource: Resource | str, events: Iterable[int], expires: int, *,
                    watch_id: str = "1", link: str | None = None,
                    update: str | None = None) -> WatchReply:
        """Watch a resource (TOPIC/MESSAGE-ID) for `events` (docs/event-binding.md): the
        answer names the granted Expires; the Notifies arrive from `events()` as deliveries
        on WKT=Notify (decode them with `events_codec.decode_events`). `expires` 0 cancels,
        0xffffffff asks for a permanent watch; `update` 'add' or 'remove' changes the events
        of an existing one. A refusal raises its `ApexpsError` (550, 571, 572 with
        `min_expires`, 537, 568)."""
        trans = self.new_trans_id()
        res = Resource.parse(resource) if isinstance(resource, str) else resource
        answer = await self._ask(WatchRequest(res, watch_id, expires, frozenset(events), trans,
                                              None, link, update), trans)
        assert isinstance(answer, WatchReply)
        return answer

    async def decide(self, resource: Resource | str, subscriber: Endpoint | str, watch_id: str,
                     *, approve: bool) -> None:
        """Approve or reject a watch the service holds pending for an administrator
        (docs/event-binding.md §5.1; needs pubsub:deletetopic on the topic). The decision is
        answered on its data: this returns once the service took it, and a refusal raises
        its `ApexpsError` (537 not allowed, 550 no such pending watch, 553 bad input)."""
        res = Resource.parse(resource) if isinstance(resource, str) else resource
        await self.client.send(self.endpoint, [self.service], encode_events(
            Decision(res, self._endpoint(subscriber), watch_id, approve)), BEEP_XML)

    async def create_topic(self, topic: str, *, description: str | None = None,
                           message_schema: str | None = None,
                           selector_schemas: tuple[str, ...] = ()) -> None:
        """createtopic; the schemas are the `<message-schema>` and `<selector-schema>`
        elements' XML (`pubsub_codec.schema_elements` makes them from files). Raises the
        refusal: 553 for a schema refused, 566 for a selector class the broker lacks."""
        trans = self.new_trans_id()
        await self._ask(CreateTopic(topic, trans, description, (), message_schema,
                                    selector_schemas), trans)

    async def delete_topic(self, topic: str) -> None:
        trans = self.new_trans_id()
        await self._ask(DeleteTopic(topic, trans), trans)

    async def list_topics(self) -> list[str]:
        trans = self.new_trans_id()
        answer = await self._ask(ListTopics(trans), trans)
        return list(answer.names) if isinstance(answer, TopicList) else []

    async def subscribe(self, topic: str, duration: int = 3600,
                        subscriber: Endpoint | str | None = None,
                        link: str | None = None, *, snapshot: bool = False,
                        batch: int | _Own | None = OWN, cached: bool = False,
                        selector: str | None = None,
                        selector_class: str = "JMS") -> str | None:
        """`link`: the link the subscription's data travel on (default: the subscriber).
        `cached`: the topic's cached messages first (content-based §5.8: per message-id its
        latest unexpired revision; stamp.snapshot on a link), then live data.
        `snapshot`: the link first carries the current images and deltas of the topic's data
        items (stamp.snapshot), then live data (robust-binding §9). `batch`: the link's live
        data may come packed, up to this many per data (§5.4; None: one data each); they
        arrive one by one either way. By default our own subscriptions ask for
        DEFAULT_BATCH, and one on another's behalf for none: its client may not unpack.
        `selector`: only messages it matches (draft-content §5.6; `selector_class` JMS or
        RFC-2254); 566 / 567 raise UnsupportedSelectorClass / SelectorError.
        Returns the subscription id the service gave (None from a service without ids);
        subscribing again with the same selector and link renews that subscription."""
        trans = self.new_trans_id()
        who = self._endpoint(subscriber)
        if isinstance(batch, _Own):
            batch = DEFAULT_BATCH if who == self.endpoint else None
        answer = await self._ask(Subscribe(
            who, topic, trans, duration, link, snapshot, batch, cached,
            selector_class=None if selector is None else selector_class, selector=selector),
            trans)
        return answer.subscription_id if isinstance(answer, Reply) else None

    async def snapshot(self, topic: str, message_id: str | None = None,
                       link: str | None = None) -> None:
        """The current images and deltas of `topic`'s data items (or of one item) once, on
        `link` (default: our endpoint), without subscribing (robust-binding §9). They arrive
        from `events()` (stamp.snapshot) before this returns; a refusal raises its
        `ApexpsError` (550 unknown topic, 537, …)."""
        trans = self.new_trans_id()
        await self._ask(SnapshotRequest(topic, trans, message_id, link), trans)

    async def gap(self, link: str, link_from: int, link_to: int | None = None,
                  epoch: int | None = None, *, batch: int | None = DEFAULT_BATCH) -> LinkReply:
        """Ask for link seqs `link_from..link_to` again (§5.1). The refilled items arrive
        from `events()` (stamp.refill) before this returns the 250 `linkreply`; any other code
        raises its `ApexpsError` (553, 537, 569, 570). `batch`: how many items the broker may
        pack into one data (§5.4; None: one data each); they arrive one by one either way."""
        trans = self.new_trans_id()
        answer = await self._ask(GapRequest(link, link_from, trans, link_to, epoch, batch),
                                 trans)
        assert isinstance(answer, LinkReply)
        return answer

    async def repair(self, link: str, sources: Iterable[tuple[str, int]] = (),
                     since: int | None = None, epoch: int | None = None, *,
                     batch: int | None = DEFAULT_BATCH) -> LinkReply:
        """Repair `link` by source (§5.2): per (source, last source seq we have), everything
        after it; for other sources, what the journal accepted at or after `since` (ms). The
        reset that starts the new epoch and the catch-up arrive from `events()` before this
        returns the 250 `linkreply`; any other code raises its `ApexpsError` (537, 553, 570).
        `batch` as for `gap`."""
        trans = self.new_trans_id()
        positions = tuple(SourcePosition(source, after) for source, after in sources)
        answer = await self._ask(RepairRequest(link, trans, positions, since, epoch, batch),
                                 trans)
        assert isinstance(answer, LinkReply)
        return answer

    async def capabilities(self) -> Capabilities:
        trans = self.new_trans_id()
        answer = await self._ask(CapabilityQuery(trans), trans)
        assert isinstance(answer, Capabilities)
        return answer

    def new_trans_id(self) -> int:
        """The next transID of this client's requests (1..2^31-1, RFC 3340): a stub that
        sends requests on this session takes its transIDs here."""
        return (next(self._trans_ids) - 1) % MAX_TRANS_ID + 1

    async def post(self, doc: RobustDocument) -> None:
        """Send a gap or repair request (or any robust document) to the service without
        waiting for its answer; the `linkreply` goes to the link's listener (`listen_link`).
        Raises what `send` raises: the service refusing the data itself (an unparseable
        request), or `ServiceNotAvailable` while the connection is down."""
        await self.client.send(self.endpoint, [self.service], encode_robust(doc),
                               BEEP_XML)

    def listen_link(self, link: str, listener: LinkListener) -> None:
        """From now on hand everything of `link` to `listener` (in the event loop, in arrival
        order; it must not block) instead of `events()`: its stamped deliveries, heartbeats and
        resets (whatever `link_events` says), and each `linkreply` naming it that no request of
        this client awaits. One listener per link; a second one replaces the first."""
        self._links[link] = listener

    def link_listener(self, link: str) -> LinkListener | None:
        """Who `listen_link` hands `link`'s traffic to now (None: `events()`), so that a
        listener can be put in front of another (the web gateway's gap fills do)."""
        return self._links.get(link)

    def unlisten_link(self, link: str) -> None:
        """Stop `listen_link`; the link's traffic goes to `events()` again."""
        self._links.pop(link, None)

    async def pubstatus(self) -> PubStatus:
        """Where our publishing stands (§8): the highest publisher seq the broker holds durably
        from us and our newest source seq (0: none). The broker answers once what we had in
        flight has settled, so a publisher that continues at `pubseq + 1` sends only news."""
        trans = self.new_trans_id()
        answer = await self._ask(PubStatusQuery(trans), trans)
        assert isinstance(answer, PubStatus)
        return answer

    async def cancel(self, topic: str | None = None, subscriber: Endpoint | str | None = None,
                     *, subscription_id: str | None = None) -> None:
        """Cancel the subscription `subscription_id`; without one, every subscription to
        `topic`; with neither, all of them (draft-content §5.8.2). 568 (UnknownSubscription)
        when nothing matches."""
        trans = self.new_trans_id()
        await self._ask(Cancel(topic, trans, self._endpoint(subscriber), subscription_id),
                        trans)

    async def publish(self, topic: str, content: bytes,
                      content_type: str = "application/octet-stream", *,
                      publish_type: PublishType | str = PublishType.UPDATE,
                      message_id: str | None = None, token: str | None = None,
                      publisher_seq: int | None = None, event: int | None = None,
                      implicit: bool = True) -> None:
        """Send to `apex=pubsub/TOPIC@domain`; returns once the broker holds it durably.
        `event`: the application event code this change means (event-binding.md §2);
        `implicit=False`: publishing gives no implicit watch of the resource.
        `publish_type`, `message_id` (the data item, with the topic), `token` (a permission
        token) and `publisher_seq` travel in the `apexps.publish` option (robust-binding §2.3);
        a plain update without the rest sends no option.

        With `batch_publish` (the default), what is published in one event-loop turn goes in
        one data, a `<publications>` document (robust-binding.md §2.6), in call order, each
        call answered by its own publication's outcome; one alone goes as a data of its own,
        a turn later. A publication with a `publisher_seq` always
        goes at once, alone: `ReliablePublisher` writes each in the step that checked the
        connection (publisher.py)."""
        if publish_type == PublishType.UPDATE and message_id is None and token is None \
                and publisher_seq is None and event is None and implicit:
            meta = None  # a plain update: what PublishMeta() says
        else:
            meta = PublishMeta(PublishType(publish_type), message_id, token, publisher_seq,
                               event, implicit)
            if meta == _PLAIN:
                meta = None
        if not self.batch_publish or publisher_seq is not None:
            await self._publish_now(topic, content, content_type, meta)
            return
        loop = asyncio.get_running_loop()
        if self._unsent:  # the turn's first publication is gathering the turn's: join it
            done: asyncio.Future[None] = loop.create_future()
            self._unsent.append((topic, content, content_type, meta, done))
            await done
            return
        # The first: let the turn's other publications join, then send them all.
        lead: _Unsent = (topic, content, content_type, meta, loop.create_future())
        self._unsent.append(lead)
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            self._send_runs(self._take_unsent()[1:])  # nothing of ours was written yet
            raise
        unsent = self._take_unsent()
        if len(unsent) == 1:  # alone: a data of its own, written in this step
            await self._publish_now(topic, content, content_type, meta)
            return
        self._send_runs(unsent)
        await lead[4]

    def _take_unsent(self) -> list[_Unsent]:
        unsent, self._unsent = self._unsent, []
        return unsent

    async def _publish_now(self, topic: str, content: bytes, content_type: str,
                           meta: PublishMeta | None) -> None:
        to = self._topics.get(topic)
        if to is None:
            to = Endpoint(SERVICE, self.service.domain, topic)
            if len(self._topics) >= _TOPICS_LIMIT:
                self._topics.clear()
            self._topics[topic] = to
        options = () if meta is None else (publish_option(meta),)
        await self.client.send(self.endpoint, [to], content, content_type, options=options)

    def _send_runs(self, unsent: list[_Unsent]) -> None:
        """A turn's publications, in order: runs of them in `<publications>` documents of
        at most PUBLICATIONS_BATCH and about PUBLICATIONS_BYTES; one over PUBLICATION_ALONE
        (or one alone) in a data of its own. Each goes as a task, and tasks take their first
        step, which writes, in the order they were made (so before the next turn's first
        publication, which waits a turn)."""
        run: list[_Unsent] = []
        size = 0
        for item in unsent:
            content = item[1]
            if len(content) > PUBLICATION_ALONE:
                self._send_run(run)
                self._send_run([item])
                run, size = [], 0
                continue
            if run and (len(run) >= PUBLICATIONS_BATCH
                        or size + len(content) > PUBLICATIONS_BYTES):
                self._send_run(run)
                run, size = [], 0
            run.append(item)
            size += len(content)
        self._send_run(run)

    def _send_run(self, run: list[_Unsent]) -> None:
        if not run:
            return
        if len(run) == 1:
            topic, content, content_type, meta, _ = run[0]
            sent = asyncio.ensure_future(self._publish_now(topic, content, content_type, meta))
        else:
            doc = encode_publications(Publication(t, c, ct, m) for t, c, ct, m, _ in run)
            sent = asyncio.ensure_future(self.client.send(self.endpoint, [self.service], doc,
                                                          BEEP_XML))
        sent.add_done_callback(functools.partial(_answer_run, run))

    def _endpoint(self, who: Endpoint | str | None) -> Endpoint:
        if who is None:
            return self.endpoint
        return Endpoint.parse(who) if isinstance(who, str) else who

    # --- what arrives unprompted --------------------------------------------------------

    async def events(self) -> AsyncIterator[Delivered | Ended | LinkEvent]:
        """Forwarded messages and subscription ends, until the connection is lost."""
        inbox = self._events
        items = inbox.items
        while True:
            if not items:
                await inbox.wait()
                continue
            event = items.popleft()
            if event is None:
                items.appendleft(None)  # for every later caller too
                raise ServiceNotAvailable("connection to the broker lost")
            yield event

    def deliver_to(self, callback: Callable[[Delivered], None]) -> None:
        """From now on hand each forwarded message (that no link listener takes) to
        `callback`, in the connection's read loop as it is decoded, instead of queueing it for
        `events()`, which then yields only the rest (subscription ends, link events, the end
        of the connection). For a subscriber that handles each message at once: it saves a
        queue and a task switch per message. The callback must not block; what it raises is
        logged, and the next message still comes."""
        def guarded(delivered: Delivered) -> None:
            try:
                callback(delivered)
            except Exception:
                log.exception("delivery callback failed", topic=delivered.topic)

        self._deliver = guarded

    def _connection_event(self, event: ConnectionEvent) -> None:
        if isinstance(event, Disconnected):
            waiting, self._waiting = self._waiting, {}
            for future in waiting.values():
                if not future.done():
                    future.set_exception(ServiceNotAvailable(
                        "connection to the broker lost before its reply came"))

    def _received(self, data: Data | None) -> None:
        if self._closed:
            return
        if data is not None:
            self._route(data)
            return
        self._events.put_nowait(None)
        for link in list(self._links):
            self._to_link(link, None)

    def _to_link(self, link: str, item: LinkTraffic) -> bool:
        """Hand `item` to `link`'s listener, if it has one."""
        listener = self._links.get(link)
        if listener is None:
            return False
        try:
            listener(item)
        except Exception:  # one listener's bug must not stop the other links and events()
            log.exception("link listener failed", link=link, item=type(item).__name__)
        return True

    def _stamp(self, data: Data) -> Stamp | None:
        mine = [i for i, r in enumerate(data.recipients) if r == self.endpoint] or [0]
        try:
            return find_stamp(data.options_of(mine[0]))
        except ApexpsError:
            return None

    def _stamp_in_re(self, data: Data) -> tuple[Stamp | None, tuple[str, ...] | None]:
        """A delivery's stamp and InRe ids (ours, where several recipients share it)."""
        mine = [i for i, r in enumerate(data.recipients) if r == self.endpoint] or [0]
        options = data.options_of(mine[0])
        try:
            stamp = find_stamp(options)
        except ApexpsError:
            stamp = None
        try:
            ids = find_in_re(options)
        except ApexpsError:
            return stamp, None
        if stamp is not None and ids:
            # carried on with the stamp, as a batch item's inre is: a link's stub hands its
            # application the stamp, not the data's options
            stamp = dataclasses.replace(stamp, in_re=ids)
        return stamp, ids

    def _unpack_publications(self, data: Data) -> None:
        """A plain subscription's live data, packed (robust-binding.md §2.6): each as the data
        of its own it stands for."""
        try:
            publications = decode_publications(data.content)
        except ApexpsError as exc:
            log.warning("publications refused", originator=str(data.originator),
                        error=str(exc))
            return
        domain = data.originator.domain
        deliver = self._deliver
        for p in publications:
            deliver(Delivered(p.topic, self._origin(domain, p.topic), p.content, p.content_type,
                              None, p.in_re))

    def _robust(self, data: Data) -> bool:
        """Handle a robust delivery document (heartbeat, reset, linkreply, capabilities)."""
        head = data.content.lstrip()[:64]
        if head.startswith(b"<batch"):
            try:
                _, items = batch_items(data.content)
            except ApexpsError as exc:  # its holes get asked for again
                log.warning("batch refused", originator=str(data.originator), error=str(exc))
                return True
            self._unpack(items, data.originator.domain)
            return True
        if not any(head.startswith(b"<" + t.encode()) for t in ROBUST_ELEMENTS):
            return False
        try:
            doc = decode_robust(data.content)
        except ApexpsError:
            return True
        if isinstance(doc, LinkReply | Capabilities | PubStatus):
            future = self._waiting.get(doc.trans_id) if doc.trans_id else None
            if future is not None and not future.done():
                future.set_result(doc)
            elif isinstance(doc, LinkReply):
                self._to_link(doc.link, doc)
            return True
        stamp = self._stamp(data)
        if stamp is None:
            return True
        if not self._to_link(stamp.link, LinkEvent(stamp, doc)) and self.link_events:
            self._events.put_nowait(LinkEvent(stamp, doc))
        return True

    def _unpack(self, items: Iterable[ItemFields], domain: str) -> None:
        """Hand each item of a batch on as if it had come as a data of its own."""
        for stamp, content, content_type, document in items:
            if document is not None:
                event = LinkEvent(stamp, document)
                if not self._to_link(stamp.link, event) and self.link_events:
                    self._events.put_nowait(event)
                continue
            topic = stamp.topic or ""
            delivered = Delivered(topic, self._origin(domain, topic), content, content_type,
                                  stamp, stamp.in_re or None)
            if not self._to_link(stamp.link, delivered):
                self._deliver(delivered)

    def _origin(self, domain: str, topic: str) -> str:
        """`apex=pubsub/TOPIC@DOMAIN`, the originator a delivery of `topic` would have had."""
        key = (domain, topic)
        origin = self._origins.get(key)
        if origin is None:
            if len(self._origins) >= _ORIGINS_LIMIT:
                self._origins.clear()
            origin = self._origins[key] = str(Endpoint(SERVICE, domain, topic))
        return origin

    def _route(self, data: Data) -> None:
        origin = data.originator
        if origin.address != SERVICE:
            return
        if origin.subaddress is not None:
            stamp, in_re = self._stamp_in_re(data)
            delivered = Delivered(origin.subaddress, str(origin), data.content,
                                  data.content_type, stamp, in_re)
            if stamp is None or not self._to_link(stamp.link, delivered):
                self._deliver(delivered)
            return
        if data.content.startswith(b"<publications"):
            self._unpack_publications(data)
            return
        if self._robust(data):
            return
        if data.content.lstrip()[:11] == b"<watchreply":
            try:
                reply = decode_events(data.content)
            except ApexpsError:
                return
            if isinstance(reply, WatchReply):
                waiting = self._waiting.get(reply.trans_id)
                if waiting is not None and not waiting.done():
                    waiting.set_result(reply)
            return
        try:
            op = decode_pubsub(data.content)
        except ApexpsError:
            return
        if isinstance(op, Reply | TopicList) and op.trans_id is not None:
            future = self._waiting.get(op.trans_id)
            if future is not None and not future.done():
                future.set_result(op)
        elif isinstance(op, Cancel):
            self._events.put_nowait(Ended(op.topic, str(op.subscriber or self.endpoint),
                                          op.subscription_id))
