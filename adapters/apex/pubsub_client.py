"""`PubsubClient`: an application's handle on `apex=pubsub@domain` (the client library).

It attaches as one endpoint and then: manages topics, subscribes and cancels (each call returns
when the service's reply with the same transID arrives, and raises the `ApexpsError` of any code
other than 250), publishes (returns once the broker holds the message durably), and yields what
the service sends unprompted — forwarded messages and the cancel that ends a subscription — from
`events()`.

Robust delivery (docs/robust-binding.md): each `Delivered` carries its sequence stamp when the
broker sequences deliveries; heartbeats and resets are yielded as `LinkEvent` when asked for
(`link_events=True`); `gap` asks for a link range again and `capabilities` what the service
offers. `subscribe(..., snapshot=True)` first gets the current state of the topic's data items
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
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from broker.errors import ApexpsError, ServiceNotAvailable
from broker.records import PublishType

from ._codec import Data
from ._endpoint import Endpoint
from ._pubsub_codec import (
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
from ._robust_codec import (
    ROBUST_ELEMENTS,
    Capabilities,
    CapabilityQuery,
    GapRequest,
    LinkReply,
    PublishMeta,
    RobustDocument,
    SnapshotRequest,
    Stamp,
    decode_robust,
    encode_robust,
    find_stamp,
    publish_option,
)
from .client import DEFAULT_TIMEOUT, ApexClient
from .reconnect import ConnectionEvent, Disconnected, ReconnectingApexClient, ReconnectPolicy

__all__ = ["Delivered", "Ended", "LinkEvent", "PubsubClient"]

SERVICE = "apex=pubsub"
_PLAIN = PublishMeta()


@dataclass(frozen=True, slots=True)
class Delivered:
    """A message forwarded to us for `topic`."""

    topic: str
    originator: str
    content: bytes
    content_type: str
    #: the `apexps.seq` stamp (link, link seq, source, source seq …), if the broker sent one
    stamp: Stamp | None = None


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """A heartbeat or reset on one of our links (only with `link_events=True`)."""

    stamp: Stamp
    document: RobustDocument


_Answer = Reply | TopicList | LinkReply | Capabilities
_PUBSUB_OPS = (Cancel, CreateTopic, DeleteTopic, ListTopics, Reply, Subscribe, TopicList)


@dataclass(frozen=True, slots=True)
class Ended:
    """The service cancelled our subscription to `topic` (expiry or topic deletion)."""

    topic: str
    subscriber: str


class PubsubClient:
    def __init__(self, client: ApexClient | ReconnectingApexClient, endpoint: Endpoint,
                 service_domain: str | None = None, *, link_events: bool = False) -> None:
        """`service_domain`: whose apex=pubsub to use (default: our own domain's; another
        domain's is reached through our relay's relay-relay links). `link_events`: also
        yield heartbeats and resets from `events()`."""
        self.client, self.endpoint = client, endpoint
        self.link_events = link_events
        self.service = Endpoint(SERVICE, service_domain or endpoint.domain)
        self._trans_ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[_Answer]] = {}
        self._events: asyncio.Queue[Delivered | Ended | LinkEvent | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._demux())
        if isinstance(client, ReconnectingApexClient):
            client.add_listener(self._connection_event)

    @classmethod
    async def connect(cls, host: str, port: int, endpoint: Endpoint | str, *,
                      timeout: float = DEFAULT_TIMEOUT,
                      service_domain: str | None = None, link_events: bool = False,
                      reconnect: ReconnectPolicy | None = None,
                      **security: Any) -> PubsubClient:
        """`security`: ApexClient.connect's tls, sasl, mechanism and server_hostname.
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
        return cls(client, me, service_domain, link_events=link_events)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.client.close()

    async def __aenter__(self) -> PubsubClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # --- requests -----------------------------------------------------------------------

    async def _ask(self, op: PubsubOperation | RobustDocument, trans_id: int) -> _Answer:
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._waiting[trans_id] = future
        content = (encode_pubsub(op) if isinstance(op, _PUBSUB_OPS) else
                   encode_robust(op))
        try:
            await self.client.send(self.endpoint, [self.service], content,
                                   "application/beep+xml")
            answer = await asyncio.wait_for(future, self.client.timeout)
        finally:
            self._waiting.pop(trans_id, None)
        if isinstance(answer, Reply) and answer.code != 250:
            raise ApexpsError.for_code(answer.code, answer.text or None)
        if isinstance(answer, LinkReply) and (exc := answer.exception()) is not None:
            raise exc
        return answer

    async def create_topic(self, topic: str) -> None:
        trans = next(self._trans_ids)
        await self._ask(CreateTopic(topic, trans), trans)

    async def delete_topic(self, topic: str) -> None:
        trans = next(self._trans_ids)
        await self._ask(DeleteTopic(topic, trans), trans)

    async def list_topics(self) -> list[str]:
        trans = next(self._trans_ids)
        answer = await self._ask(ListTopics(trans), trans)
        return list(answer.names) if isinstance(answer, TopicList) else []

    async def subscribe(self, topic: str, duration: int = 3600,
                        subscriber: Endpoint | str | None = None,
                        link: str | None = None, *, snapshot: bool = False) -> None:
        """`link`: the link the subscription's data travel on (default: the subscriber).
        `snapshot`: the link first carries the current images and deltas of the topic's data
        items (stamp.snapshot), then live data (robust-binding §9)."""
        trans = next(self._trans_ids)
        who = self._endpoint(subscriber)
        await self._ask(Subscribe(who, topic, trans, duration, link, snapshot), trans)

    async def snapshot(self, topic: str, message_id: str | None = None,
                       link: str | None = None) -> None:
        """The current images and deltas of `topic`'s data items (or of one item) once, on
        `link` (default: our endpoint), without subscribing (robust-binding §9). They arrive
        from `events()` (stamp.snapshot) before this returns; a refusal raises its
        `ApexpsError` (550 unknown topic, 537, …)."""
        trans = next(self._trans_ids)
        await self._ask(SnapshotRequest(topic, trans, message_id, link), trans)

    async def gap(self, link: str, link_from: int, link_to: int | None = None,
                  epoch: int | None = None) -> LinkReply:
        """Ask for link seqs `link_from..link_to` again (§5.1). The refilled items arrive
        from `events()` (stamp.refill) before this returns the 250 `linkreply`; any other code
        raises its `ApexpsError` (553, 537, 569, 570)."""
        trans = next(self._trans_ids)
        answer = await self._ask(GapRequest(link, link_from, trans, link_to, epoch), trans)
        assert isinstance(answer, LinkReply)
        return answer

    async def capabilities(self) -> Capabilities:
        trans = next(self._trans_ids)
        answer = await self._ask(CapabilityQuery(trans), trans)
        assert isinstance(answer, Capabilities)
        return answer

    async def cancel(self, topic: str, subscriber: Endpoint | str | None = None) -> None:
        trans = next(self._trans_ids)
        await self._ask(Cancel(topic, trans, self._endpoint(subscriber)), trans)

    async def publish(self, topic: str, content: bytes,
                      content_type: str = "application/octet-stream", *,
                      publish_type: PublishType | str = PublishType.UPDATE,
                      message_id: str | None = None, token: str | None = None,
                      publisher_seq: int | None = None) -> None:
        """Send to `apex=pubsub/TOPIC@domain`; returns once the broker holds it durably.
        `publish_type`, `message_id` (the data item, with the topic), `token` (a permission
        token) and `publisher_seq` travel in the `apexps.publish` option (robust-binding §2.3);
        a plain update without the rest sends no option."""
        to = Endpoint(SERVICE, self.service.domain, topic)
        meta = PublishMeta(PublishType(publish_type), message_id, token, publisher_seq)
        options = () if meta == _PLAIN else (publish_option(meta),)
        await self.client.send(self.endpoint, [to], content, content_type, options=options)

    def _endpoint(self, who: Endpoint | str | None) -> Endpoint:
        if who is None:
            return self.endpoint
        return Endpoint.parse(who) if isinstance(who, str) else who

    # --- what arrives unprompted --------------------------------------------------------

    async def events(self) -> AsyncIterator[Delivered | Ended | LinkEvent]:
        """Forwarded messages and subscription ends, until the connection is lost."""
        while True:
            event = await self._events.get()
            if event is None:
                self._events.put_nowait(None)
                raise ServiceNotAvailable("connection to the broker lost")
            yield event

    def _connection_event(self, event: ConnectionEvent) -> None:
        if isinstance(event, Disconnected):
            waiting, self._waiting = self._waiting, {}
            for future in waiting.values():
                if not future.done():
                    future.set_exception(ServiceNotAvailable(
                        "connection to the broker lost before its reply came"))

    async def _demux(self) -> None:
        async for data in self.client.receive():
            self._route(data)
        self._events.put_nowait(None)

    def _stamp(self, data: Data) -> Stamp | None:
        mine = [i for i, r in enumerate(data.recipients) if r == self.endpoint] or [0]
        try:
            return find_stamp(data.options_of(mine[0]))
        except ApexpsError:
            return None

    def _robust(self, data: Data) -> bool:
        """Handle a robust delivery document (heartbeat, reset, linkreply, capabilities)."""
        head = data.content.lstrip()[:64]
        if not any(head.startswith(b"<" + t.encode()) for t in ROBUST_ELEMENTS):
            return False
        try:
            doc = decode_robust(data.content)
        except ApexpsError:
            return True
        if isinstance(doc, LinkReply | Capabilities):
            future = self._waiting.get(doc.trans_id) if doc.trans_id else None
            if future is not None and not future.done():
                future.set_result(doc)
            return True
        stamp = self._stamp(data)
        if stamp is not None and self.link_events:
            self._events.put_nowait(LinkEvent(stamp, doc))
        return True

    def _route(self, data: Data) -> None:
        origin = data.originator
        if origin.address != SERVICE:
            return
        if origin.subaddress is not None:
            self._events.put_nowait(Delivered(origin.subaddress, str(origin), data.content,
                                              data.content_type, self._stamp(data)))
            return
        if self._robust(data):
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
            self._events.put_nowait(Ended(op.topic, str(op.subscriber or self.endpoint)))
