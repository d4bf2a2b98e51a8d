"""`ReconnectingApexClient`: an `ApexClient` that survives the loss of its relay.

Theory of operation
-------------------
One `ApexClient` is one BEEP session; when its transport dies (the relay restarted, a NAT
forgot us, the network blinked) it is finished. This wrapper keeps a *current* `ApexClient` and
a supervisor task that pumps the current client's `receive()` into one inbox of its own. When
that pump ends without `close()` having been called, the connection is lost, and the
supervisor:

1. tells the listeners (`Disconnected`) and logs it;
2. re-dials with capped exponential backoff and jitter (`ReconnectPolicy.delay`), redoing the
   whole `ApexClient.connect`: TCP, greeting, TLS, SASL, APEX channel;
3. re-attaches every endpoint that was attached, under the transaction-identifier it had, with
   RFC 3342's attachOverride added: after a one-sided loss the relay may still hold our old
   session (it has not yet noticed the dead TCP connection), and without the override it would
   refuse the attach with 555 until it did;
4. tells the listeners (`Reconnected`), and the pump resumes on the new client, so an iterator
   obtained from `receive()` before the loss simply goes on yielding.

What is NOT done, on purpose: a `send` whose MSG was written before the loss raises
`ServiceNotAvailable` (421, retriable) and is never sent again by this class. The relay may or
may not have taken it; only the caller knows whether sending it twice is harmless. A `send`
started while the connection is down waits for the reconnection (up to the client's `timeout`)
and then goes out once, because nothing of it was written before.

An endpoint the relay takes away from us -- a `terminate` arrives, typically 556 because another
session attached it with attachOverride -- is dropped from the set to re-attach (`Detached`),
or two reconnecting clients of the same endpoint would take it from each other forever. A
re-attach that the relay refuses with a non-retriable code (e.g. 537: the access policy changed)
drops that endpoint too and is reported in `Reconnected.lost`; a retriable one (421, 454) or a
lost connection counts as a failed attempt.

The policy is modelled on nats.py's (`max_reconnect_attempts`, `reconnect_time_wait`,
`reconnect_jitter`); as there, the *first* `connect` is not retried: a wrong address should fail
at once, not after a minute of backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from adapters.apex.codec import Data, Option, Terminate
from adapters.apex.endpoint import Endpoint
from adapters.apex.relay import ATTACH_OVERRIDE
from common.errors import ApexpsError, ServiceNotAvailable

from ._outlet import DataOutlet
from .client import DEFAULT_TIMEOUT, MAX_IN_FLIGHT, ApexClient

__all__ = [
    "DEFAULT_MAX_RECONNECT_ATTEMPTS",
    "DEFAULT_RECONNECT_JITTER",
    "DEFAULT_RECONNECT_WAIT",
    "DEFAULT_RECONNECT_WAIT_MAX",
    "Closed",
    "ConnectionEvent",
    "Detached",
    "Disconnected",
    "ReconnectPolicy",
    "Reconnected",
    "ReconnectingApexClient",
]

log = structlog.get_logger(__name__)

#: Attempts after one loss before giving up (nats.py's default too): about half an hour with
#: the default waits. None in `ReconnectPolicy.max_attempts` means never give up.
DEFAULT_MAX_RECONNECT_ATTEMPTS = 60
#: Seconds of backoff before the first attempt; each further attempt doubles it ...
DEFAULT_RECONNECT_WAIT = 0.5
#: ... up to this, so a relay that stays down costs one connection attempt per half minute.
DEFAULT_RECONNECT_WAIT_MAX = 30.0
#: Up to this fraction of each wait is random, so that the clients of a restarted relay do not
#: all come back in the same millisecond ("equal jitter" at 0.5: half fixed, half random).
DEFAULT_RECONNECT_JITTER = 0.5


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How a `ReconnectingApexClient` re-dials after losing its relay.

    Attributes:
        max_attempts: connection attempts per loss before giving up (then `receive()` ends and
            every call raises `ServiceNotAvailable`); None retries forever.
        wait: seconds of backoff before the first attempt; attempt n waits `wait * 2**(n-1)`,
        wait_max: capped at this,
        jitter: of which this fraction (0..1) is replaced by a uniformly random share.
    """

    max_attempts: int | None = DEFAULT_MAX_RECONNECT_ATTEMPTS
    wait: float = DEFAULT_RECONNECT_WAIT
    wait_max: float = DEFAULT_RECONNECT_WAIT_MAX
    jitter: float = DEFAULT_RECONNECT_JITTER

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1 (or None), not"
                             f" {self.max_attempts}")
        if not 0 <= self.wait <= self.wait_max:
            raise ValueError(f"need 0 <= wait <= wait_max, not {self.wait}, {self.wait_max}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter is a fraction in 0..1, not {self.jitter}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt number `attempt` (1, 2, ...)."""
        if attempt < 1:
            raise ValueError(f"attempts count from 1, not {attempt}")
        # 2.0**n overflows past n = 1023; by then any positive wait has long reached the cap
        ceiling = min(self.wait_max, self.wait * 2.0 ** min(attempt - 1, 1000))
        fixed = ceiling * (1 - self.jitter)
        return fixed + (rng or random).uniform(0, ceiling - fixed)


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The connection to the relay was lost; reconnecting starts now."""

    #: what ended it, as far as we know
    reason: str


@dataclass(frozen=True, slots=True)
class Reconnected:
    """A new connection is up and the endpoints are attached again."""

    #: attempts this reconnection took (1: the first one worked)
    attempts: int
    #: the endpoints attached again
    attached: tuple[Endpoint, ...]
    #: endpoints the relay refused to attach again, with its error; they are no longer attached
    lost: tuple[tuple[Endpoint, ApexpsError], ...] = ()


@dataclass(frozen=True, slots=True)
class Detached:
    """The relay ended one of our attachments (e.g. 556: attached elsewhere); it will not be
    re-attached."""

    endpoint: Endpoint
    code: int
    text: str


@dataclass(frozen=True, slots=True)
class Closed:
    """The client is finished: `close()` was called, or reconnecting gave up."""

    #: None after `close()`; otherwise why reconnecting stopped
    error: ServiceNotAvailable | None = None


ConnectionEvent = Disconnected | Reconnected | Detached | Closed
Listener = Callable[[ConnectionEvent], None]


@dataclass(frozen=True, slots=True)
class _Attachment:
    endpoint: Endpoint
    options: tuple[Option, ...]


def _overriding(options: tuple[Option, ...]) -> tuple[Option, ...]:
    if any(o.name == ATTACH_OVERRIDE and not o.external for o in options):
        return options
    return (*options, Option(ATTACH_OVERRIDE))


@dataclass(slots=True)
class _Listeners:
    callbacks: list[Listener] = field(default_factory=list)

    def emit(self, event: ConnectionEvent) -> None:
        for callback in list(self.callbacks):
            try:
                callback(event)
            except Exception:  # a listener's bug must not stop reconnecting
                log.exception("apex connection listener failed", event=type(event).__name__)


class ReconnectingApexClient:
    """Use `await ReconnectingApexClient.connect(host, port, ...)`; then `attach`, `send`,
    `receive`, `terminate`, `close`, as with `ApexClient`. See the module docstring."""

    def __init__(self, dial: Callable[[], Awaitable[ApexClient]], first: ApexClient,
                 policy: ReconnectPolicy | None = None, *, server: str = "",
                 rng: random.Random | None = None) -> None:
        """Prefer `connect`. `dial` opens one fully set-up `ApexClient` (TLS, SASL, APEX
        channel); `first` is the one it already opened."""
        self._dial, self.policy = dial, policy or ReconnectPolicy()
        self.server, self.timeout = server, first.timeout
        self._rng = rng or random.Random()
        self._current: ApexClient | None = first
        self._up = asyncio.Event()
        self._up.set()
        self._attachments: dict[int, _Attachment] = {}
        self._trans_ids = itertools.count(1)
        self._outlet = DataOutlet(server=self.server)
        self._listeners = _Listeners()
        self._closing = False
        self._final: ServiceNotAvailable | None = None
        #: connections lost so far (each followed by a reconnection or by giving up)
        self.disconnects = 0
        first.on_terminate = self._terminated
        self._task = asyncio.create_task(self._supervise(), name=f"apex-reconnect-{server}")

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = DEFAULT_TIMEOUT, *,
                      tls: ssl.SSLContext | None = None,
                      sasl: tuple[str, str] | None = None, mechanism: str = "PLAIN",
                      server_hostname: str | None = None,
                      max_in_flight: int = MAX_IN_FLIGHT,
                      policy: ReconnectPolicy | None = None,
                      on_disconnected: Callable[[Disconnected], None] | None = None,
                      on_reconnected: Callable[[Reconnected], None] | None = None,
                      on_closed: Callable[[Closed], None] | None = None,
                      ) -> ReconnectingApexClient:
        """Connect as `ApexClient.connect` does (same arguments, same errors: the first
        connection is not retried), and reconnect by `policy` whenever the connection is lost.

        The `on_*` callbacks get the matching `ConnectionEvent`; `add_listener` takes one for
        all of them (`Detached` included).
        """
        dial = functools.partial(ApexClient.connect, host, port, timeout, tls=tls, sasl=sasl,
                                 mechanism=mechanism, server_hostname=server_hostname,
                                 max_in_flight=max_in_flight)
        client = cls(dial, await dial(), policy, server=f"{host}:{port}")
        if on_disconnected is not None:
            client.add_listener(functools.partial(_only, Disconnected, on_disconnected))
        if on_reconnected is not None:
            client.add_listener(functools.partial(_only, Reconnected, on_reconnected))
        if on_closed is not None:
            client.add_listener(functools.partial(_only, Closed, on_closed))
        return client

    def add_listener(self, callback: Listener) -> None:
        """Call `callback(event)` for every `ConnectionEvent` from now on (in the event loop;
        it must not block). An exception it raises is logged and otherwise ignored."""
        self._listeners.callbacks.append(callback)

    def remove_listener(self, callback: Listener) -> None:
        """Undo `add_listener` (nothing happens if `callback` is not listening)."""
        with contextlib.suppress(ValueError):
            self._listeners.callbacks.remove(callback)

    @property
    def is_connected(self) -> bool:
        return self._up.is_set()

    @property
    def attached(self) -> tuple[Endpoint, ...]:
        """The endpoints we are attached as (or will re-attach as once reconnected)."""
        return tuple(a.endpoint for a in self._attachments.values())

    # --- the ApexClient API -------------------------------------------------------------

    async def _client(self) -> ApexClient:
        """The current connection; while reconnecting, wait for one (at most `timeout`)."""
        while True:
            if self._final is not None:
                raise ServiceNotAvailable(str(self._final))
            current = self._current
            if current is not None and self._up.is_set():
                return current
            try:
                async with asyncio.timeout(self.timeout):
                    await self._wait_up_or_final()
            except TimeoutError:
                raise ServiceNotAvailable(
                    f"not connected to the relay at {self.server}: still reconnecting after"
                    f" {self.timeout:g} s") from None

    async def _wait_up_or_final(self) -> None:
        up = asyncio.ensure_future(self._up.wait())
        try:  # the supervisor task ends when reconnecting gave up (asyncio.wait leaves it be)
            await asyncio.wait([self._task, up], return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()

    async def attach(self, endpoint: Endpoint | str, *, options: Iterable[Option] = ()) -> int:
        """Attach as `endpoint` (re-attached on every reconnection until `terminate`); return
        the transaction-identifier, which stays valid across reconnections."""
        target = Endpoint.parse(endpoint) if isinstance(endpoint, str) else endpoint
        chosen = tuple(options)
        trans_id = next(self._trans_ids)
        client = await self._client()
        await client.attach(target, options=chosen, trans_id=trans_id)
        self._attachments[trans_id] = _Attachment(target, chosen)
        return trans_id

    async def terminate(self, trans_id: int = 0) -> None:
        """Release one attachment (0: all of them); nothing is re-attached after that."""
        if trans_id:
            self._attachments.pop(trans_id, None)
        else:
            self._attachments.clear()
        client = self._current
        if client is not None and self._up.is_set():
            await client.terminate(trans_id)
        # while disconnected there is nothing to release: the new session will not re-attach

    async def send(self, originator: Endpoint | str, recipients: Iterable[Endpoint | str],
                   content: bytes, content_type: str = "application/octet-stream", *,
                   options: Iterable[Option] = ()) -> None:
        """`ApexClient.send`. Raises `ServiceNotAvailable` if the connection is lost while the
        data is on its way (it is not sent again: see the module docstring), or if no
        connection comes back within `timeout`."""
        client = await self._client()
        await client.send(originator, recipients, content, content_type, options=options)

    def deliver_to(self, callback: Callable[[Data | None], None]) -> None:
        """As `ApexClient.deliver_to`, across reconnections: None once `close()` or giving up
        ended them."""
        self._outlet.deliver_to(callback)

    def receive(self) -> AsyncIterator[Data]:
        """The data the relay delivers to us, across reconnections, until `close()` or until
        reconnecting gives up."""
        return self._outlet.receive()

    async def close(self) -> None:
        """Stop reconnecting, release the session (best effort) and close the transport."""
        self._closing = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._drop_current()

    async def __aenter__(self) -> ReconnectingApexClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # --- the supervisor -----------------------------------------------------------------

    async def _supervise(self) -> None:
        error: ServiceNotAvailable | None = None
        try:
            while (client := self._current) is not None:
                # Each data goes on from the connection's read loop (no task switch here); this
                # task only waits for the connection's end.
                ended = asyncio.Event()
                client.deliver_to(functools.partial(self._from_connection, ended))
                await ended.wait()
                self._up.clear()
                self.disconnects += 1
                reason = "the relay closed the session or the connection dropped"
                log.warning("apex connection lost", server=self.server, reason=reason,
                            attached=[str(e) for e in self.attached])
                self._listeners.emit(Disconnected(reason))
                await self._drop_current()
                try:
                    await self._reconnect()
                except ServiceNotAvailable as exc:
                    error = exc
                    return
        finally:
            self._final = error or ServiceNotAvailable("the client was closed")
            self._up.clear()
            self._outlet.put(None)
            self._listeners.emit(Closed(error))
            if error is not None:
                log.error("apex reconnect gave up", server=self.server, error=str(error))

    def _from_connection(self, ended: asyncio.Event, data: Data | None) -> None:
        if data is None:
            ended.set()
        else:
            self._outlet.put(data)

    async def _drop_current(self) -> None:
        client, self._current = self._current, None
        if client is not None:
            await self._discard(client)

    @staticmethod
    async def _discard(client: ApexClient) -> None:
        client.on_terminate = None
        # a dead session's close ends at once: its read loop already queued SessionClosed
        with contextlib.suppress(ApexpsError, OSError, RuntimeError):
            await client.close()

    async def _reconnect(self) -> None:
        last = ""
        for attempt in itertools.count(1):
            if self.policy.max_attempts is not None and attempt > self.policy.max_attempts:
                raise ServiceNotAvailable(
                    f"could not reconnect to the relay at {self.server} in"
                    f" {self.policy.max_attempts} attempts (last: {last})")
            delay = self.policy.delay(attempt, self._rng)
            log.info("apex reconnect attempt", server=self.server, attempt=attempt,
                     delay=round(delay, 3))
            await asyncio.sleep(delay)
            try:
                client = await self._dial()
            except (ApexpsError, OSError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                log.info("apex reconnect failed", server=self.server, attempt=attempt,
                         error=last)
                continue
            try:
                attached, lost = await self._reattach(client)
            except (ApexpsError, OSError, TimeoutError) as exc:
                last = f"re-attach: {type(exc).__name__}: {exc}"
                log.info("apex reconnect failed", server=self.server, attempt=attempt,
                         error=last)
                await self._discard(client)
                continue
            except BaseException:  # close() cancelled us mid-way: do not leak the connection
                await self._discard(client)
                raise
            self._current = client
            client.on_terminate = self._terminated
            self._up.set()
            log.info("apex reconnected", server=self.server, attempts=attempt,
                     attached=[str(e) for e in attached],
                     lost=[f"{e}: {x.code} {x}" for e, x in lost])
            self._listeners.emit(Reconnected(attempt, attached, lost))
            return

    async def _reattach(self, client: ApexClient,
                        ) -> tuple[tuple[Endpoint, ...], tuple[tuple[Endpoint, ApexpsError], ...]]:
        """Attach `client` as everything we were; a retriable refusal fails the attempt."""
        attached: list[Endpoint] = []
        lost: list[tuple[Endpoint, ApexpsError]] = []
        for trans_id, attachment in sorted(self._attachments.items()):
            try:
                await client.attach(attachment.endpoint, trans_id=trans_id,
                                    options=_overriding(attachment.options))
            except ApexpsError as exc:
                if exc.retriable:
                    raise
                self._attachments.pop(trans_id, None)  # `terminate` may have come first
                lost.append((attachment.endpoint, exc))
                log.warning("apex re-attach refused", endpoint=str(attachment.endpoint),
                            code=int(exc.code), error=str(exc))
            else:
                attached.append(attachment.endpoint)
        return tuple(attached), tuple(lost)

    def _terminated(self, terminate: Terminate) -> None:
        if terminate.trans_id == 0:
            gone = list(self._attachments)
        else:
            gone = [terminate.trans_id] if terminate.trans_id in self._attachments else []
        for trans_id in gone:
            attachment = self._attachments.pop(trans_id)
            log.warning("apex attachment ended by the relay", endpoint=str(attachment.endpoint),
                        code=terminate.code, text=terminate.text)
            self._listeners.emit(Detached(attachment.endpoint, terminate.code, terminate.text))


_E = TypeVar("_E", Disconnected, Reconnected, Closed)


def _only(kind: type[_E], callback: Callable[[_E], None], event: ConnectionEvent) -> None:
    if isinstance(event, kind):
        callback(event)
