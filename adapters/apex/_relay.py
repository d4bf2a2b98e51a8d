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
`Outcome` then carries a `Pending`, and the shell awaits `pending.settle()` for the final reply
and the answers' deliveries. The handler has done its synchronous part (e.g. taken the
message's place in the journal) before `handle` returns, so the order in which a channel's
messages were received is the order they take effect, however long each waits. Services also
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
* §4.4.4.1 returns `ok` before recipients are processed; since local processing here is
  immediate, a data none of whose recipients can be reached is answered with the error instead
  (550), unless the originator asked for a statusRequest, which then reports per recipient;
* a subaddress with no attachment of its own is delivered to its base endpoint's attachment.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Protocol

from broker.errors import AccessDenied, ApexpsError, InvalidParameter, NotTaken

from ._codec import (
    BEEP_XML,
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
from ._endpoint import Endpoint
from ._errors import AttachmentOverridden, OptionNotImplemented, TransactionFailed
from ._errors import TransactionInProgress as InProgress

__all__ = [
    "ATTACH_OVERRIDE",
    "REPORT_SERVICE",
    "STATUS_REQUEST",
    "ChannelRef",
    "Delivery",
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
#: RFC 3340 §6.2: the report service's well-known endpoint (local part).
REPORT_SERVICE = "apex=report"


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
        results = await asyncio.gather(*(call for _, call in self.calls), return_exceptions=True)
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
    understood: frozenset[str] = frozenset({STATUS_REQUEST, ATTACH_OVERRIDE})
    _attached: dict[Endpoint, _Attachment] = field(default_factory=dict)
    _by_channel: dict[ChannelRef, dict[int, Endpoint]] = field(default_factory=dict)
    _services: dict[str, ServiceHandler] = field(default_factory=dict)
    #: per channel, the domains bound on it by transID (§4.4.2)
    _bindings: dict[ChannelRef, dict[int, str]] = field(default_factory=dict)
    #: per domain, the channels that reach its relay, oldest first
    _routes: dict[str, list[ChannelRef]] = field(default_factory=dict)

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
            if option.must_understand and (option.external or option.name not in self.understood):
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
        return Outcome(Ok(), deliveries)

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
        if not self._may_originate(ref, data.originator):
            raise AccessDenied(f"not attached as {data.originator} on this channel")
        self._check_options(data.options)
        self._check_options(data.originator_options)
        for index in range(len(data.recipients)):
            self._check_options(data.options_of(index))
        deliveries: list[Delivery] = []
        statuses: list[tuple[Endpoint, int, str]] = []
        calls: list[tuple[int, Awaitable[Iterable[Data]]]] = []
        for index, recipient in enumerate(data.recipients):
            try:
                result = self._deliver(data.for_recipients([index]), recipient, ref)
            except ApexpsError as exc:
                statuses.append((recipient, int(exc.code), str(exc)))
                continue
            statuses.append((recipient, 250, ""))
            if isinstance(result, list):
                deliveries += result
            else:
                calls.append((index, result))
        if calls:
            return Outcome(Ok(), tuple(deliveries), Pending(self, ref, data, statuses, calls))
        return self.finish(ref, data, statuses, deliveries)

    def finish(self, ref: ChannelRef, data: Data, statuses: list[tuple[Endpoint, int, str]],
               deliveries: list[Delivery]) -> Outcome:
        """The reply to `data` once every recipient has a status (§4.4.4.1, §5.1)."""
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
            return Outcome(Error(code, text))
        return Outcome(Ok(), tuple(deliveries))

    def route(self, data: Data) -> list[Delivery]:
        """Deliveries for data a service sends on its own (best effort, RFC 3340 §5): a
        recipient that cannot be reached is skipped; a service recipient's own answers follow."""
        out: list[Delivery] = []
        for index, to in enumerate(data.recipients):
            with suppress(ApexpsError):
                result = self._deliver(data.for_recipients([index]), to)
                if isinstance(result, list):
                    out += result
        return out

    def route_all(self, answers: Iterable[Data]) -> list[Delivery]:
        out: list[Delivery] = []
        for answer in answers:
            out += self.route(answer)
        return out

    def _deliver(self, data: Data, recipient: Endpoint, came_from: ChannelRef | None = None,
                 ) -> list[Delivery] | Awaitable[Iterable[Data]]:
        if recipient.domain != self.domain:
            route = self._route_to(recipient.domain)
            if route is None or route == came_from:
                raise NotTaken(f"no route to {recipient.domain}")
            return [Delivery(route, _next_hop(data))]
        service = self._services.get(recipient.address) if recipient.is_well_known else None
        if service is not None:
            result = service.on_data(data, recipient)
            if inspect.isawaitable(result):
                return result
            return self.route_all(result)
        target = self._attached.get(recipient) or self._attached.get(recipient.base)
        if target is None:
            raise NotTaken("unknown endpoint identity")
        return [Delivery(target.ref, data)]

    def _report(self, originator: Endpoint, trans_id: int,
                statuses: list[tuple[Endpoint, int, str]]) -> Data:
        """A statusResponse (RFC 3340 §6.2, DTD §9.2) from apex=report to the originator."""
        def esc(text: str) -> str:
            return text.replace("&", "&amp;").replace("<", "&lt;").replace("'", "&apos;")
        rows = "".join(
            f"        <destination identity='{esc(str(who))}'>\r\n"
            f"            <reply code='{code}' transID='{trans_id}'"
            + (f">{esc(text)}</reply>\r\n" if text else " />\r\n")
            + "        </destination>\r\n"
            for who, code, text in statuses)
        xml = f"<statusResponse transID='{trans_id}'>\r\n{rows}    </statusResponse>"
        return Data(Endpoint(REPORT_SERVICE, self.domain), (originator,), xml.encode("utf-8"),
                    BEEP_XML, content_ref="#Content")


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
