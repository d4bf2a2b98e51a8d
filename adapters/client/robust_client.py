"""`RobustSubscriber`: the subscriber stub (resequencer.py) at work on a live `PubsubClient`.

Theory of operation
-------------------
The stub decides; this class does its I/O. It takes one link over from the client
(`PubsubClient.listen_link`) and feeds the stub, in arrival order:

- every stamped delivery, heartbeat and reset of the link (`receive`);
- every `linkreply` naming the link that no request of the client itself awaits (`on_reply`).
  The stub takes its transIDs from the client's counter (`PubsubClient.new_trans_id`), so a
  reply to the stub is never mistaken for a reply to the client, or the other way round;
- the passing of time (`tick`, every `tick_interval` seconds of loop time);
- every reconnection of a `ReconnectingApexClient` (`resume` on its `Reconnected` event). A
  subscription lives in the broker, not in the connection, so nothing is subscribed again: the
  stub asks for what it missed with an open-ended gap and holds what arrives until the answer.

It carries out what the stub returns: `Deliver` goes into the application's queue;
`RequestGap` and `RequestRepair` are posted to apex=pubsub@D by one sender task, in order, fire
and forget (the answer comes back as a linkreply; a request lost with a connection is asked
again by the stub's timers or by the resume after the reconnection); notices (`Delayed`,
`SilentLink`, `Reset`, `Repaired`, `Lost`, `LinkRefused`) are logged, passed to `on_notice`, and
queued for `events()`.

Positions and "processed". A message is processed once the application asks for the next one
or closes the subscriber (confluent-kafka's rule: store the offset after processing). What is
committed then is the stub's position right after that message: each queued message carries it
(its stamp's epoch and link seq, the source seqs delivered up to it). When everything handed
out is processed and nothing is queued, the stub's own position is committed, which heartbeats
may have moved further on. With a `PositionsFile` the committed position is saved at most every
`save_interval` seconds (from a worker thread: a save fsyncs) and at `close`. A subscriber built
from that file resumes right after the last processed message: nothing lost, and after a clean
`close` nothing twice; after a crash, what was handed out since the last save comes again (at
least once), as with any consumer that commits after processing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import structlog

from adapters.apex.robust_codec import GapRequest, LinkReply, RepairRequest
from adapters.apex.robust_stamp import Stamp
from common.errors import ApexpsError, ConfigError, InvalidParameter, ServiceNotAvailable

from .positions_file import PositionsFile
from .pubsub_client import Delivered, LinkTraffic, PubsubClient
from .reconnect import ConnectionEvent, Detached, Reconnected, ReconnectingApexClient
from .resequencer import (
    DEFAULT_MAX_HELD,
    Action,
    Delayed,
    Deliver,
    LinkRefused,
    Lost,
    Positions,
    Repaired,
    RequestGap,
    RequestRepair,
    Resequencer,
    ResequencerCounters,
    Reset,
    SilentLink,
)

__all__ = [
    "DEFAULT_SAVE_INTERVAL",
    "Message",
    "Notice",
    "PositionsFile",
    "RobustSubscriber",
]

log = structlog.get_logger(__name__)

#: Seconds between saves of the positions file while messages flow: an fsync per message would
#: cap a subscriber at a few hundred messages a second; at 0.1 s a crash repeats at most that
#: tenth of a second of messages.
DEFAULT_SAVE_INTERVAL = 0.1
#: The stub's timers count in heartbeat intervals; a tick per quarter interval notices a late
#: heartbeat within 1.25 intervals of twice the interval, within these bounds (seconds).
MIN_TICK, MAX_TICK = 0.05, 1.0

Notice = Delayed | SilentLink | Reset | Repaired | Lost | LinkRefused
_OCTETS = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the link, in link order; each (source, source seq) comes once."""

    #: where it stands: link, epoch, link seq, source, source seq, publish type, topic …
    stamp: Stamp
    content: bytes
    content_type: str

    @property
    def topic(self) -> str:
        assert self.stamp.topic is not None  # a data stamp always names its topic
        return self.stamp.topic


class _Payload(bytes):
    """Content as the stub carries it (opaque bytes), with its media type riding along so the
    application gets it back with the message."""

    content_type: str


@dataclass(frozen=True, slots=True)
class _Queued:
    message: Message
    #: the stub's position right after this message
    positions: Positions


@dataclass(frozen=True, slots=True)
class _End:
    error: ApexpsError | None


class RobustSubscriber:
    """One link's robust subscriber; see the module docstring. Prefer `open`.

    Args:
        client: the connection (with a `ReconnectPolicy`, it resumes after each reconnection).
        stub: the link's stub, built with `request_ids=client.new_trans_id`.
        state: where positions are saved (None: nowhere).
        on_notice: called with each notice, in the event loop (it must not block).
        save_interval: seconds between saves while messages flow.
        tick_interval: seconds between the stub's ticks (default: a quarter of its heartbeat
            interval, within `MIN_TICK`..`MAX_TICK`).
    """

    def __init__(self, client: PubsubClient, stub: Resequencer, *,
                 state: PositionsFile | None = None,
                 on_notice: Callable[[Notice], None] | None = None,
                 save_interval: float = DEFAULT_SAVE_INTERVAL,
                 tick_interval: float | None = None) -> None:
        self.client, self.stub, self.state = client, stub, state
        self.link = stub.link
        self.on_notice = on_notice
        self.save_interval = save_interval
        self.tick_interval = tick_interval if tick_interval is not None else \
            min(MAX_TICK, max(MIN_TICK, stub.heartbeat_interval / 4))
        #: reconnections the subscriber resumed after
        self.resumes = 0
        #: messages delivered to the application that came as gap-fill copies
        self.refilled = 0
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[_Queued | Notice | _End] = asyncio.Queue()
        self._messages_queued = 0
        #: the stub's position after the last message queued
        self._position = stub.positions()
        #: the position after the last message handed out, until it counts as processed
        self._handed: Positions | None = None
        self._committed = self._position
        self._saved: Positions | None = None
        self._save_timer: asyncio.TimerHandle | None = None
        self._save_task: asyncio.Task[None] | None = None
        self._outbox: asyncio.Queue[GapRequest | RepairRequest] = asyncio.Queue()
        self._closing: asyncio.Future[None] | None = None
        self._stopped = False
        #: `deliver_to`'s callback: messages go there instead of the queue
        self._on_message: Callable[[Message], None] | None = None
        client.listen_link(self.link, self._traffic)
        if isinstance(client.client, ReconnectingApexClient):
            client.client.add_listener(self._connection_event)
        self._tasks = [asyncio.create_task(self._send_requests(), name=f"robust-send-{self.link}"),
                       asyncio.create_task(self._tick(), name=f"robust-tick-{self.link}")]
        # Built from saved positions, the stub asks for everything after them (a stub that
        # knows nothing yet has nothing to ask for: resume is a no-op then).
        self._apply(stub.resume(self._loop.time()))

    @classmethod
    async def open(cls, client: PubsubClient, link: str | None = None, *,
                   state: str | os.PathLike[str] | PositionsFile | None = None,
                   on_notice: Callable[[Notice], None] | None = None,
                   save_interval: float = DEFAULT_SAVE_INTERVAL,
                   tick_interval: float | None = None,
                   max_held: int = DEFAULT_MAX_HELD,
                   gap_timeout: float | None = None,
                   repair_timeout: float | None = None) -> RobustSubscriber:
        """Ask the service for its capabilities (seq bits, heartbeat interval, max gap), load
        the positions from `state` if it exists, and start. Subscribe afterwards
        (`subscribe`), so that nothing of the link arrives before the stub listens.

        `link`: the link to follow; default: the one `state` names, else the client's own
        endpoint (the broker's default link for its subscriptions). `max_held`, `gap_timeout`
        and `repair_timeout` go to the `Resequencer`.

        Raises:
            InvalidParameter: 553, `state` holds the positions of another link.
            ParameterSyntaxError: 501, `state` holds something else than positions.
            ConfigError: `state` cannot be read.
        """
        caps = await client.capabilities()
        file = state if isinstance(state, PositionsFile) or state is None \
            else PositionsFile(state)
        positions = None if file is None else file.load()
        if link is None:
            link = positions.link if positions is not None else str(client.endpoint)
        if positions is not None and positions.link != link:
            raise InvalidParameter(f"{file.path if file else 'the state'} holds the positions"
                                   f" of link {positions.link!r}, not {link!r}")
        if positions is not None and positions.bits != caps.seq_bits:
            # The broker changed its link seq resolution, which resets every link: only the
            # source seqs still mean something (the stub repairs by source from them).
            log.warning("robust link seq resolution changed; resuming by source",
                        link=link, saved_bits=positions.bits, bits=caps.seq_bits)
            positions = Positions(link, caps.seq_bits, None, 0, positions.time,
                                  positions.sources)
        stub = Resequencer(link, caps.seq_bits, caps.heartbeat_ms / 1000,
                              positions=positions, max_gap=caps.max_gap, max_held=max_held,
                              gap_timeout=gap_timeout, repair_timeout=repair_timeout,
                              request_ids=client.new_trans_id)
        return cls(client, stub, state=file, on_notice=on_notice, save_interval=save_interval,
                   tick_interval=tick_interval)

    async def subscribe(self, topic: str, duration: int = 3600, *,
                        snapshot: bool = False, cached: bool = False,
                        selector: str | None = None,
                        selector_class: str = "JMS") -> str | None:
        """Subscribe to `topic` with this link (again, after a restart: it renews the
        subscription the broker kept); returns its subscription id. `snapshot`: the link
        first carries the current state of the topic's data items (robust-binding §9; the
        stub delivers those copies as they come, without its duplicate check). `selector`:
        the link carries only the messages it matches, still contiguous (draft-content §5.6;
        `stamp.in_re` names the subscriptions each satisfied, where the broker says).
        `cached`: the topic's cached messages first (content-based §5.8), as snapshot
        copies."""
        return await self.client.subscribe(topic, duration, link=self.link, snapshot=snapshot,
                                           cached=cached, selector=selector,
                                           selector_class=selector_class)

    # --- what the application reads ---------------------------------------------------

    @property
    def counters(self) -> ResequencerCounters:
        """The stub's counters (delivered, duplicates, holes, gap requests, repaired …)."""
        return self.stub.counters

    def positions(self) -> Positions:
        """The committed position: right after the last message the application processed."""
        return self._committed

    async def messages(self) -> AsyncIterator[Message]:
        """The link's messages, contiguous and each once, until `close` (then it ends) or
        until the connection is gone for good (then it raises `ServiceNotAvailable`). Notices
        go to the log and `on_notice` only. Iterate this or `events()`, not both."""
        async for event in self.events():
            if isinstance(event, Message):
                yield event

    def deliver_to(self, callback: Callable[[Message], None]) -> None:
        """From now on hand each message to `callback` as the stub releases it (in the
        connection's read loop, in link order, each once), instead of queueing it for
        `messages()`/`events()`; a message counts as processed once `callback` returns.
        Notices still go to the log, `on_notice` and `events()`. For a subscriber that
        handles each message at once: it saves a queue and a task switch per message. Call
        it before `subscribe`; the callback must not block; what it raises is logged and the
        message still counts as processed (the stub cannot give it again)."""
        self._on_message = callback

    async def events(self) -> AsyncIterator[Message | Notice]:
        """`messages()` with the notices in between, in the order they happened."""
        while True:
            self._processed()  # the application came back for more
            entry = await self._queue.get()
            if isinstance(entry, _End):
                self._queue.put_nowait(entry)
                if entry.error is not None:
                    raise entry.error
                return
            if isinstance(entry, _Queued):
                self._messages_queued -= 1
                self._handed = entry.positions
                yield entry.message
            else:
                yield entry

    async def close(self) -> None:
        """Stop: what was handed out counts as processed, the positions are saved, and the
        iterators end (messages queued but not handed out come again after a restart). The
        client stays open."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def __aenter__(self) -> RobustSubscriber:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _close(self) -> None:
        self.client.unlisten_link(self.link)
        if isinstance(self.client.client, ReconnectingApexClient):
            self.client.client.remove_listener(self._connection_event)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._processed()
        self._stopped = True  # what is committed now is final
        while not self._queue.empty():  # not handed out: not processed
            self._queue.get_nowait()
        self._messages_queued = 0
        self._queue.put_nowait(_End(None))
        if self._save_timer is not None:
            self._save_timer.cancel()
            self._save_timer = None
        if self._save_task is not None:
            await self._save_task
        await self._save()
        log.info("robust subscriber closed", link=self.link, resumes=self.resumes,
                 refilled=self.refilled, positions=self._committed.to_json())

    # --- the stub's inputs ------------------------------------------------------------

    def _traffic(self, item: LinkTraffic) -> None:
        now = self._loop.time()
        if item is None:
            self._queue.put_nowait(_End(ServiceNotAvailable(
                f"the connection to the broker is gone; link {self.link!r} stops")))
            return
        try:
            if isinstance(item, LinkReply):
                actions = self.stub.on_reply(item, now)
            elif isinstance(item, Delivered):
                if item.stamp is None:
                    return
                if item.content_type == _OCTETS:  # what a payload without a type says
                    actions = self.stub.receive(item.stamp, item.content, now)
                else:
                    payload = _Payload(item.content)
                    payload.content_type = item.content_type
                    actions = self.stub.receive(item.stamp, payload, now)
            else:
                actions = self.stub.receive(item.stamp, b"", now)
        except ApexpsError as exc:  # a stamp beyond the advertised resolution
            log.warning("robust stamp refused", link=self.link, error=str(exc))
            return
        self._apply(actions)

    def _connection_event(self, event: ConnectionEvent) -> None:
        if isinstance(event, Reconnected):
            self.resumes += 1
            log.info("robust link resuming after reconnect", link=self.link,
                     attempts=event.attempts, positions=self.stub.positions().to_json())
            self._apply(self.stub.resume(self._loop.time()))
        elif isinstance(event, Detached) and event.endpoint == self.client.endpoint:
            log.error("robust subscriber detached by the relay; nothing more will arrive",
                      link=self.link, code=event.code, text=event.text)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_interval)
            self._apply(self.stub.tick(self._loop.time()))

    # --- the stub's outputs -----------------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Deliver):
                self._queue_message(action)
            elif isinstance(action, RequestGap | RequestRepair):
                self._outbox.put_nowait(action.document())
            else:
                self._notice(action)
        if self._handed is None and self._messages_queued == 0:
            self._commit(self.stub.positions())  # heartbeats moved it, say

    def _queue_message(self, action: Deliver) -> None:
        stamp = action.stamp
        assert stamp.source is not None and stamp.source_seq is not None
        before = self._position
        sources = dict(before.sources)
        sources[stamp.source] = stamp.source_seq
        self._position = Positions(self.link, before.bits, stamp.epoch, stamp.link_seq,
                                   before.time if stamp.time is None else stamp.time, sources)
        content_type = getattr(action.content, "content_type", _OCTETS)
        message = Message(stamp, action.content, content_type)
        if stamp.refill:
            self.refilled += 1
        if self._on_message is not None:
            try:
                self._on_message(message)
            except Exception:  # the application's bug must not stop the link
                log.exception("deliver_to callback failed", link=self.link,
                              link_seq=stamp.link_seq)
            return  # processed: `_apply` commits the stub's position after its actions
        self._messages_queued += 1
        self._queue.put_nowait(_Queued(message, self._position))

    def _notice(self, notice: Notice) -> None:
        link = self.link
        match notice:
            case Delayed():
                log.warning("robust link delayed", link=link, reason=notice.reason,
                            waited=round(notice.waited, 3), link_from=notice.link_from,
                            link_to=notice.link_to)
            case SilentLink():
                log.warning("robust link silent", link=link, waited=round(notice.waited, 3))
            case Reset():
                log.warning("robust link reset; repairing by source", link=link,
                            epoch=notice.epoch, reason=notice.reason)
            case Repaired():
                log.info("robust link repaired", link=link, link_from=notice.link_from,
                         link_to=notice.link_to, items=notice.items,
                         waited=round(notice.waited, 3))
            case Lost():
                log.error("robust link lost messages", link=link, reason=notice.reason,
                          after={p.source: p.after for p in notice.sources})
            case LinkRefused():
                log.error("robust link refused", link=link, code=notice.code, text=notice.text)
        if self.on_notice is not None:
            try:
                self.on_notice(notice)
            except Exception:  # the application's bug must not stop the link
                log.exception("on_notice failed", link=link, notice=type(notice).__name__)
        self._queue.put_nowait(notice)

    async def _send_requests(self) -> None:
        while True:
            doc = await self._outbox.get()
            try:
                await self.client.post(doc)
            except (ApexpsError, OSError) as exc:
                log.warning("robust request not sent", link=self.link,
                            request=type(doc).__name__, trans_id=doc.trans_id, error=str(exc))

    # --- positions --------------------------------------------------------------------

    def _processed(self) -> None:
        """Everything handed out so far is processed."""
        if self._stopped:
            return
        if self._handed is not None:
            self._commit(self._handed)
            self._handed = None
        if self._messages_queued == 0:
            self._commit(self.stub.positions())

    def _commit(self, positions: Positions) -> None:
        if positions == self._committed:
            return
        self._committed = positions
        if self.state is not None and self._save_timer is None and not self._stopped:
            self._save_timer = self._loop.call_later(self.save_interval, self._save_soon)

    def _save_soon(self) -> None:
        self._save_timer = None
        if self._save_task is not None and not self._save_task.done():
            # one write at a time: look again shortly
            self._save_timer = self._loop.call_later(self.save_interval, self._save_soon)
            return
        self._save_task = asyncio.create_task(self._save())

    async def _save(self) -> None:
        state, positions = self.state, self._committed
        if state is None or positions == self._saved:
            return
        try:
            await asyncio.to_thread(state.save, positions)
        except ConfigError as exc:  # disk full, say: keep going, try again on the next commit
            log.error("positions not saved", link=self.link, path=str(state.path),
                      error=str(exc))
            return
        except RuntimeError as exc:  # the loop is shutting down and was never closed
            log.error("positions not saved: the subscriber was not closed", link=self.link,
                      path=str(state.path), error=str(exc))
            return
        self._saved = positions
