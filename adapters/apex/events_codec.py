"""Resource event notification's vocabulary (docs/event-binding.md, docs/apexps-events.dtd) <->
dataclasses: `watch` (the draft's Subscribe, §4.1.1), `watchreply` (its answer, §4.1.2),
`notify` (§4.2.1) with its `version`s, and `decide` (an administrator's verdict on a pending
watch, §4.2.1, which the draft leaves to the notifier).

Parsed with the one hardened parser (`common.xml_safe`), as the other codecs: XML that does not
parse or is hostile is 500; XML that does not fit the DTD (unknown element or attribute, a
missing one, a number that is not one, an unknown state or reason) is 501; a resource, endpoint,
link id or topic that is not one is 553. Events the notifier does not understand are not the
codec's business: a well-formed event list with code 4 decodes, and the service answers 571, as
the draft's §3.3.1 b puts it. `decode_events` raises nothing but `ApexpsError`, whatever the
bytes. The dataclasses check their own invariants, so what `encode_events` writes decodes.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from lxml import etree

from broker.events import MAX_EVENT, Reason, Resource, State
from broker.names import validate_topic
from broker.records import PublishType
from broker.robust.linkid import validate_link_id
from common.errors import ApexpsError, InvalidParameter, ParameterSyntaxError, SyntaxError_
from common.xml_safe import UnsafeXml, checked_attributes, parse_hardened

from .endpoint import Endpoint

__all__ = [
    "EVENT_ELEMENTS",
    "MAX_EVENTS_XML",
    "Decision",
    "NotifyDoc",
    "Version",
    "WatchReply",
    "WatchRequest",
    "decode_events",
    "encode_events",
    "format_events",
]

#: A Notify carries a resource's image and deltas: as large as an item may be, in base64.
MAX_EVENTS_XML = 24 * 1024 * 1024
MAX_TRANS_ID = 2_147_483_647
MAX_SOURCE_SEQ = 2**63 - 1
#: A list names each event once; more than this many is hostile.
MAX_EVENT_CODES = 64
MAX_MESSAGE_ID_LEN = 1024
EVENT_ELEMENTS = frozenset({"watch", "watchreply", "notify", "decide"})
VERDICTS = ("approve", "reject")
_DIGITS = re.compile(r"[0-9]{1,20}")
_WATCH_ID = re.compile(r"[\w.:=/@+-]{1,256}")
_NO_CONTROL = re.compile(r"[^\x00-\x1f\x7f]+")
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"


def _bad(what: str) -> ParameterSyntaxError:
    return ParameterSyntaxError(what)


def _number(value: str, what: str, low: int, high: int) -> int:
    if not _DIGITS.fullmatch(value):
        raise _bad(f"{what} {value[:24]!r} is not an unsigned decimal number")
    number = int(value)
    if not low <= number <= high:
        raise _bad(f"{what} {number} is outside {low}..{high}")
    return number


def parse_events(text: str) -> frozenset[int]:
    """A space-separated event list: numbers 0..2^32-1 (501 otherwise); which are understood is
    the service's question (571)."""
    words = text.split(" ")
    if len(words) > MAX_EVENT_CODES:
        raise _bad(f"an event list names at most {MAX_EVENT_CODES} events")
    return frozenset(_number(w, "event", 0, MAX_EVENT) for w in words)


def format_events(events: frozenset[int]) -> str:
    return " ".join(str(e) for e in sorted(events))


def _resource(text: str) -> Resource:
    """TOPIC/MESSAGE-ID, 553 if the topic or message-id is not one."""
    res = Resource.parse(text)
    validate_topic(res.topic)
    if len(res.message_id) > MAX_MESSAGE_ID_LEN or not _NO_CONTROL.fullmatch(res.message_id):
        raise InvalidParameter(f"{res.message_id[:40]!r} is not a message-id")
    return res


def _watch_id(text: str) -> str:
    if not _WATCH_ID.fullmatch(text):
        raise _bad(f"id {text[:40]!r} is not a subscription id")
    return text


@dataclass(frozen=True, slots=True)
class WatchRequest:
    """The draft's SubscribeReq: create, refresh (the same resource and id), update (`update`
    'add' or 'remove' these events) or cancel (`expires` 0) a watch. `subscriber`: whom for
    (default the originator); `link`: the link its Notifies travel on (default the
    subscriber's endpoint link)."""

    resource: Resource
    watch_id: str
    expires: int
    events: frozenset[int]
    trans_id: int
    subscriber: Endpoint | None = None
    link: str | None = None
    update: str | None = None

    def __post_init__(self) -> None:
        _watch_id(self.watch_id)
        _number(str(self.expires), "expires", 0, MAX_EVENT)
        _number(str(self.trans_id), "transID", 1, MAX_TRANS_ID)
        if self.update not in (None, "add", "remove"):
            raise _bad("update is add or remove")
        if len(self.events) > MAX_EVENT_CODES:
            raise _bad(f"an event list names at most {MAX_EVENT_CODES} events")


@dataclass(frozen=True, slots=True)
class WatchReply:
    """The draft's SubscribeAns, or its error: `code` 250 with the granted `expires` and the
    watch's events, else the refusal (550, 571, 572 with `min_expires`, 537, 553, 568, 554)."""

    code: int
    trans_id: int
    resource: Resource | None = None
    watch_id: str | None = None
    expires: int | None = None
    events: frozenset[int] = frozenset()
    min_expires: int | None = None
    text: str = ""

    def exception(self) -> ApexpsError | None:
        if self.code == 250:
            return None
        exc = ApexpsError.for_code(self.code, self.text or None)
        if self.min_expires is not None:
            exc.min_expires = self.min_expires  # type: ignore[attr-defined]
        return exc


@dataclass(frozen=True, slots=True)
class Version:
    """One image or delta of a resource, or the message that caused a Notify."""

    source: str
    source_seq: int
    publish_type: PublishType
    content_type: str
    content: bytes


@dataclass(frozen=True, slots=True)
class NotifyDoc:
    """The draft's NotifyReq: about watch `watch_id` of `subscriber` on `resource`, its state,
    the reason if terminated, the events that caused it, the seconds left (`expires`), and
    whether `versions` are the resource's current state (`current`) or what caused it."""

    resource: Resource
    watch_id: str
    subscriber: str
    state: State
    reason: Reason | None = None
    events: frozenset[int] = frozenset()
    expires: int | None = None
    current: bool = False
    versions: tuple[Version, ...] = ()

    def __post_init__(self) -> None:
        if (self.reason is None) != (self.state is not State.TERMINATED):
            raise _bad("a reason goes with state terminated, and only with it")


@dataclass(frozen=True, slots=True)
class Decision:
    """An administrator approves (`approve` True) or rejects a pending watch: `watch_id` of
    `subscriber` on `resource`. Answered on the data itself: `ok`, or the refusal (550 no such
    pending watch, 537 the originator may not decide for the topic)."""

    resource: Resource
    subscriber: Endpoint
    watch_id: str
    approve: bool

    def __post_init__(self) -> None:
        _watch_id(self.watch_id)


EventDocument = WatchRequest | WatchReply | NotifyDoc | Decision


def _attrs(elem: etree._Element, allowed: set[str], required: set[str]) -> dict[str, str]:
    return checked_attributes(elem, allowed, required, _bad)


def _empty(elem: etree._Element) -> None:
    if len(elem) or (elem.text or "").strip():
        raise _bad(f"<{elem.tag}> is empty by the DTD")


def decode_events(content: bytes) -> EventDocument:
    """Parse one event document; 500/501/553 as the module docstring says."""
    try:
        root = parse_hardened(content, max_bytes=MAX_EVENTS_XML, max_depth=3,
                              what="event document")
    except UnsafeXml as exc:
        raise SyntaxError_(str(exc)) from None
    except (RecursionError, MemoryError, UnicodeError) as exc:
        raise SyntaxError_(f"undecodable event document: {type(exc).__name__}") from None
    tag = root.tag
    if tag == "watch":
        _empty(root)
        a = _attrs(root, {"resource", "id", "expires", "events", "transID", "subscriber",
                          "link", "update"}, {"resource", "id", "expires", "events", "transID"})
        return WatchRequest(
            _resource(a["resource"]), _watch_id(a["id"]),
            _number(a["expires"], "expires", 0, MAX_EVENT), parse_events(a["events"]),
            _number(a["transID"], "transID", 1, MAX_TRANS_ID),
            Endpoint.parse(a["subscriber"]) if "subscriber" in a else None,
            validate_link_id(a["link"]) if "link" in a else None, a.get("update"))
    if tag == "watchreply":
        if len(root):
            raise _bad("<watchreply> holds text only")
        a = _attrs(root, {"code", "transID", "resource", "id", "expires", "events",
                          "min-expires", _XML_LANG}, {"code", "transID"})
        return WatchReply(
            _number(a["code"], "code", 100, 999), _number(a["transID"], "transID", 1,
                                                          MAX_TRANS_ID),
            _resource(a["resource"]) if "resource" in a else None,
            _watch_id(a["id"]) if "id" in a else None,
            _number(a["expires"], "expires", 0, MAX_EVENT) if "expires" in a else None,
            parse_events(a["events"]) if "events" in a else frozenset(),
            _number(a["min-expires"], "min-expires", 0, MAX_EVENT)
            if "min-expires" in a else None, (root.text or "").strip())
    if tag == "notify":
        return _notify(root)
    if tag == "decide":
        _empty(root)
        a = _attrs(root, {"resource", "subscriber", "id", "verdict"},
                   {"resource", "subscriber", "id", "verdict"})
        if a["verdict"] not in VERDICTS:
            raise _bad("verdict is approve or reject")
        return Decision(_resource(a["resource"]), Endpoint.parse(a["subscriber"]),
                        _watch_id(a["id"]), a["verdict"] == "approve")
    raise _bad(f"<{str(tag)[:40]}> is not an event document")


def _notify(root: etree._Element) -> NotifyDoc:
    if (root.text or "").strip():
        raise _bad("<notify> holds <version>s only")
    a = _attrs(root, {"resource", "id", "subscriber", "state", "reason", "events", "expires",
                      "current"}, {"resource", "id", "subscriber", "state"})
    try:
        state = State(a["state"])
        reason = Reason(a["reason"]) if "reason" in a else None
    except ValueError:
        raise _bad("state or reason is not one of the DTD's") from None
    if a.get("current", "false") not in ("true", "false"):
        raise _bad("current is true or false")
    versions = []
    for child in root:
        if child.tag != "version" or len(child) or (child.tail or "").strip():
            raise _bad("<notify> holds <version>s only")
        v = _attrs(child, {"source", "sourceseq", "type", "content-type"},
                   {"source", "sourceseq", "type", "content-type"})
        try:
            ptype = PublishType(v["type"])
            body = base64.b64decode((child.text or "").strip(), validate=True)
        except (ValueError, binascii.Error):
            raise _bad("a <version>'s type or base64 content is not one") from None
        versions.append(Version(str(Endpoint.parse(v["source"])),
                                _number(v["sourceseq"], "sourceseq", 1, MAX_SOURCE_SEQ), ptype,
                                v["content-type"], body))
    return NotifyDoc(_resource(a["resource"]), _watch_id(a["id"]),
                     str(Endpoint.parse(a["subscriber"])), state, reason,
                     parse_events(a["events"]) if "events" in a else frozenset(),
                     _number(a["expires"], "expires", 0, MAX_EVENT) if "expires" in a else None,
                     a.get("current") == "true", tuple(versions))


def _esc(value: str) -> str:
    return (value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("'", "&apos;").replace('"', "&quot;"))


def _a(name: str, value: object) -> str:
    return "" if value is None else f" {name}='{_esc(str(value))}'"


def encode_events(doc: EventDocument) -> bytes:
    if isinstance(doc, WatchRequest):
        return (f"<watch{_a('resource', doc.resource)}{_a('id', doc.watch_id)}"
                f"{_a('expires', doc.expires)}{_a('events', format_events(doc.events))}"
                f"{_a('transID', doc.trans_id)}{_a('subscriber', doc.subscriber)}"
                f"{_a('link', doc.link)}{_a('update', doc.update)} />").encode()
    if isinstance(doc, WatchReply):
        return (f"<watchreply{_a('code', doc.code)}{_a('transID', doc.trans_id)}"
                f"{_a('resource', doc.resource)}{_a('id', doc.watch_id)}"
                f"{_a('expires', doc.expires)}"
                f"{_a('events', format_events(doc.events) if doc.events else None)}"
                f"{_a('min-expires', doc.min_expires)}>{_esc(doc.text)}</watchreply>").encode()
    if isinstance(doc, Decision):
        return (f"<decide{_a('resource', doc.resource)}{_a('subscriber', doc.subscriber)}"
                f"{_a('id', doc.watch_id)}"
                f"{_a('verdict', VERDICTS[0] if doc.approve else VERDICTS[1])} />").encode()
    versions = "".join(
        f"<version{_a('source', v.source)}{_a('sourceseq', v.source_seq)}"
        f"{_a('type', v.publish_type)}{_a('content-type', v.content_type)}>"
        f"{base64.b64encode(v.content).decode()}</version>" for v in doc.versions)
    return (f"<notify{_a('resource', doc.resource)}{_a('id', doc.watch_id)}"
            f"{_a('subscriber', doc.subscriber)}{_a('state', doc.state)}"
            f"{_a('reason', doc.reason)}"
            f"{_a('events', format_events(doc.events) if doc.events else None)}"
            f"{_a('expires', doc.expires)}{_a('current', 'true' if doc.current else None)}>"
            f"{versions}</notify>").encode()
