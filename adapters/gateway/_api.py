"""The gateway's HTTP vocabulary, sans-I/O: request bodies in, subscription operations out;
deliveries in, Server-Sent Events text out; broker refusals in, HTTP statuses out.

Theory of operation
-------------------
The P2PSIP draft's SubscribeGateway (§3.4, figure 6) translates another protocol's subscribe
into the notifier's own; here the other protocol is HTTP and the notifier is apex=pubsub. All of
that translation lives in this module as pure functions over plain values, so it is unit-tested
without a socket, a loop or a broker; `_feeds.py` acts on the results and `_app.py` is the thin
aiohttp shell.

A subscription names a topic, or a resource (the draft's own subscriptions, docs/event-binding.md):
`{"resource": "TOPIC/MESSAGE-ID", "events": ["modified", 32769], "expires": 600}` makes a watch
on the broker, and the stream carries its Notifies (event `notify`), numbered like any
delivery; the Notifies of all of a user's watches travel on that user's one link
(`_upstream.py`). `expires` may be "permanent"; the broker may shorten it (the answer says what
was granted).

`ReplayBuffer` is the rule that makes `Last-Event-ID` exact: every SSE event's id is the link
seq of its delivery on the subscription's own robust link, ids rise strictly, and a stream that
reconnects after id N gets every delivery after N (from the buffer, or from the broker by gap
fill for what the bounded buffer no longer holds) and nothing at or before N.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from common.errors import ApexpsError, ReplyCode

__all__ = [
    "DEFAULT_REPLAY",
    "Cancel",
    "HttpError",
    "ReplayBuffer",
    "Replayed",
    "SelectorClass",
    "SubscribeRequest",
    "WsRequest",
    "http_status",
    "parse_last_event_id",
    "parse_subscribe",
    "parse_ws",
    "sse_comment",
    "sse_end",
    "sse_event",
    "sse_reset",
]

#: Deliveries each subscription keeps for streams that reconnect: enough for a browser that
#: reconnects within seconds at hundreds of messages a second; older ones come by gap fill.
DEFAULT_REPLAY = 1024
#: Topic names as the broker accepts them are longer; a gateway client has no need for more.
MAX_TOPIC = 1024
MAX_SELECTOR = 64 * 1024
MAX_DURATION = 7 * 24 * 3600
DEFAULT_DURATION = 3600
_ID = re.compile(r"[0-9]{1,19}")


class SelectorClass(StrEnum):
    """The selector classes of content-based §6 (the broker compiles them)."""

    #: JMS message selector syntax
    JMS = "JMS"
    #: RFC 2254 LDAP filters
    LDAP = "RFC-2254"


@dataclass(frozen=True, slots=True)
class HttpError(Exception):
    """A refusal: its HTTP status, and the request field at fault when there is one."""

    status: int
    message: str
    field: str | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    """`POST /subscriptions` (or the WebSocket's `subscribe`), validated. With `resource`, a
    watch of that data item (`topic` is then the resource's topic)."""

    topic: str
    duration: int = DEFAULT_DURATION
    selector: str | None = None
    selector_class: SelectorClass = SelectorClass.JMS
    #: content-based §5.8: the topic's cached messages first, then live data
    cached: bool = False
    #: TOPIC/MESSAGE-ID: a resource watch (docs/event-binding.md)
    resource: str | None = None
    #: the watch's events (draft §4.1.1 codes)
    events: frozenset[int] = frozenset()
    #: the watch's Expires in seconds (0xffffffff: permanent)
    expires: int = DEFAULT_DURATION


@dataclass(frozen=True, slots=True)
class Cancel:
    """The WebSocket's `cancel`."""

    id: str


WsRequest = SubscribeRequest | Cancel

_RESOURCE = ("resource", "events", "expires")
_KNOWN = {"topic", "duration", "selector", "class", "cached", *_RESOURCE}
#: Event names a client may use for the draft's three (§4.1.1); others are numbers.
EVENT_NAMES = {"created": 1, "modified": 2, "deleted": 3}
PERMANENT = 0xFFFF_FFFF
MAX_EVENTS = 64


def _field(body: Mapping[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = body.get(name, default)
    # bool is an int: a duration of `true` is not 1 second
    if value is not default and (not isinstance(value, kind)
                                 or (kind is int and isinstance(value, bool))):
        raise HttpError(400, f"{name} must be a {kind.__name__}", name)
    return value


def parse_subscribe(body: object) -> SubscribeRequest:
    """A subscribe request from decoded JSON; `HttpError` 400 names the bad field."""
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    for name in body:
        if name not in _KNOWN and name != "op":
            raise HttpError(400, f"unknown field {name!r}", str(name))
    if "resource" in body:
        return _resource_request(body)
    for name in _RESOURCE:
        if name in body:
            raise HttpError(400, f"{name} goes with resource", name)
    topic = _field(body, "topic", str)
    if topic is None:
        raise HttpError(400, "topic is required", "topic")
    if not topic or len(topic) > MAX_TOPIC or any(c in topic for c in "@/ \t\r\n"):
        raise HttpError(400, f"topic must be 1..{MAX_TOPIC} characters without '@', '/' or"
                             " white space", "topic")
    duration = _field(body, "duration", int, DEFAULT_DURATION)
    if not 1 <= duration <= MAX_DURATION:
        raise HttpError(400, f"duration is 1..{MAX_DURATION} seconds", "duration")
    selector = _field(body, "selector", str)
    if selector is not None and not 0 < len(selector) <= MAX_SELECTOR:
        raise HttpError(400, f"selector is 1..{MAX_SELECTOR} characters", "selector")
    klass = _field(body, "class", str, SelectorClass.JMS.value)
    try:
        selector_class = SelectorClass(klass.upper())
    except ValueError:
        raise HttpError(400, f"class is one of {', '.join(c.value for c in SelectorClass)}",
                        "class") from None
    cached = _field(body, "cached", bool, False)
    return SubscribeRequest(topic, duration, selector, selector_class, cached)


def _resource_request(body: Mapping[str, Any]) -> SubscribeRequest:
    """A resource watch: `resource`, `events` (names or numbers), `expires` (seconds or
    "permanent"); no topic, selector or cached (400 naming the field)."""
    for name in ("topic", "duration", "selector", "class", "cached"):
        if name in body:
            raise HttpError(400, f"{name} does not go with resource", name)
    resource = _field(body, "resource", str)
    topic, slash, mid = resource.partition("/")
    if not slash or not topic or not mid or len(resource) > MAX_TOPIC + 1025 or any(
            c in topic for c in "@ \t\r\n") or any(ord(c) < 32 for c in mid):
        raise HttpError(400, "resource is TOPIC/MESSAGE-ID", "resource")
    raw = body.get("events")
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_EVENTS:
        raise HttpError(400, f"events is a list of 1..{MAX_EVENTS} event names or codes",
                        "events")
    events = set()
    for item in raw:
        if isinstance(item, str) and item.lower() in EVENT_NAMES:
            events.add(EVENT_NAMES[item.lower()])
        elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= PERMANENT:
            events.add(item)
        else:
            raise HttpError(400, f"{str(item)[:40]!r} is not an event: created, modified,"
                                 " deleted or a code", "events")
    expires = body.get("expires", DEFAULT_DURATION)
    if expires == "permanent":
        expires = PERMANENT
    if not isinstance(expires, int) or isinstance(expires, bool) or not 1 <= expires <= PERMANENT:
        raise HttpError(400, "expires is 1..4294967295 seconds or \"permanent\"", "expires")
    return SubscribeRequest(topic, resource=resource, events=frozenset(events), expires=expires)


def parse_ws(text: str) -> WsRequest:
    """One WebSocket text message: `{"op": "subscribe", …}` or `{"op": "cancel", "id": …}`."""
    try:
        body = json.loads(text)
    except ValueError:
        raise HttpError(400, "not JSON") from None
    op = body.get("op") if isinstance(body, dict) else None
    if op == "subscribe":
        return parse_subscribe(body)
    if op == "cancel":
        ident = body.get("id")
        if not isinstance(ident, str) or not ident:
            raise HttpError(400, "id must be a subscription id", "id")
        return Cancel(ident)
    raise HttpError(400, "op is subscribe or cancel", "op")


def parse_last_event_id(value: str | None) -> int | None:
    """The `Last-Event-ID` header (or `?last-event-id=`): a link seq, or None for none."""
    if value is None or value == "":
        return None
    if not _ID.fullmatch(value):
        raise HttpError(400, "Last-Event-ID must be a link seq", "Last-Event-ID")
    return int(value)


#: Broker refusals as HTTP: the reply code's meaning kept, not a blanket 502.
_STATUS = {
    ReplyCode.NOT_TAKEN: 404,  # 550: no such topic
    ReplyCode.NOT_AUTHORIZED: 403,
    ReplyCode.AUTH_REQUIRED: 401,
    ReplyCode.AUTH_FAILURE: 401,
    ReplyCode.PARAMETER_INVALID: 400,
    ReplyCode.PARAMETER_SYNTAX_ERROR: 400,
    ReplyCode.UNSUPPORTED_SELECTOR_CLASS: 400,
    ReplyCode.INCORRECT_SELECTOR: 400,
    ReplyCode.UNKNOWN_SUBSCRIPTION: 404,
    ReplyCode.NOT_IMPLEMENTED: 501,
    ReplyCode.SERVICE_NOT_AVAILABLE: 503,
    ReplyCode.EVENT_NOT_UNDERSTOOD: 400,  # 571 (docs/event-binding.md §3.1)
    ReplyCode.EXPIRES_TOO_BRIEF: 400,  # 572, with min-expires in the text
    ReplyCode.TRANSACTION_FAILED: 429,  # 554: too many watches
}


#: The request field a broker refusal is about, where the code says.
_FIELD = {ReplyCode.UNSUPPORTED_SELECTOR_CLASS: "class",
          ReplyCode.INCORRECT_SELECTOR: "selector",
          ReplyCode.EVENT_NOT_UNDERSTOOD: "events",
          ReplyCode.EXPIRES_TOO_BRIEF: "expires"}


def http_status(exc: ApexpsError) -> HttpError:
    """The HTTP answer to a broker refusal, keeping its code and text."""
    status = _STATUS.get(exc.code, 503 if exc.retriable else 502)
    text = f"{int(exc.code)} {exc}"
    if (least := getattr(exc, "min_expires", None)) is not None:
        text += f" (min-expires {least})"
    return HttpError(status, text, _FIELD.get(exc.code))


def sse_event(seq: int, data: Mapping[str, Any], event: str = "message") -> bytes:
    """One SSE event whose id is `seq`; `data` as one line of JSON (no newline can split it)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    head = "" if event == "message" else f"event: {event}\n"
    return f"{head}id: {seq}\ndata: {text}\n\n".encode()


def sse_comment(text: str) -> bytes:
    """A comment line: keeps proxies and the browser's idea of the connection alive."""
    return f": {text.replace(chr(10), ' ')}\n\n".encode()


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a stream that reconnects after `after` is owed: first the link seqs
    `gap` (inclusive; None: nothing) from the broker, then `items` from the buffer."""

    gap: tuple[int, int] | None
    items: tuple[tuple[int, bytes], ...]


def sse_end(reason: str) -> bytes:
    """The event that ends a stream for good: the broker ended the subscription (expiry, the
    topic deleted). No id: a reconnect gets 404, and EventSource stops."""
    text = json.dumps({"end": True, "reason": reason}, separators=(",", ":"))
    return f"event: end\ndata: {text}\n\n".encode()


def sse_reset(epoch: int | None) -> bytes:
    """The event that ends a stream when its link was reset (a new epoch: link seqs start
    again). Its id is 0, the reset's own link seq (invariant 3: 0 only on reset), so the
    browser reconnects with Last-Event-ID 0 and gets the new epoch from its first seq."""
    text = json.dumps({"reset": True, "epoch": epoch}, separators=(",", ":"))
    return f"event: reset\nid: 0\ndata: {text}\n\n".encode()


class ReplayBuffer:
    """The last `size` deliveries of one subscription as (link seq, SSE bytes), seqs rising
    within one epoch of the link."""

    def __init__(self, size: int = DEFAULT_REPLAY) -> None:
        if size < 1:
            raise ValueError("a replay buffer holds at least one delivery")
        self._items: deque[tuple[int, bytes]] = deque(maxlen=size)
        #: the highest link seq that fell out of the buffer (0: none did)
        self.evicted = 0
        #: the link epoch the seqs belong to (None: not known yet)
        self.epoch: int | None = None

    def next_epoch(self, epoch: int | None) -> bool:
        """Note the epoch of the next delivery. A new one (the link was reset: robust-binding
        §5.3, seqs start again) empties the buffer and returns True: every stream of the old
        epoch must end with `sse_reset`, since its ids mean nothing in the new one."""
        if epoch == self.epoch or (self.epoch is None and not self._items):
            self.epoch = epoch
            return False
        self.epoch = epoch
        self._items.clear()
        self.evicted = 0
        return True

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return iter(self._items)

    @property
    def last(self) -> int:
        """The highest seq delivered so far (0: none)."""
        return self._items[-1][0] if self._items else self.evicted

    def add(self, seq: int, event: bytes) -> None:
        """Keep a delivery; its seq must rise (the robust link hands each once, in order)."""
        if seq <= self.last:
            raise ValueError(f"link seq {seq} after {self.last}: not rising")
        if len(self._items) == self._items.maxlen:
            self.evicted = self._items[0][0]
        self._items.append((seq, event))

    def since(self, after: int | None) -> Replayed:
        """What a stream that saw everything up to `after` is owed (None: a new stream, owed
        nothing from the past)."""
        if after is None:
            return Replayed(None, ())
        items = tuple(item for item in self._items if item[0] > after)
        gap = (after + 1, self.evicted) if after < self.evicted else None
        return Replayed(gap, items)
