"""The endpoint-relay core (RFC 3340 §4.4 and §4.5.1), without I/O.

Theory of operation
-------------------
The relay serves one administrative domain. Each APEX channel an application opened is a
`ChannelRef` (the shell's session number and the BEEP channel number); the relay keeps which
endpoints are attached through which channel, under which transaction-identifier.
`Relay.handle(ref, operation)` applies one received `attach`, `bind`, `terminate` or `data` and
returns an `Outcome`: the reply for the sender and the `Delivery`s (data or terminate elements to
send on other channels) the operation caused. The shell performs them; nothing here awaits,
logs or touches a socket, so every rule below is a plain unit test.

Data to a well-known endpoint registered with `register_service("apex=pubsub", handler)` (or any
subaddress of it, "apex=pubsub/equity.quote@domain") goes to the handler, which may answer with
data of its own; that is routed like any other data. A handler that must wait (the pubsub
service answers `ok` only once Kafka holds the message) returns an awaitable instead: the
`Outcome` then carries a `Pending`, and the shell awaits `pending.settle()` (or, without a
task, has `pending.settle_then(callback)` call it back) for the final reply and the answers'
deliveries. The handler has done its synchronous part (e.g. taken the message's place in the
journal) before `handle` returns, so the order in which a channel's messages were received is
the order they take effect, however long each waits. Services also
speak unprompted (fan-out, expiry notices): `route(data)` returns the deliveries for that.

Relay-relay mode (§4.4.2, §4.5.2): another relay binds on a channel for its domain (the
`may_bind(ref, domain)` policy decides; by default nobody may), and that channel becomes a route
to the domain; the shell adds routes of its own for links it opened (`add_route`). Data arriving
on such a channel is accepted when its originator is in a domain the channel speaks for; data
for a recipient in another domain goes out over a route to that domain. Without a route the
recipient fails with 550, and data is never sent back on the channel it arrived on (one hop of
transit is all apexps does; a ping-pong between two relays would otherwise never end).

Choices the RFC leaves open (see the report in the commit log):

* a relay may not bind for our own domain (its endpoints are ours to attach), whatever the
  policy says: that would let a peer originate as our local endpoints;
* when several channels route to one domain, the newest wins (an older one is usually a link
  that is about to be noticed dead);
* RFC 3342's options (`_options`, `_party`): dataHopping and dataTiming are applied whatever
  their targetHop says (the RFC requires 'all'; a loop guard that a wrong attribute switches
  off helps nobody); a final-hop report goes out whenever returnTrip is non-zero;
* hold4Endpoint needs a `HoldStore` (`holds`): without one it is not served. Held data is
  delivered at least once: released only on the recipient's `ok`, held again on its `error`
  or when its session ends first; an originator over the store's cap fails that recipient
  with 554 (a policy refusal: "transaction failed"), not 550, so the sender can tell "nobody
  there" from "you have too much waiting".
* §4.4.4.1 returns `ok` before recipients are processed; since local processing here is
  immediate, a data none of whose recipients can be reached is answered with the error instead
  (550), unless the originator asked for a statusRequest, which then reports per recipient;
* a subaddress with no attachment of its own is delivered to its base endpoint's attachment.

Why one module of this length: attach, bind, terminate and data share one table of who is
attached where; each rule is a short method beside the others it interacts with, and the
RFC 3342 options it honours are in `options.py` and `_party.py`. Past 700 lines since the
publications of a batch settle together: `Pending` answers them in the one pass their
`Ticket`s are settled in (ticket.py holds the ticket itself), which is the relay's own rule
about when a data is answered, so it stays beside the other rules.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol

from broker.holds import HeldData
from broker.names import REPORT_SERVICE
from common.errors import (
    AccessDenied,
    ApexpsError,
    AttachmentOverridden,
    InvalidParameter,
    NotTaken,
    OptionNotImplemented,
    TransactionFailed,
)
from common.errors import TransactionInProgress as InProgress

from ._party import (
    Watch,
    elapsed_ms,
    expiry_reports,
    held_item,
    holds_requested,
    next_relay_hop,
    status_report,
    timing_left,
    unhold,
    watch_delivery,
)
from .codec import (
    Attach,
    Bind,
    Data,
    Error,
    Ok,
    Operation,
    Option,
    TargetHop,
    Terminate,
)
from .endpoint import Endpoint
from .options import DATA_HOPPING, DATA_TIMING, HOLD_FOR_ENDPOINT, validate_options
from .ticket import Ticket

__all__ = [
    "ATTACH_OVERRIDE",
    "REPORT_SERVICE",
    "STATUS_REQUEST",
    "ChannelRef",
    "Delivery",
    "HoldStore",
    "Outcome",
    "Pending",
    "Relay",
    "ServiceHandler",
    "ServiceResult",
]

#: RFC 3340 §5.1: ask each applicable relay for a statusResponse.
STATUS_REQUEST = "statusRequest"
#: RFC 3342 §2: a newer attach takes the endpoint over from an older one.
ATTACH_OVERRIDE = "attachOverride"


class ChannelRef(NamedTuple):
    """One APEX channel of one BEEP session, as the shell numbers them."""

    session: int
    channel: int


#: What a service answers: the data it sends in response, now or once an awaitable resolves.
ServiceResult = Iterable[Data] | Awaitable[Iterable[Data]]


class ServiceHandler(Protocol):
    """An APEX service living at a well-known endpoint (RFC 3340 §6), e.g. the pubsub service.

    `on_data` gets the data addressed to `recipient` (the service's endpoint or a subaddress of
    it) and returns the data it sends in response, if any, or an awaitable of it; raising an
    `ApexpsError` (directly or from the awaitable) fails that recipient with the error's code.
    """

    def on_data(self, data: Data, recipient: Endpoint) -> ServiceResult: ...


@dataclass(frozen=True, slots=True)
class Delivery:
    """Send `operation` (a `Data`, or a `Terminate` telling an application it lost an
    attachment) as a MSG on channel `target`."""

    target: ChannelRef
    operation: Data | Terminate
    #: for data to an application: what to do about its reply (RFC 3342 dataTiming and
    #: hold4Endpoint); the shell times it from when the MSG goes out
    watch: Watch | None = None


class HoldStore(Protocol):
    """Where data for absent endpoints waits (RFC 3342 §3); `broker.holds.KafkaHolds` keeps it
    in Kafka. `hold` and `release` start their write at once and return its future."""

    def hold(self, item: HeldData) -> Awaitable[None]:
        """Keep `item`; raise `ApexpsError` (554: over the originator's cap) before writing."""
        ...

    def take(self, endpoint: str, *, base: bool) -> list[HeldData]:
        """Waiting data for `endpoint` (and, with `base`, its subaddresses), now out."""
        ...

    def release(self, hold_id: str) -> Awaitable[None]: ...

    def requeue(self, hold_id: str) -> HeldData | None:
        """Data out for delivery waits again (returned, if still held)."""
        ...

    def expired(self, now_ms: int) -> list[HeldData]:
        """Waiting data past its deadline, now out: the caller reports and releases."""
        ...

    def late(self, now_ms: int) -> list[HeldData]:
        """Waiting data past its report time, each once."""
        ...

    def next_due(self) -> int | None:
        """The next deadline or report time (epoch ms), for the shell's timer."""
        ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one operation produced: the reply to its sender, and deliveries to make.

    With `pending` set, `reply` is provisional: services are still at work, and
    `await pending.settle()` gives the final reply and their deliveries.
    """

    reply: Ok | Error
    deliveries: tuple[Delivery, ...] = ()
    pending: Pending | None = None


@dataclass(slots=True)
class Pending:
    """Service calls of one data operation that are still running (see the module docstring)."""

    relay: Relay
    ref: ChannelRef
    data: Data
    statuses: list[tuple[Endpoint, int, str]]
    calls: list[tuple[int, Awaitable[Iterable[Data]]]]

    async def settle(self) -> Outcome:
        """`settle_then`, awaited: the final outcome, or what settling raised."""
        settled: asyncio.Future[Outcome | BaseException] = \
            asyncio.get_running_loop().create_future()
        self.settle_then(settled.set_result)
        result = await settled
        if isinstance(result, BaseException):
            raise result
        return result

    def settle_then(self, done: Callable[[Outcome | BaseException], None]) -> None:
        """`settle()` without a task: `done(outcome)` runs on the event loop once every call
        has finished (`done(exc)` where settling raised). The server takes every data this
        way: a task and a gather per publication cost more than the rest of its reply.
        A single call that is a `Ticket` (a publication) is not made a future at all: `done`
        runs in the same pass as the ticket's batch settles (ticket.py)."""
        if len(self.calls) == 1 and type(self.calls[0][1]) is Ticket:
            self.calls[0][1].then(functools.partial(self._finish_then, done))
            return
        futures = [asyncio.ensure_future(call) for _, call in self.calls]
        left = len(futures)

        def finished(_: asyncio.Future[Iterable[Data]]) -> None:
            nonlocal left
            left -= 1
            if left:
                return
            results: list[Iterable[Data] | BaseException] = []
            for f in futures:
                if f.cancelled():
                    results.append(asyncio.CancelledError())
                else:
                    exc = f.exception()
                    results.append(f.result() if exc is None else exc)
            try:
                outcome = self._finish(results)
            except BaseException as exc:  # handed on: the caller answers for it
                done(exc)
                return
            done(outcome)

        for future in futures:
            future.add_done_callback(finished)

    def _finish_then(self, done: Callable[[Outcome | BaseException], None],
                     result: Iterable[Data] | BaseException) -> None:
        try:
            outcome = self._finish([result])
        except BaseException as exc:  # handed on: the caller answers for it
            done(exc)
            return
        done(outcome)

    def _finish(self, results: list[Iterable[Data] | BaseException]) -> Outcome:
        deliveries: list[Delivery] = []
        for (index, _), result in zip(self.calls, results, strict=True):
            who = self.statuses[index][0]
            if isinstance(result, ApexpsError):
                self.statuses[index] = (who, int(result.code), str(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                deliveries += self.relay.route_all(result)
        return self.relay.finish(self.ref, self.data, self.statuses, deliveries)


@dataclass(slots=True)
class _Attachment:
    ref: ChannelRef
    trans_id: int


#: The reply to nearly every data: one shared instance (replies are frozen values).
_OK = Ok()
#: ... and the outcome of a data that is answered ok with nothing to deliver (a service's).
_OK_ONLY = Outcome(_OK)


def _has_options(data: Data) -> bool:
    """Whether `data` carries any option at all; most carry none, and skip option handling."""
    return bool(data.options or data.originator_options or data.recipient_options)


#: The default bind policy (§4.5.2 "local provisioning"): no relay may bind until configured.
def _default_may_bind(ref: ChannelRef, domain: str) -> bool:
    return False


#: The default attach policy (§4.5.1 is the access service's business; apexps has none yet):
#: anyone may attach as any ordinary endpoint, nobody as a well-known one.
def _default_may_attach(ref: ChannelRef, endpoint: Endpoint) -> bool:
    return not endpoint.is_well_known


@dataclass(slots=True)
class Relay:
    """The relay of `domain`; `may_attach(ref, endpoint)` is the §4.5.1 attach policy,
    `may_bind(ref, domain)` the §4.5.2 one for relays binding on behalf of `domain`."""

    domain: str
    may_attach: Callable[[ChannelRef, Endpoint], bool] = _default_may_attach
    may_bind: Callable[[ChannelRef, str], bool] = _default_may_bind
    understood: frozenset[str] = frozenset({STATUS_REQUEST, ATTACH_OVERRIDE, DATA_HOPPING,
                                            DATA_TIMING, HOLD_FOR_ENDPOINT})
    #: where hold4Endpoint data waits; without one, hold4Endpoint is not served (504 when it
    #: must be understood, otherwise the recipient fails as if the option were absent)
    holds: HoldStore | None = None
    #: wall-clock seconds (time.time): dataTiming's per-hop time and hold deadlines
    clock: Callable[[], float] = time.time
    _attached: dict[Endpoint, _Attachment] = field(default_factory=dict)
    _by_channel: dict[ChannelRef, dict[int, Endpoint]] = field(default_factory=dict)
    _services: dict[str, ServiceHandler] = field(default_factory=dict)
    #: per channel, the domains bound on it by transID (§4.4.2)
    _bindings: dict[ChannelRef, dict[int, str]] = field(default_factory=dict)
    #: per domain, the channels that reach its relay, oldest first
    _routes: dict[str, list[ChannelRef]] = field(default_factory=dict)
    #: reports (RFC 3342) made while processing, routed before the operation returns
    _reports: list[Data] = field(default_factory=list)
    _option_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.domain = self.domain.lower()

    # --- observation / registration ----------------------------------------------------

    def attachments(self, ref: ChannelRef) -> dict[int, Endpoint]:
        """The endpoints attached through `ref`, by transaction-identifier."""
        return dict(self._by_channel.get(ref, {}))

    def register_service(self, name: str, handler: ServiceHandler) -> None:
        """Serve the well-known endpoint `name@domain` (e.g. "apex=pubsub") with `handler`."""
        endpoint = Endpoint.parse(f"{name}@{self.domain}")
        if not endpoint.is_well_known or endpoint.subaddress is not None:
            raise InvalidParameter(f"{name!r} is not a well-known endpoint (apex=...)")
        self._services[endpoint.address] = handler

    def bindings(self, ref: ChannelRef) -> dict[int, str]:
        """The domains bound through `ref`, by transaction-identifier."""
        return dict(self._bindings.get(ref, {}))

    def routes(self) -> dict[str, tuple[ChannelRef, ...]]:
        """Every domain we can reach, with the channels that lead there (newest last)."""
        return {domain: tuple(refs) for domain, refs in self._routes.items()}

    def add_route(self, domain: str, ref: ChannelRef) -> None:
        """Data for `domain` may go out on `ref`, and data arriving on `ref` may originate in
        `domain`: the shell opened this link to that domain's relay itself."""
        domain = domain.lower()
        if domain == self.domain:
            raise InvalidParameter(f"{domain} is this relay's own domain")
        refs = self._routes.setdefault(domain, [])
        if ref in refs:
            refs.remove(ref)
        refs.append(ref)

    def remove_route(self, domain: str, ref: ChannelRef) -> None:
        """Forget that `ref` leads to `domain` (unless a bind on it still says so)."""
        domain = domain.lower()
        if domain in self._bindings.get(ref, {}).values():
            return
        refs = self._routes.get(domain, [])
        if ref in refs:
            refs.remove(ref)
        if not refs:
            self._routes.pop(domain, None)

    def channel_closed(self, ref: ChannelRef) -> None:
        """The channel (or its session) is gone: its attachments, bindings and routes end
        (§6.1.1)."""
        for endpoint in self._by_channel.pop(ref, {}).values():
            self._attached.pop(endpoint, None)
        self._bindings.pop(ref, None)
        for domain in [d for d, refs in self._routes.items() if ref in refs]:
            self.remove_route(domain, ref)

    def _speaks_for(self, ref: ChannelRef, domain: str) -> bool:
        return ref in self._routes.get(domain, ())

    def _route_to(self, domain: str) -> ChannelRef | None:
        refs = self._routes.get(domain)
        return refs[-1] if refs else None

    # --- operations ------------------------------------------------------------------

    def handle(self, ref: ChannelRef, operation: Operation) -> Outcome:
        """Apply one operation received on `ref`; never raises `ApexpsError`."""
        try:
            if type(operation) is Data:  # nearly every operation
                return self._data(ref, operation)
            if isinstance(operation, Attach):
                return self._attach(ref, operation)
            if isinstance(operation, Bind):
                return self._bind(ref, operation)
            if isinstance(operation, Terminate):
                return self._terminate(ref, operation)
            if isinstance(operation, Data):
                return self._data(ref, operation)
            raise NotTaken(f"<{type(operation).__name__.lower()}> is a reply, not a request")
        except ApexpsError as exc:
            return Outcome(Error.from_exception(exc))

    def _check_options(self, options: Iterable[Option]) -> None:
        for option in options:
            served = option.name in self.understood and not (
                option.name == HOLD_FOR_ENDPOINT and self.holds is None)
            if option.must_understand and (option.external or not served):
                raise OptionNotImplemented(f"option {option.name[:80]!r} is not implemented")

    def _check_trans_id(self, ref: ChannelRef, trans_id: int) -> None:
        # §4.4.1 and §4.4.2 step 1: attachments and bindings share the channel's transIDs.
        if trans_id in self._by_channel.get(ref, {}) or trans_id in self._bindings.get(ref, {}):
            raise InProgress(f"transID {trans_id} is in force on this channel")

    def _bind(self, ref: ChannelRef, bind: Bind) -> Outcome:
        """§4.4.2: 555 for a transID in force, 537 unless the policy allows, options, ok."""
        self._check_trans_id(ref, bind.trans_id)
        domain = bind.relay.lower()
        if domain == self.domain or not self.may_bind(ref, domain):
            raise AccessDenied(f"not authorized to bind as a relay for {domain}")
        self._check_options(bind.options)
        self._bindings.setdefault(ref, {})[bind.trans_id] = domain
        self.add_route(domain, ref)
        return Outcome(Ok())

    def _attach(self, ref: ChannelRef, attach: Attach) -> Outcome:
        self._check_trans_id(ref, attach.trans_id)
        endpoint = attach.endpoint
        if endpoint.domain != self.domain:
            raise InvalidParameter(f"this relay serves {self.domain}, not {endpoint.domain}")
        if not self.may_attach(ref, endpoint):
            raise AccessDenied(f"not authorized to attach as {endpoint}")
        self._check_options(attach.options)
        deliveries: tuple[Delivery, ...] = ()
        current = self._attached.get(endpoint)
        if current is not None:
            if not any(o.name == ATTACH_OVERRIDE for o in attach.options):
                raise TransactionFailed(f"{endpoint} is already attached")
            self._detach(current.ref, current.trans_id)
            notice = AttachmentOverridden(f"{endpoint} attached elsewhere")
            deliveries = (Delivery(current.ref, Terminate(current.trans_id, int(notice.code),
                                                          str(notice))),)
        self._attached[endpoint] = _Attachment(ref, attach.trans_id)
        self._by_channel.setdefault(ref, {})[attach.trans_id] = endpoint
        return Outcome(Ok(), deliveries + tuple(self._unhold(endpoint, ref)))

    def _detach(self, ref: ChannelRef, trans_id: int) -> None:
        endpoint = self._by_channel.get(ref, {}).pop(trans_id, None)
        if endpoint is not None:
            self._attached.pop(endpoint, None)

    def _unbind(self, ref: ChannelRef, trans_id: int) -> None:
        domain = self._bindings.get(ref, {}).pop(trans_id, None)
        if domain is not None:
            self.remove_route(domain, ref)

    def _terminate(self, ref: ChannelRef, terminate: Terminate) -> Outcome:
        mine = self._by_channel.get(ref, {})
        bound = self._bindings.get(ref, {})
        if terminate.trans_id == 0:
            for trans_id in list(mine):
                self._detach(ref, trans_id)
            for trans_id in list(bound):
                self._unbind(ref, trans_id)
        elif terminate.trans_id in mine:
            self._detach(ref, terminate.trans_id)
        elif terminate.trans_id in bound:
            self._unbind(ref, terminate.trans_id)
        else:
            raise NotTaken("unknown transaction-identifier")
        return Outcome(Ok())

    def _may_originate(self, ref: ChannelRef, originator: Endpoint) -> bool:
        """§4.4.4.1 step 1 with §4.5.1 (the application attached as the originator) and
        §4.5.2 (a relay speaking for the originator's domain)."""
        origin = self._attached.get(originator)
        if origin is not None and origin.ref == ref:
            return True
        return originator.domain != self.domain and self._speaks_for(ref, originator.domain)

    def _data(self, ref: ChannelRef, data: Data) -> Outcome:
        received = self.clock()
        if not self._may_originate(ref, data.originator):
            raise AccessDenied(f"not attached as {data.originator} on this channel")
        if _has_options(data):
            self._check_options(data.options)
            self._check_options(data.originator_options)
            for index in range(len(data.recipients)):
                self._check_options(data.options_of(index))
            for group in (data.options, data.originator_options, *data.recipient_options):
                validate_options(group)  # 501 before any recipient is processed
        deliveries: list[Delivery] = []
        statuses: list[tuple[Endpoint, int, str]] = []
        calls: list[tuple[int, Awaitable[Iterable[Data]]]] = []
        single = len(data.recipients) == 1
        for index, recipient in enumerate(data.recipients):
            try:
                # most data has one recipient: it is its own single-recipient copy
                one = data if single else data.for_recipients([index])
                result = self._deliver(one, recipient, ref, received)
            except ApexpsError as exc:
                statuses.append((recipient, int(exc.code), str(exc)))
                continue
            statuses.append((recipient, 250, ""))
            if isinstance(result, list):
                deliveries += result
            else:
                calls.append((index, result))
        deliveries += self._drain_reports()
        if calls:
            return Outcome(Ok(), tuple(deliveries), Pending(self, ref, data, statuses, calls))
        return self.finish(ref, data, statuses, deliveries)

    def finish(self, ref: ChannelRef, data: Data, statuses: list[tuple[Endpoint, int, str]],
               deliveries: list[Delivery]) -> Outcome:
        """The reply to `data` once every recipient has a status (§4.4.4.1, §5.1)."""
        if not _has_options(data):  # no statusRequest to answer: the common case, kept short
            if all(code != 250 for _, code, _ in statuses):
                return Outcome(Error(statuses[0][1], statuses[0][2]), tuple(deliveries))
            return Outcome(_OK, tuple(deliveries)) if deliveries else _OK_ONLY
        requests = [o for o in data.options if o.name == STATUS_REQUEST]
        requests += [o for i in range(len(data.recipients)) for o in data.options_of(i)
                     if o.name == STATUS_REQUEST]
        # A 'final' statusRequest is the next relay's to answer for recipients we forwarded.
        if all(o.target_hop is TargetHop.FINAL for o in requests):
            shown = [s for s in statuses if s[1] != 250 or s[0].domain == self.domain]
        else:
            shown = statuses
        if requests and shown:
            trans_id = requests[0].trans_id or 0
            deliveries.append(Delivery(ref, self._report(data.originator, trans_id, shown)))
        elif not requests and all(code != 250 for _, code, _ in statuses):
            code, text = statuses[0][1], statuses[0][2]
            return Outcome(Error(code, text), tuple(deliveries))  # e.g. RFC 3342 reports
        return Outcome(Ok(), tuple(deliveries))

    def route(self, data: Data, received: float | None = None) -> list[Delivery]:
        """Deliveries for data a service sends on its own (best effort, RFC 3340 §5): a
        recipient that cannot be reached is skipped; a service recipient's own answers follow.

        `received` is when the data this answers arrived (`clock()` time), if the service
        wants dataTiming to count its processing time; options travel as the service set them
        (see `_options.spend_hop` for forwarding services). An awaitable a service recipient
        answers with is not waited for."""
        out: list[Delivery] = []
        alone = len(data.recipients) == 1  # a fan-out's data, nearly always: no copy needed
        for index, to in enumerate(data.recipients):
            with suppress(ApexpsError):
                result = self._deliver(data if alone else data.for_recipients([index]), to,
                                       None, received)
                if isinstance(result, list):
                    out += result
                elif inspect.iscoroutine(result):
                    result.close()  # never started; held data's write runs on regardless
        return out + self._drain_reports()

    def expire_held(self) -> list[Delivery]:
        """Held data whose report time or deadline passed (RFC 3342 §2-3): transient reports
        for the former, timing error reports and release for the latter. For the shell's
        timer (`holds.next_due()`)."""
        if self.holds is None:
            return []
        now_ms = int(self.clock() * 1000)
        for item in self.holds.late(now_ms):
            self._reports += expiry_reports(item, self.domain, 350)
        for item in self.holds.expired(now_ms):
            self._reports += expiry_reports(item, self.domain, 550)
            self.holds.release(item.hold_id)
        return self._drain_reports()

    def requeue_held(self, hold_id: str, *, redeliver: bool = True) -> list[Delivery]:
        """Held data whose delivery got no `ok` waits again; with `redeliver` (its recipient's
        session ended, not its recipient refusing it) it goes at once to whoever is attached
        as the recipient now, e.g. after an attachOverride."""
        if self.holds is None:
            return []
        item = self.holds.requeue(hold_id)
        if item is None or not redeliver:
            return []
        recipient = Endpoint.parse(item.recipient)
        for endpoint in (recipient, recipient.base):
            target = self._attached.get(endpoint)
            if target is not None:
                return self._unhold(endpoint, target.ref)
        return []

    def _drain_reports(self) -> list[Delivery]:
        out: list[Delivery] = []
        while self._reports:
            out += self.route(self._reports.pop(0))
        return out

    def route_all(self, answers: Iterable[Data]) -> list[Delivery]:
        out: list[Delivery] = []
        for answer in answers:
            out += self.route(answer)
        return out

    def _deliver(self, data: Data, recipient: Endpoint, came_from: ChannelRef | None = None,
                 received: float | None = None) -> list[Delivery] | Awaitable[Iterable[Data]]:
        """§4.4.4.1 step 5 for single-recipient `data`; raises `ApexpsError` if it fails."""
        if recipient.domain != self.domain:
            elapsed = elapsed_ms(received, self.clock())
            route = self._route_to(recipient.domain)
            if route is None or route == came_from:
                raise NotTaken(f"no route to {recipient.domain}")
            onward, reports = next_relay_hop(data, self.domain, elapsed)
            self._reports += reports
            if onward is None:
                raise NotTaken(f"not sent on to {recipient.domain}: dataHopping or dataTiming"
                               " limit reached")
            return [Delivery(route, _next_hop(onward))]
        service = self._services.get(recipient.address) if recipient.is_well_known else None
        if service is not None:
            result = service.on_data(data, recipient)
            if type(result) is tuple or type(result) is list:  # most services answer at once
                return self.route_all(result) if result else []
            if inspect.isawaitable(result):
                return result
            return self.route_all(result)
        plain = not _has_options(data)  # then there is no timing, hold or watch to weigh
        elapsed = 0 if plain else elapsed_ms(received, self.clock())
        if not plain:
            in_time, reports = timing_left(data, self.domain, elapsed)
            self._reports += reports
            if not in_time:
                raise NotTaken("dataTiming noLaterThan passed")
        target = self._attached.get(recipient) or self._attached.get(recipient.base)
        if target is None:
            if (not plain and self.holds is not None and holds_requested(data)
                    and not recipient.is_well_known):
                item = held_item(data, recipient, int(self.clock() * 1000), elapsed)
                return _written(self.holds.hold(item))
            raise NotTaken("unknown endpoint identity")
        if plain:
            return [Delivery(target.ref, data)]
        watch, reports = watch_delivery(data, self.domain, elapsed, self._next_option_id)
        self._reports += reports
        return [Delivery(target.ref, data, watch)]

    def _next_option_id(self) -> int:
        return next(self._option_ids)

    def _unhold(self, endpoint: Endpoint, ref: ChannelRef) -> list[Delivery]:
        """Held data for an application that just attached as `endpoint` (RFC 3342 §3)."""
        if self.holds is None:
            return []
        now_ms = int(self.clock() * 1000)
        out: list[Delivery] = []
        for item in self.holds.take(str(endpoint), base=endpoint.subaddress is None):
            try:
                data, reports = unhold(item, self.domain, now_ms)
            except ApexpsError:
                data, reports = None, []  # unreadable: nothing anybody could be given
            self._reports += reports
            if data is None:
                self.holds.release(item.hold_id)
                continue
            watch, reports = watch_delivery(data, self.domain, 0, self._next_option_id,
                                            item.hold_id)
            self._reports += reports
            out.append(Delivery(ref, data, watch))
        return out + self._drain_reports()

    def _report(self, originator: Endpoint, trans_id: int,
                statuses: list[tuple[Endpoint, int, str]]) -> Data:
        """A statusResponse (RFC 3340 §6.2, DTD §9.2) from apex=report to the originator."""
        return status_report(self.domain, originator, trans_id, statuses)


async def _written(write: Awaitable[None]) -> Iterable[Data]:
    """A hold as a service-like awaitable: no answers, done once the write is durable."""
    await write
    return ()


def _next_hop(data: Data) -> Data:
    """The data as the next relay gets it: options meant for this relay alone are removed
    (RFC 3340 §5, targetHop='this')."""
    def keep(options: tuple[Option, ...]) -> tuple[Option, ...]:
        return tuple(o for o in options if o.target_hop is not TargetHop.THIS)
    if not any(o.target_hop is TargetHop.THIS
               for group in (data.options, data.originator_options, *data.recipient_options)
               for o in group):
        return data
    return replace(data, options=keep(data.options),
                   originator_options=keep(data.originator_options),
                   recipient_options=tuple(keep(g) for g in data.recipient_options))
