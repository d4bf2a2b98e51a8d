"""`ReliablePublisher`: publishing that survives lost connections, without duplicates.

Theory of operation
-------------------
The broker journals each (endpoint, publisher seq) at most once and answers every copy `ok`
once that one record is durable (docs/robust-binding.md §8). That lets a publisher send again
whatever it has no `ok` for, without asking what became of it. This class is that publisher:

- **Numbering.** `start` asks the broker where this endpoint stands (`pubstatus`) and numbers
  publications from the pubseq after it, so a restarted application continues the sequence
  instead of colliding with its previous life. Only one publisher may number an endpoint's
  publications at a time (two would take each other's messages for copies): run a second one
  under another endpoint, e.g. a subaddress.
- **Window.** Every publication stays in the window until the broker said `ok`; `send` waits
  while the window is full (back-pressure), `publish` also waits for the `ok`, `flush` for all.
- **Pipelining.** Up to `max_in_flight` (256) sends are on the wire at once, written in pubseq
  order: each is a task started in order, and nothing on the way to the socket suspends while
  the connection is up and fewer than `ApexClient`'s own limit (288) requests are unanswered —
  which `max_in_flight` stays below. Order matters: the broker takes a pubseq that arrives after a
  higher one of ours became durable for a copy.
- **Reconnection** (with `PubsubClient.connect(..., reconnect=ReconnectPolicy(...))`). On
  `Disconnected` every send in flight goes back to the queue, and on `Reconnected` everything
  unacknowledged is sent again, oldest first. A send task checks, in the step that writes, that
  the connection it was started for is still the one up: the reconnecting client clears its
  "up" state and tells its listeners in one step, so a send can never wait out a reconnection
  and then write on the new connection among (or after) the resends. Copies the broker already
  holds are answered `ok` without a second record; copies still in flight there are answered
  with the original's outcome.
- **Refusals.** A retriable error reply (421: Kafka did not take it; a reply that timed out) is
  tried again after a backoff, at most `max_attempts` times; the broker journals the resend of a
  pubseq whose append failed. Anything else (537, 550, 553, …) fails that publication: its
  future raises, and `flush` raises the first such error.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from dataclasses import dataclass, field

import structlog

from broker.records import PublishType
from common.errors import ApexpsError, ServiceNotAvailable

from .pubsub_client import PubsubClient
from .reconnect import Closed, ConnectionEvent, Disconnected, Reconnected, ReconnectingApexClient

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_WINDOW",
    "PublisherStats",
    "ReliablePublisher",
]

log = structlog.get_logger(__name__)

#: Publications kept unacknowledged at most (the resend buffer; `send` waits beyond it).
DEFAULT_WINDOW = 1000
#: Sends on the wire at once: throughput is about this many per journal round trip, and the
#: broker's journal batches what arrives together. Below ApexClient's MAX_IN_FLIGHT (288), so a
#: send does not queue there (its queue is FIFO, so order would hold anyway) and the client's
#: other requests fit beside. It was 28 while relays took at most 64 MSGs pending.
DEFAULT_MAX_IN_FLIGHT = 256
#: Retriable refusals of one publication before it fails (lost connections do not count).
DEFAULT_MAX_ATTEMPTS = 10
#: Backoff after a retriable refusal: this, doubling per attempt, up to RETRY_WAIT_MAX seconds.
RETRY_WAIT = 0.1
RETRY_WAIT_MAX = 5.0


@dataclass(slots=True)
class _Item:
    pubseq: int
    topic: str
    content: bytes
    content_type: str
    publish_type: PublishType
    message_id: str | None
    token: str | None
    done: asyncio.Future[int]
    #: retriable refusals so far
    attempts: int = 0
    #: times written (more than once: resent)
    sent: int = 0
    task: asyncio.Task[None] | None = None


@dataclass(slots=True)
class PublisherStats:
    """Counters of one `ReliablePublisher` (for progress reports)."""

    #: publications taken by `send`
    queued: int = 0
    #: acknowledged: durable in the broker
    acked: int = 0
    #: failed for good (their futures raise)
    failed: int = 0
    #: sends of a publication that had been sent before (after a lost connection or a refusal)
    resent: int = 0
    #: connections lost
    disconnects: int = 0
    #: the last pubseq acknowledged
    last_acked: int = 0
    errors: list[ApexpsError] = field(default_factory=list)


class ReliablePublisher:
    """Use `await ReliablePublisher.start(pubsub_client)`; see the module docstring."""

    def __init__(self, client: PubsubClient, first_seq: int, *, window: int = DEFAULT_WINDOW,
                 max_in_flight: int | None = None,
                 max_attempts: int | None = DEFAULT_MAX_ATTEMPTS) -> None:
        """Prefer `start`, which asks the broker for `first_seq`."""
        if max_in_flight is None:
            max_in_flight = min(DEFAULT_MAX_IN_FLIGHT, window)
        if not 1 <= max_in_flight <= window:
            raise ValueError(f"need 1 <= max_in_flight <= window, not {max_in_flight},"
                             f" {window}")
        if first_seq < 1:
            raise ValueError(f"publisher seqs start at 1, not {first_seq}")
        self.client = client
        self.window, self.max_in_flight, self.max_attempts = window, max_in_flight, max_attempts
        self.stats = PublisherStats()
        self._next = first_seq
        self._items: dict[int, _Item] = {}
        self._unsent: list[int] = []  # heap of pubseqs to (re)send
        self._in_flight: set[int] = set()
        self._generation = 0  # +1 per lost connection
        self._connected = True
        self._closed: ServiceNotAvailable | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._reported = 0  # errors already raised by flush
        apex = client.client
        if isinstance(apex, ReconnectingApexClient):
            self._connected = apex.is_connected
            apex.add_listener(self._on_connection)

    @classmethod
    async def start(cls, client: PubsubClient, *, window: int = DEFAULT_WINDOW,
                    max_in_flight: int | None = None,
                    max_attempts: int | None = DEFAULT_MAX_ATTEMPTS) -> ReliablePublisher:
        """Ask the broker where this endpoint's publishing stands and continue after it.

        Args:
            window: publications kept unacknowledged at most; `send` waits beyond.
            max_in_flight: sends on the wire at once (at most `window`; default
                `DEFAULT_MAX_IN_FLIGHT`, or `window` if that is smaller).
            max_attempts: retriable refusals of one publication before it fails (None:
                never); the `pubstatus` query here is retried as often.
        """
        for attempt in itertools.count(1):
            try:
                status = await client.pubstatus()
                break
            except (ServiceNotAvailable, TimeoutError) as exc:
                if max_attempts is not None and attempt >= max_attempts:
                    raise
                log.info("pubstatus failed; asking again", attempt=attempt, error=str(exc))
                await asyncio.sleep(_backoff(attempt))
        log.info("publisher resumes", endpoint=str(client.endpoint), after=status.pubseq,
                 source_seq=status.source_seq)
        return cls(client, status.pubseq + 1, window=window, max_in_flight=max_in_flight,
                   max_attempts=max_attempts)

    # --- the application's side ---------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The pubseq the next `send` will take."""
        return self._next

    @property
    def unacknowledged(self) -> int:
        return len(self._items)

    async def send(self, topic: str, content: bytes,
                   content_type: str = "application/octet-stream", *,
                   publish_type: PublishType | str = PublishType.UPDATE,
                   message_id: str | None = None, token: str | None = None,
                   ) -> asyncio.Future[int]:
        """Queue one publication, waiting while the window is full; return a future that
        resolves to its pubseq once the broker holds it durably (or raises why not)."""
        ptype = PublishType(publish_type)
        while len(self._items) >= self.window:
            self._room.clear()
            await self._room.wait()
        if self._closed is not None:
            raise ServiceNotAvailable(str(self._closed))
        pubseq = self._next
        self._next += 1
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieve)
        self._items[pubseq] = _Item(pubseq, topic, content, content_type, ptype, message_id,
                                    token, done)
        self.stats.queued += 1
        self._drained.clear()
        heapq.heappush(self._unsent, pubseq)
        self._pump()
        return done

    async def publish(self, topic: str, content: bytes,
                      content_type: str = "application/octet-stream", *,
                      publish_type: PublishType | str = PublishType.UPDATE,
                      message_id: str | None = None, token: str | None = None) -> int:
        """`send`, then wait for the `ok`; return the publication's pubseq."""
        done = await self.send(topic, content, content_type, publish_type=publish_type,
                               message_id=message_id, token=token)
        return await done

    async def flush(self) -> None:
        """Wait until every publication sent so far is acknowledged or failed; raise the first
        error not raised by a `flush` before."""
        await self._drained.wait()
        errors = self.stats.errors[self._reported:]
        self._reported = len(self.stats.errors)
        if errors:
            raise errors[0]

    async def close(self) -> None:
        """Stop: what is unacknowledged fails (call `flush` first to wait for it). The
        `PubsubClient` stays open."""
        tasks = [i.task for i in self._items.values() if i.task is not None]
        self._shut(ServiceNotAvailable("the publisher was closed"))
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> ReliablePublisher:
        return self

    async def __aexit__(self, exc_type: object, *_: object) -> None:
        try:
            if exc_type is None:
                await self.flush()
        finally:
            await self.close()

    # --- sending ------------------------------------------------------------------------

    def _pump(self) -> None:
        """Start sends, oldest pubseq first, while connected and below `max_in_flight`."""
        while (self._connected and self._closed is None and self._unsent
               and len(self._in_flight) < self.max_in_flight):
            pubseq = heapq.heappop(self._unsent)
            item = self._items.get(pubseq)
            if item is None or pubseq in self._in_flight:
                continue
            self._in_flight.add(pubseq)
            if item.sent:
                self.stats.resent += 1
            item.sent += 1
            # Tasks run their first step in creation order, and that step writes the MSG.
            item.task = asyncio.create_task(self._send_one(item, self._generation))

    async def _send_one(self, item: _Item, generation: int) -> None:
        again = False
        while True:
            if generation != self._generation or not self._connected:
                return  # started for a connection that is gone: it is queued again
            self.stats.resent += again
            try:
                await self.client.publish(item.topic, item.content, item.content_type,
                                          publish_type=item.publish_type,
                                          message_id=item.message_id, token=item.token,
                                          publisher_seq=item.pubseq)
            except (ApexpsError, TimeoutError, OSError) as exc:
                if generation != self._generation or not self._connected:
                    return  # the connection went; `_on_connection` queued it again
                retriable = not isinstance(exc, ApexpsError) or exc.retriable
                item.attempts += 1
                if not retriable or (self.max_attempts is not None
                                     and item.attempts >= self.max_attempts):
                    self._finish(item, exc if isinstance(exc, ApexpsError)
                                 else ServiceNotAvailable(f"{type(exc).__name__}: {exc}"))
                    return
                log.info("publication refused; sending it again", pubseq=item.pubseq,
                         attempt=item.attempts, error=str(exc))
                await asyncio.sleep(_backoff(item.attempts))
                again = True
                continue
            self._finish(item, None)
            return

    def _finish(self, item: _Item, error: ApexpsError | None) -> None:
        self._in_flight.discard(item.pubseq)
        self._items.pop(item.pubseq, None)
        item.task = None
        if not item.done.done():
            if error is None:
                self.stats.acked += 1
                self.stats.last_acked = max(self.stats.last_acked, item.pubseq)
                item.done.set_result(item.pubseq)
            else:
                self.stats.failed += 1
                self.stats.errors.append(error)
                log.warning("publication failed", pubseq=item.pubseq, topic=item.topic,
                            code=int(error.code), error=str(error))
                item.done.set_exception(error)
        if len(self._items) < self.window:
            self._room.set()
        if not self._items:
            self._drained.set()
        self._pump()

    # --- the connection -----------------------------------------------------------------

    def _on_connection(self, event: ConnectionEvent) -> None:
        if isinstance(event, Disconnected):
            self._connected = False
            self._generation += 1
            self.stats.disconnects += 1
            # Their tasks see the new generation and leave them alone (an `ok` that still
            # arrives is taken, the error of the lost connection is not counted).
            for pubseq in self._in_flight:
                item = self._items[pubseq]
                item.task, item.attempts = None, 0
                heapq.heappush(self._unsent, pubseq)
            self._in_flight.clear()
        elif isinstance(event, Reconnected):
            self._connected = True
            log.info("publisher resends what is unacknowledged", count=len(self._items),
                     first=min(self._items, default=None))
            self._pump()
        elif isinstance(event, Closed):
            self._shut(event.error or ServiceNotAvailable("the connection was closed"))

    def _shut(self, error: ServiceNotAvailable) -> None:
        if self._closed is None:
            self._closed = error
        for item in list(self._items.values()):
            if item.task is not None:
                item.task.cancel()
            self._finish(item, error)
        self._room.set()
        self._drained.set()


def _backoff(attempt: int) -> float:
    return min(RETRY_WAIT_MAX, RETRY_WAIT * 2.0 ** min(attempt - 1, 30))


def _retrieve(done: asyncio.Future[int]) -> None:
    """`flush` reports failures; a future nobody awaits must not also warn at exit."""
    if not done.cancelled():
        done.exception()
