"""Robust delivery's vocabulary (docs/robust-binding.md, docs/apexps-robust.dtd) <-> dataclasses.

Three kinds of thing travel:
- the publish option, an APEX option `apexps.publish` on data a publisher sends to
  `apex=pubsub/TOPIC@D`, holding one `<publish … />` (`PublishMeta`; `publish_option`,
  `find_publish_meta`): publish type, message-id, permission token, publisher seq;
- the sequence stamp, an APEX option `apexps.seq` in each recipient element of delivered data,
  holding one `<seq … />` (`Stamp`; `stamp_option`, `find_stamp`, `decode_stamp`);
- documents carried as data content: `heartbeat`, `linkreset` and `withheld` (what heartbeat,
  reset and withheld data hold), `gap`, `repair`, `capabilityquery`, `snapshot` and `pubstatus`
  (sent to `apex=pubsub@D`), `linkreply`, `capabilities` and `pubstatus` with a position (its
  answers) — `decode_robust`, `encode_robust`.

Parsed with the one hardened parser (`common.xml_safe`), as `_pubsub_codec` does: XML that does
not parse or is hostile is 500; XML that does not fit the DTD (unknown element or attribute,
missing attribute, a number that is not one) is 501; a link id, endpoint or topic that is not
one is 553, and so is a link seq that is negative or beyond 64 bits (`BadGapRange`) — the
resolution check proper (16/32 bits) is the link's, in `broker.robust.linkseq`. `decode_*`
raise nothing but `ApexpsError`, whatever the bytes.

The dataclasses check their own invariants (which attributes go with which stamp kind, number
ranges), so what `encode_*` writes always decodes. Encoding uses the drafts' layout (single
quotes, " />"). The stamp is built per delivery on the fan-out path, so its encoder is a plain
f-string and its constructor checks only what is cheap; `decode_stamp` checks everything.

Why one module of this length: it is one vocabulary. Every element shares the same limits,
attribute checkers and escaping, and each element's decoder sits beside its encoder so that
the two cannot drift; split by element, those checks would be scattered or duplicated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from lxml import etree

from broker.names import validate_topic
from broker.records import PublishType
from broker.robust.linkid import validate_link_id
from broker.robust.linkseq import SUPPORTED_BITS
from common.errors import (
    ApexpsError,
    BadGapRange,
    InvalidParameter,
    ParameterSyntaxError,
    SyntaxError_,
)
from common.xml_safe import UnsafeXml, checked_attributes, parse_hardened

from .codec import Option
from .endpoint import Endpoint

__all__ = [
    "MAX_BATCH_ITEMS",
    "MAX_LINK_SEQ",
    "MAX_REPAIR_SOURCES",
    "MAX_ROBUST_XML",
    "PUBLISH_OPTION",
    "ROBUST_ELEMENTS",
    "STAMP_OPTION",
    "Capabilities",
    "CapabilityQuery",
    "GapRequest",
    "Heartbeat",
    "LinkReply",
    "LinkReset",
    "PubStatus",
    "PubStatusQuery",
    "PublishMeta",
    "RepairRequest",
    "RobustDocument",
    "SnapshotRequest",
    "SourcePosition",
    "Stamp",
    "StampKind",
    "Withheld",
    "data_stamp_xml",
    "decode_robust",
    "decode_stamp",
    "document_element",
    "encode_robust",
    "encode_stamp",
    "find_publish_meta",
    "find_stamp",
    "publish_option",
    "stamp_element",
    "stamp_option",
    "varied_stamp",
]

#: The APEX option (internal name) that carries the stamp.
STAMP_OPTION = "apexps.seq"
#: The APEX option (internal name) a publisher puts on its data.
PUBLISH_OPTION = "apexps.publish"
#: The widest link seq of any resolution (64 bits).
MAX_LINK_SEQ = 2**64 - 1
#: Source seqs, epochs and times are Avro longs in the journal and the link log.
MAX_LONG = 2**63 - 1
MAX_TRANS_ID = 2_147_483_647
#: A repair names each source the subscriber has seen once; a desk sees hundreds. 4096 sources
#: of ordinary length fit well inside MAX_ROBUST_XML.
MAX_REPAIR_SOURCES = 4096
#: A repair's source list is the largest document here; 1 MiB as for pubsub documents.
MAX_ROBUST_XML = 1024 * 1024
#: A stamp is one empty element of a dozen attributes; endpoints cap its size.
MAX_STAMP_XML = 8 * 1024
#: Permission tokens and message-ids are short names; anything longer is not one.
MAX_TOKEN_LEN = 256
MAX_MESSAGE_ID_LEN = 1024
MAX_TEXT_LEN = 4096
MAX_SELECTOR_CLASSES = 64
#: Most items one `<batch>` may hold, and so the most a gap or repair request may ask for (§5.4).
MAX_BATCH_ITEMS = 4096

_DIGITS = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"-?[0-9]+")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}")
_NO_CONTROL = re.compile(r"[^\x00-\x1f\x7f]+")
#: A subscription id as a stamp's inre names it (the service's numbers; a topic name for a
#: subscription recorded before ids existed): no blank, quote or markup.
_SUBSCRIPTION_ID = re.compile(r"[\w.:=/@+-]{1,256}")
#: Subscription ids one inre names at most.
MAX_IN_RE = 1024
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
#: Digits beyond this are absurd for any number here; never build a huge int from them.
_MAX_DIGITS = 40


class StampKind(StrEnum):
    """What a link seq carried (the stamp's `kind`)."""

    #: a published message
    DATA = "data"
    #: a heartbeat: advances the link seq on an idle link
    HEARTBEAT = "heartbeat"
    #: link seq 0: a new epoch of the link begins
    RESET = "reset"
    #: a gap fill's stand-in for a message the subscriber is no longer entitled to (its
    #: permission token was denied since): the seq is consumed, nothing is delivered
    WITHHELD = "withheld"


def _bad(what: str) -> ParameterSyntaxError:
    return ParameterSyntaxError(what)


def _check_int(value: int, what: str, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise _bad(f"{what} {value!r} is outside {low}..{high}")


def _check_text(value: str, what: str, limit: int) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= limit \
            or not _NO_CONTROL.fullmatch(value):
        raise InvalidParameter(f"{what} has 1..{limit} characters and no control characters")


def _check_batch(batch: int | None) -> None:
    if batch is not None:
        _check_int(batch, "batch", 1, MAX_BATCH_ITEMS)


@dataclass(frozen=True, slots=True)
class Stamp:
    """The sequence stamp of one delivered data (docs/robust-binding.md §2).

    `link`, `epoch` and `link_seq` place it on the link; a DATA stamp also says which message
    it is (`source`, `source_seq`) and how to read it (`publish_type`, `topic`, `token`,
    `message_id`). `time` is the journal time (data) or a lower bound for what follows
    (heartbeat, reset); `refill` marks a gap-fill copy; `repair` is the transID of the source
    repair a reset answers; `snapshot` marks a data item's image or delta sent as state, not
    live traffic (§9).
    """

    link: str
    link_seq: int
    kind: StampKind = StampKind.DATA
    epoch: int = 0
    source: str | None = None
    source_seq: int | None = None
    publish_type: PublishType | None = None
    topic: str | None = None
    token: str | None = None
    message_id: str | None = None
    time: int | None = None
    refill: bool = False
    repair: int | None = None
    snapshot: bool = False
    #: a batch item's InRe (draft-content §5.10.1): the subscription ids the message
    #: satisfied; a single data carries them in its InRe option instead
    in_re: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_link_id(self.link)
        _check_int(self.link_seq, "linkseq", 0, MAX_LINK_SEQ)
        _check_int(self.epoch, "epoch", 0, MAX_LONG)
        if self.time is not None:
            _check_int(self.time, "time", 0, MAX_LONG)
        about = (self.source, self.source_seq, self.publish_type, self.topic, self.token,
                 self.message_id)
        if self.kind is StampKind.DATA:
            if self.source is None or self.source_seq is None or self.publish_type is None \
                    or self.topic is None:
                raise _bad("a data stamp names its source, sourceseq, type and topic")
            _check_int(self.source_seq, "sourceseq", 1, MAX_LONG)
            if self.token is not None:
                _check_text(self.token, "a permission token", MAX_TOKEN_LEN)
            if self.message_id is not None:
                _check_text(self.message_id, "a message-id", MAX_MESSAGE_ID_LEN)
            if self.link_seq == 0:
                raise _bad("link seq 0 is a reset; data starts at 1")
            if any(not isinstance(i, str) or not _SUBSCRIPTION_ID.fullmatch(i)
                   for i in self.in_re) or len(self.in_re) > MAX_IN_RE:
                raise _bad(f"inre holds up to {MAX_IN_RE} subscription ids")
        else:
            if any(v is not None for v in about) or self.in_re:
                raise _bad(f"a {self.kind} stamp carries no message attributes")
            if (self.kind is StampKind.RESET) != (self.link_seq == 0):
                raise _bad("link seq 0 is sent exactly on a reset")
        if self.repair is not None:
            if self.kind is not StampKind.RESET:
                raise _bad("only a reset answers a repair")
            _check_int(self.repair, "repair", 1, MAX_TRANS_ID)
        if self.refill and self.kind is StampKind.RESET:
            raise _bad("a reset is never refilled")
        if self.snapshot and self.kind is not StampKind.DATA:
            raise _bad("only data is a snapshot copy")


@dataclass(frozen=True, slots=True)
class PublishMeta:
    """What a publisher says about one message (docs/robust-binding.md §2.3): its publish
    type, the data item it acts on (`message_id`, with the topic), its permission token and
    the publisher's own seq on its link to the broker. Every field is optional; a message
    without the option is an `update` with none of the rest.

    `snapshot` is a subscriber's request (XEP-0040 §3.1), never something published: 553.
    """

    publish_type: PublishType = PublishType.UPDATE
    message_id: str | None = None
    token: str | None = None
    publisher_seq: int | None = None
    #: the application event code this message means for its resource (event-binding.md §2)
    event: int | None = None
    #: False: publishing gives no implicit watch of the resource (event-binding.md §6)
    implicit: bool = True

    def __post_init__(self) -> None:
        if self.event is not None and not 0x8000 <= self.event <= 0xFFFF_FFFF:
            raise InvalidParameter(f"event {self.event} is not an application event code"
                                   " (32768..4294967295)")
        if not isinstance(self.publish_type, PublishType):
            raise _bad(f"{self.publish_type!r} is not a publish type")
        if self.publish_type is PublishType.SNAPSHOT:
            raise InvalidParameter("snapshot is a subscriber's request, not a publish type")
        if self.message_id is not None:
            _check_text(self.message_id, "a message-id", MAX_MESSAGE_ID_LEN)
        if self.token is not None:
            _check_text(self.token, "a permission token", MAX_TOKEN_LEN)
        if self.publisher_seq is not None:
            _check_int(self.publisher_seq, "pubseq", 1, MAX_LONG)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Content of a heartbeat data: the link's heartbeat interval in ms."""

    interval_ms: int

    def __post_init__(self) -> None:
        _check_int(self.interval_ms, "interval", 1, MAX_LONG)


@dataclass(frozen=True, slots=True)
class LinkReset:
    """Content of a reset data; `reason` is for people."""

    reason: str | None = None

    def __post_init__(self) -> None:
        if self.reason is not None:
            _check_text(self.reason, "a reset reason", MAX_TEXT_LEN)


@dataclass(frozen=True, slots=True)
class Withheld:
    """Content of a withheld data (§2.4): says nothing of the message it stands for."""


@dataclass(frozen=True, slots=True)
class GapRequest:
    """Gap fill by link range (§5.1): `link_from..link_to` inclusive, forward through the wrap;
    `link_to` None means through the newest link seq; `epoch` None means the current one."""

    link: str
    link_from: int
    trans_id: int
    link_to: int | None = None
    epoch: int | None = None
    #: the requester takes the items packed up to this many per `<batch>` (§5.4); None: one
    #: data each
    batch: int | None = None

    def __post_init__(self) -> None:
        validate_link_id(self.link)
        _check_batch(self.batch)
        for value in (self.link_from, self.link_to):
            if value is not None and (type(value) is not int or not 0 <= value <= MAX_LINK_SEQ):
                raise BadGapRange(f"link seq {value!r} is negative or beyond any resolution")
        _check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)
        if self.epoch is not None:
            _check_int(self.epoch, "epoch", 0, MAX_LONG)


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """The last source seq the subscriber has of `source` (0: none)."""

    source: str
    after: int

    def __post_init__(self) -> None:
        _check_int(self.after, "after", 0, MAX_LONG)


@dataclass(frozen=True, slots=True)
class RepairRequest:
    """Repair by source (§5.2): resend, per source, what follows `sources`; for other sources
    what the journal accepted at or after `since` (ms)."""

    link: str
    trans_id: int
    sources: tuple[SourcePosition, ...] = ()
    since: int | None = None
    epoch: int | None = None
    #: as `GapRequest.batch`, for the catch-up
    batch: int | None = None

    def __post_init__(self) -> None:
        validate_link_id(self.link)
        _check_batch(self.batch)
        _check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)
        if len(self.sources) > MAX_REPAIR_SOURCES:
            raise InvalidParameter(f"a repair names at most {MAX_REPAIR_SOURCES} sources")
        if len({p.source for p in self.sources}) != len(self.sources):
            raise InvalidParameter("a repair names each source once")
        if self.since is not None:
            _check_int(self.since, "since", 0, MAX_LONG)
        if self.epoch is not None:
            _check_int(self.epoch, "epoch", 0, MAX_LONG)


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """XEP-0040 §3.1 `snapshot`: the current state of `topic`'s data items (or of the one named
    `message_id`) once, on the requester's `link` (None: its endpoint), then a reply; no
    subscription (§9)."""

    topic: str
    trans_id: int
    message_id: str | None = None
    link: str | None = None

    def __post_init__(self) -> None:
        validate_topic(self.topic)
        _check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)
        if self.message_id is not None:
            _check_text(self.message_id, "a message-id", MAX_MESSAGE_ID_LEN)
        if self.link is not None:
            validate_link_id(self.link)


@dataclass(frozen=True, slots=True)
class CapabilityQuery:
    """What to expect of this service (§6)."""

    trans_id: int

    def __post_init__(self) -> None:
        _check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The answer to a capability query (§6); durations in ms, -1 journal retention: forever."""

    seq_bits: int
    heartbeat_ms: int
    link_retention_ms: int
    max_gap: int
    max_repair: int
    journal_retention_ms: int
    selector_classes: tuple[str, ...] = ()
    publish_types: tuple[PublishType, ...] = tuple(PublishType)
    permissions: str = "tokens"
    trans_id: int | None = None

    def __post_init__(self) -> None:
        if self.seq_bits not in SUPPORTED_BITS:
            raise _bad(f"seqbits is one of {SUPPORTED_BITS}")
        for value, what in ((self.heartbeat_ms, "heartbeat"),
                            (self.link_retention_ms, "linkretention"),
                            (self.max_gap, "maxgap"), (self.max_repair, "maxrepair")):
            _check_int(value, what, 1, MAX_LONG)
        _check_int(self.journal_retention_ms, "journalretention", -1, MAX_LONG)
        if len(self.selector_classes) > MAX_SELECTOR_CLASSES or any(
                not isinstance(c, str) or not _NAME.fullmatch(c) for c in self.selector_classes):
            raise _bad("selector class names are short tokens")
        if len(set(self.selector_classes)) != len(self.selector_classes) \
                or len(set(self.publish_types)) != len(self.publish_types):
            raise _bad("each selector class and publish type is listed once")
        if self.permissions not in ("tokens", "none"):
            raise _bad("the permissions scheme is tokens or none")
        if self.trans_id is not None:
            _check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)


@dataclass(frozen=True, slots=True)
class LinkReply:
    """The service's answer to a gap or repair request (§4.1)."""

    code: int
    link: str
    trans_id: int | None = None
    epoch: int | None = None
    link_seq: int | None = None
    oldest: int | None = None
    max_gap: int | None = None
    text: str = ""

    def __post_init__(self) -> None:
        _check_int(self.code, "code", 100, 999)
        validate_link_id(self.link)
        if self.trans_id is not None:
            _check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)
        if self.epoch is not None:
            _check_int(self.epoch, "epoch", 0, MAX_LONG)
        for value in (self.link_seq, self.oldest):
            if value is not None:
                _check_int(value, "linkseq", 0, MAX_LINK_SEQ)
        if self.max_gap is not None:
            _check_int(self.max_gap, "maxgap", 1, MAX_LONG)
        if len(self.text) > MAX_TEXT_LEN:
            raise _bad(f"a diagnostic has at most {MAX_TEXT_LEN} characters")

    def exception(self) -> ApexpsError | None:
        """The `ApexpsError` a non-2xx code stands for (LinkContextGone for 569, …)."""
        if 200 <= self.code < 300:
            return None
        return ApexpsError.for_code(self.code, self.text or None)

    @classmethod
    def from_exception(cls, exc: ApexpsError, link: str, trans_id: int | None = None, *,
                       epoch: int | None = None, link_seq: int | None = None,
                       oldest: int | None = None, max_gap: int | None = None) -> LinkReply:
        return cls(int(exc.code), link, trans_id, epoch, link_seq, oldest, max_gap,
                   str(exc)[:MAX_TEXT_LEN])


@dataclass(frozen=True, slots=True)
class PubStatusQuery:
    """Where does my publishing stand (§8)? Answered with a `PubStatus`."""

    trans_id: int

    def __post_init__(self) -> None:
        _check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)


@dataclass(frozen=True, slots=True)
class PubStatus:
    """The answer to a `PubStatusQuery` (§8): the requester's highest durable publisher seq and
    its newest source seq in the journal, 0 for none. A publisher resumes at `pubseq` + 1."""

    source: str
    pubseq: int
    source_seq: int
    trans_id: int | None = None

    def __post_init__(self) -> None:
        _check_int(self.pubseq, "pubseq", 0, MAX_LONG)
        _check_int(self.source_seq, "sourceseq", 0, MAX_LONG)
        if self.trans_id is not None:
            _check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)


RobustDocument = (Heartbeat | LinkReset | Withheld | GapRequest | RepairRequest
                  | CapabilityQuery | Capabilities | LinkReply | PubStatusQuery | PubStatus
                  | SnapshotRequest)

#: Root elements `decode_robust` reads: a service can dispatch on a document's root tag.
ROBUST_ELEMENTS = frozenset({"heartbeat", "linkreset", "withheld", "gap", "repair",
                             "capabilityquery", "capabilities", "linkreply", "pubstatus",
                             "snapshot"})


# --- decoding -------------------------------------------------------------------------------


def _attrs(elem: etree._Element, allowed: set[str], required: set[str]) -> dict[str, str]:
    return checked_attributes(elem, allowed, required, _bad)


def _empty(elem: etree._Element) -> None:
    if len(elem) or (elem.text or "").strip():
        raise _bad(f"<{elem.tag}> is empty by the DTD")


def _number(value: str, what: str, low: int = 0, high: int = MAX_LONG) -> int:
    """A decimal without sign or spaces in low..high, else 501."""
    if not _DIGITS.fullmatch(value) or len(value) > _MAX_DIGITS:
        raise _bad(f"{what} {value[:24]!r} is not an unsigned decimal number")
    number = int(value)
    if not low <= number <= high:
        raise _bad(f"{what} {number} is outside {low}..{high}")
    return number


def _link_seq(value: str, what: str) -> int:
    """A link seq: a decimal, else 501; negative or beyond 64 bits, 553 (a bad range)."""
    if not _SIGNED.fullmatch(value):
        raise _bad(f"{what} {value[:24]!r} is not a number")
    if value.startswith("-"):
        raise BadGapRange(f"{what} {value[:24]} is negative")
    if len(value) > _MAX_DIGITS or int(value) > MAX_LINK_SEQ:
        raise BadGapRange(f"{what} {value[:24]}… is beyond any link seq resolution")
    return int(value)


def _opt(attrs: dict[str, str], name: str, what: str | None = None, low: int = 0,
         high: int = MAX_LONG) -> int | None:
    return _number(attrs[name], what or name, low, high) if name in attrs else None


def _source(value: str) -> str:
    return str(Endpoint.parse(value))


def _parse(content: bytes, limit: int, depth: int, what: str) -> etree._Element:
    try:
        return parse_hardened(content, max_bytes=limit, max_depth=depth, what=what)
    except UnsafeXml as exc:
        raise SyntaxError_(str(exc)) from None


_STAMP_ATTRS = {"link", "epoch", "linkseq", "kind", "source", "sourceseq", "type", "topic",
                "token", "messageid", "time", "refill", "repair", "snapshot", "inre"}


def stamp_element(root: etree._Element) -> Stamp:
    """The stamp a `<seq>` element says (what `decode_stamp` and a batch item hold)."""
    if root.tag != "seq":
        raise _bad(f"the {STAMP_OPTION} option holds <seq>, not <{str(root.tag)[:40]}>")
    _empty(root)
    a = _attrs(root, _STAMP_ATTRS, {"link", "linkseq"})
    try:
        kind = StampKind(a.get("kind", "data"))
    except ValueError:
        raise _bad("a stamp's kind is data, heartbeat, reset or withheld") from None
    ptype = None
    if "type" in a:
        try:
            ptype = PublishType(a["type"])
        except ValueError:
            raise _bad(f"{a['type'][:40]!r} is not a publish type") from None
    refill, snapshot = a.get("refill", "false"), a.get("snapshot", "false")
    if refill not in ("true", "false") or snapshot not in ("true", "false"):
        raise _bad("refill and snapshot are true or false")
    return Stamp(
        link=validate_link_id(a["link"]),
        link_seq=_link_seq(a["linkseq"], "linkseq"),
        kind=kind,
        epoch=_number(a.get("epoch", "0"), "epoch"),
        source=_source(a["source"]) if "source" in a else None,
        source_seq=_opt(a, "sourceseq", low=1),
        publish_type=ptype,
        topic=validate_topic(a["topic"]) if "topic" in a else None,
        token=a.get("token"),
        message_id=a.get("messageid"),
        time=_opt(a, "time"),
        refill=refill == "true",
        repair=_opt(a, "repair", "repair", 1, MAX_TRANS_ID),
        snapshot=snapshot == "true",
        in_re=tuple(a["inre"].split(" ")) if "inre" in a else (),
    )


_SET_ORDER = ("link", "link_seq", "kind", "epoch", "source", "source_seq", "publish_type",
              "topic", "token", "message_id", "time", "refill", "repair", "snapshot", "in_re")
assert Stamp.__slots__ == _SET_ORDER, "a new Stamp field needs its setter in varied_stamp"
(_set_link, _set_link_seq, _set_kind, _set_epoch, _set_source, _set_source_seq, _set_type,
 _set_topic, _set_token, _set_message_id, _set_time, _set_refill, _set_repair,
 _set_snapshot, _set_in_re) = (getattr(Stamp, name).__set__ for name in _SET_ORDER)


def varied_stamp(proto: Stamp, link_seq: int, source_seq: int | None, time: int | None,
                 message_id: str | None) -> Stamp:
    """`proto` with the fields that vary from one data stamp of a link to the next replaced,
    without a check: for a reader that checked `proto` whole and checks these itself (the
    `<batch>` fast path, `batch_fast`).
    Spelled out setter by setter: a batch reader makes one per item, and a loop over the
    slots costs half as much again. With `Stamp(...)` (which checks everything) this is the
    one way a `Stamp` is made."""
    stamp = _new_object(Stamp)
    _set_link(stamp, proto.link)
    _set_link_seq(stamp, link_seq)
    _set_kind(stamp, proto.kind)
    _set_epoch(stamp, proto.epoch)
    _set_source(stamp, proto.source)
    _set_source_seq(stamp, source_seq)
    _set_type(stamp, proto.publish_type)
    _set_topic(stamp, proto.topic)
    _set_token(stamp, proto.token)
    _set_message_id(stamp, message_id)
    _set_time(stamp, time)
    _set_refill(stamp, proto.refill)
    _set_repair(stamp, proto.repair)
    _set_snapshot(stamp, proto.snapshot)
    _set_in_re(stamp, proto.in_re)
    return stamp


_new_object = object.__new__


def decode_stamp(option: Option) -> Stamp:
    """The stamp an `apexps.seq` option holds (500/501/553 as the module docstring says).

    The stamp's constructor runs its checks too; the text ones raise 553."""
    if option.external or option.name != STAMP_OPTION:
        raise _bad(f"option {option.name[:40]!r} is not {STAMP_OPTION}")
    try:
        return stamp_element(_parse(option.content.encode("utf-8"), MAX_STAMP_XML, 1, "stamp"))
    except (RecursionError, MemoryError, UnicodeError) as exc:
        raise SyntaxError_(f"undecodable stamp: {type(exc).__name__}") from None


_PUBLISH_ATTRS = {"type", "messageid", "token", "pubseq", "event", "implicit"}


def find_publish_meta(options: Iterable[Option]) -> PublishMeta | None:
    """The `apexps.publish` option among a data's `options`, None if it has none; 500/501/553
    as for stamps, two of them 501."""
    found = [o for o in options if o.name == PUBLISH_OPTION and not o.external]
    if not found:
        return None
    if len(found) > 1:
        raise _bad(f"a data carries at most one {PUBLISH_OPTION} option")
    try:
        root = _parse(found[0].content.encode("utf-8"), MAX_STAMP_XML, 1, "publish option")
    except (RecursionError, MemoryError, UnicodeError) as exc:
        raise SyntaxError_(f"undecodable publish option: {type(exc).__name__}") from None
    if root.tag != "publish":
        raise _bad(f"the {PUBLISH_OPTION} option holds <publish>, not <{str(root.tag)[:40]}>")
    _empty(root)
    a = _attrs(root, _PUBLISH_ATTRS, set())
    try:
        ptype = PublishType(a.get("type", "update"))
    except ValueError:
        raise _bad(f"{a['type'][:40]!r} is not a publish type") from None
    if a.get("implicit", "true") not in ("true", "false"):
        raise _bad("implicit is true or false")
    return PublishMeta(ptype, a.get("messageid"), a.get("token"),
                       _opt(a, "pubseq", "pubseq", 1), _opt(a, "event", "event", 0, 2**32 - 1),
                       a.get("implicit", "true") == "true")


def find_stamp(options: Iterable[Option]) -> Stamp | None:
    """The stamp among a recipient's `options`, None if it has none; two stamps are 501."""
    found = [o for o in options if o.name == STAMP_OPTION and not o.external]
    if not found:
        return None
    if len(found) > 1:
        raise _bad(f"a recipient carries at most one {STAMP_OPTION} option")
    return decode_stamp(found[0])


def _text(root: etree._Element) -> str:
    if len(root):
        raise _bad(f"<{root.tag}> holds only text")
    return (root.text or "").strip()


def document_element(root: etree._Element) -> RobustDocument:
    """The robust document `root` is (its tag says which)."""
    tag = root.tag
    if tag == "heartbeat":
        _empty(root)
        a = _attrs(root, {"interval"}, {"interval"})
        return Heartbeat(_number(a["interval"], "interval", 1))
    if tag == "linkreset":
        _empty(root)
        a = _attrs(root, {"reason"}, set())
        return LinkReset(a.get("reason"))
    if tag == "withheld":
        _empty(root)
        _attrs(root, set(), set())
        return Withheld()
    if tag == "gap":
        _empty(root)
        a = _attrs(root, {"link", "epoch", "linkfrom", "linkto", "transID", "batch"},
                   {"link", "linkfrom", "transID"})
        return GapRequest(
            validate_link_id(a["link"]), _link_seq(a["linkfrom"], "linkfrom"),
            _number(a["transID"], "transID", 1, MAX_TRANS_ID),
            _link_seq(a["linkto"], "linkto") if "linkto" in a else None, _opt(a, "epoch"),
            _opt(a, "batch", low=1, high=MAX_BATCH_ITEMS))
    if tag == "repair":
        if (root.text or "").strip() or any((c.tail or "").strip() for c in root):
            raise _bad("<repair> holds only <source> elements")
        a = _attrs(root, {"link", "epoch", "since", "transID", "batch"}, {"link", "transID"})
        if len(root) > MAX_REPAIR_SOURCES:
            raise InvalidParameter(f"a repair names at most {MAX_REPAIR_SOURCES} sources")
        positions = []
        for child in root:
            if child.tag != "source":
                raise _bad(f"<repair> holds <source>s, not <{str(child.tag)[:40]}>")
            _empty(child)
            s = _attrs(child, {"name", "after"}, {"name", "after"})
            positions.append(SourcePosition(_source(s["name"]), _number(s["after"], "after")))
        return RepairRequest(validate_link_id(a["link"]),
                             _number(a["transID"], "transID", 1, MAX_TRANS_ID),
                             tuple(positions), _opt(a, "since"), _opt(a, "epoch"),
                             _opt(a, "batch", low=1, high=MAX_BATCH_ITEMS))
    if tag == "snapshot":
        _empty(root)
        a = _attrs(root, {"topic", "messageid", "link", "transID"}, {"topic", "transID"})
        return SnapshotRequest(validate_topic(a["topic"]),
                               _number(a["transID"], "transID", 1, MAX_TRANS_ID),
                               a.get("messageid"),
                               validate_link_id(a["link"]) if "link" in a else None)
    if tag == "capabilityquery":
        _empty(root)
        a = _attrs(root, {"transID"}, {"transID"})
        return CapabilityQuery(_number(a["transID"], "transID", 1, MAX_TRANS_ID))
    if tag == "capabilities":
        return _capabilities(root)
    if tag == "pubstatus":
        return _pubstatus(root)
    if tag == "linkreply":
        a = _attrs(root, {"code", "transID", "link", "epoch", "linkseq", "oldest", "maxgap",
                          _XML_LANG}, {"code", "link"})
        return LinkReply(
            _number(a["code"], "code", 100, 999), validate_link_id(a["link"]),
            _opt(a, "transID", low=1, high=MAX_TRANS_ID), _opt(a, "epoch"),
            _opt(a, "linkseq", high=MAX_LINK_SEQ), _opt(a, "oldest", high=MAX_LINK_SEQ),
            _opt(a, "maxgap", low=1), _text(root)[:MAX_TEXT_LEN])
    raise _bad(f"<{str(tag)[:40]}> is not a robust delivery document")


_POSITION_ATTRS = {"source", "pubseq", "sourceseq"}


def _pubstatus(root: etree._Element) -> PubStatusQuery | PubStatus:
    """A query carries only its transID; an answer all of source, pubseq and sourceseq."""
    _empty(root)
    a = _attrs(root, {"transID"} | _POSITION_ATTRS, set())
    given = _POSITION_ATTRS & a.keys()
    if not given:
        if "transID" not in a:
            raise _bad("a pubstatus query carries its transID")
        return PubStatusQuery(_number(a["transID"], "transID", 1, MAX_TRANS_ID))
    if given != _POSITION_ATTRS:
        raise _bad("a pubstatus answer carries source, pubseq and sourceseq")
    return PubStatus(_source(a["source"]), _number(a["pubseq"], "pubseq"),
                     _number(a["sourceseq"], "sourceseq"),
                     _opt(a, "transID", low=1, high=MAX_TRANS_ID))


_CAP_ATTRS = {"transID", "seqbits", "heartbeat", "linkretention", "maxgap", "maxrepair",
              "journalretention"}
_CAP_ORDER = {"selectorclass": 0, "publishtype": 1, "permissions": 2}


def _capabilities(root: etree._Element) -> Capabilities:
    if (root.text or "").strip() or any((c.tail or "").strip() for c in root):
        raise _bad("<capabilities> holds only elements")
    a = _attrs(root, _CAP_ATTRS, _CAP_ATTRS - {"transID"})
    classes: list[str] = []
    types: list[PublishType] = []
    scheme = "none"
    last = -1
    if len(root) > MAX_SELECTOR_CLASSES + len(PublishType) + 1:
        raise _bad("<capabilities> lists too many elements")
    for child in root:
        order = _CAP_ORDER.get(str(child.tag))
        if order is None or order < last or (order == 2 and last == 2):
            raise _bad("<capabilities> holds selectorclass*, publishtype*, permissions?")
        last = order
        _empty(child)
        if order == 0:
            classes.append(_attrs(child, {"name"}, {"name"})["name"])
        elif order == 1:
            name = _attrs(child, {"name"}, {"name"})["name"]
            try:
                types.append(PublishType(name))
            except ValueError:
                raise _bad(f"{name[:40]!r} is not a publish type") from None
        else:
            scheme = _attrs(child, {"scheme"}, {"scheme"})["scheme"]
    retention = a["journalretention"]
    return Capabilities(
        seq_bits=_number(a["seqbits"], "seqbits", 16, 64),
        heartbeat_ms=_number(a["heartbeat"], "heartbeat", 1),
        link_retention_ms=_number(a["linkretention"], "linkretention", 1),
        max_gap=_number(a["maxgap"], "maxgap", 1),
        max_repair=_number(a["maxrepair"], "maxrepair", 1),
        journal_retention_ms=-1 if retention == "-1" else _number(retention, "journalretention"),
        selector_classes=tuple(classes),
        publish_types=tuple(types),
        permissions=scheme,
        trans_id=_opt(a, "transID", low=1, high=MAX_TRANS_ID),
    )


def decode_robust(content: bytes) -> RobustDocument:
    """Parse one robust delivery document (500/501/553 as the module docstring says)."""
    try:
        return document_element(_parse(content, MAX_ROBUST_XML, 2, "robust delivery document"))
    except (RecursionError, MemoryError, UnicodeError) as exc:
        raise SyntaxError_(f"undecodable document: {type(exc).__name__}") from None


# --- encoding -------------------------------------------------------------------------------


def _esc(value: str) -> str:
    return (value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("'", "&apos;"))


def _a(name: str, value: object) -> str:
    """` name='value'`, or nothing for None."""
    if value is None:
        return ""
    return f" {name}='{_esc(value) if isinstance(value, str) else value}'"


def encode_stamp(stamp: Stamp) -> str:
    """The `<seq … />` element of `stamp` (the option's content)."""
    s = stamp
    if s.kind is StampKind.DATA:
        return data_stamp_xml(s.link, s.link_seq, epoch=s.epoch, source=s.source or "",
                              source_seq=s.source_seq or 0, publish_type=str(s.publish_type),
                              topic=s.topic or "", token=s.token, message_id=s.message_id,
                              time=s.time, refill=s.refill, snapshot=s.snapshot,
                              in_re=s.in_re)
    text = f"<seq link='{_esc(s.link)}'"
    if s.epoch:
        text += f" epoch='{s.epoch}'"
    refill = " refill='true'" if s.refill else ""
    return (f"{text} linkseq='{s.link_seq}' kind='{s.kind.value}'{_a('time', s.time)}{refill}"
            f"{_a('repair', s.repair)} />")


def data_stamp_xml(link: str, link_seq: int, *, epoch: int, source: str, source_seq: int,
                   publish_type: str, topic: str, token: str | None = None,
                   message_id: str | None = None, time: int | None = None,
                   refill: bool = False, snapshot: bool = False,
                   in_re: tuple[str, ...] = ()) -> str:
    """A data stamp's `<seq … />` straight from trusted values (a link record and its journal
    entry, both checked when they were written): the fan-out's per-delivery path, without
    building and checking a `Stamp` (which costs about as much again)."""
    message = data_stamp_message(source, source_seq, publish_type, topic, token=token,
                                 message_id=message_id, time=time)
    return data_stamp_link(link, link_seq, message, epoch=epoch, refill=refill,
                           snapshot=snapshot, in_re=in_re)


def data_stamp_message(source: str, source_seq: int, publish_type: str, topic: str, *,
                       token: str | None = None, message_id: str | None = None,
                       time: int | None = None) -> str:
    """The part of a data stamp that says which message it is (the same on every link the
    message goes to): the fan-out makes it once per message, `data_stamp_link` adds each
    link's part."""
    return (f" kind='data' source='{_esc_known(source)}' sourceseq='{source_seq}'"
            f" type='{publish_type}' topic='{_esc_known(topic)}'"
            f"{_a('token', token)}{_a('messageid', message_id)}{_a('time', time)}")


def data_stamp_link(link: str, link_seq: int, message: str, *, epoch: int, refill: bool,
                    snapshot: bool, in_re: tuple[str, ...] = ()) -> str:
    """A data stamp's `<seq … />` from its link's part and `data_stamp_message`'s."""
    head = f"<seq link='{_esc_known(link)}'"
    if epoch:
        head += f" epoch='{epoch}'"
    tail = " refill='true' />" if refill else " />"
    if in_re:  # after every attribute of the fast layout: a reader without it declines
        tail = f" inre='{' '.join(in_re)}'" + tail
    if snapshot:
        tail = " snapshot='true'" + tail
    return f"{head} linkseq='{link_seq}'{message}{tail}"


_ESCAPED: dict[str, str] = {}


def _esc_known(value: str) -> str:
    """`_esc` for the links, sources and topics every stamp repeats: each escaped once."""
    done = _ESCAPED.get(value)
    if done is None:
        if len(_ESCAPED) >= 65_536:  # bounded whatever names come
            _ESCAPED.clear()
        done = _ESCAPED[value] = _esc(value)
    return done


def publish_option(meta: PublishMeta) -> Option:
    """The `apexps.publish` option saying `meta`, for a publisher's data."""
    return Option(PUBLISH_OPTION, content=(
        f"<publish type='{meta.publish_type}'{_a('messageid', meta.message_id)}"
        f"{_a('token', meta.token)}{_a('pubseq', meta.publisher_seq)}{_a('event', meta.event)}"
        f"{'' if meta.implicit else _a('implicit', 'false')} />"))


def stamp_option(stamp: Stamp) -> Option:
    """The `apexps.seq` option carrying `stamp`, for a recipient's options."""
    return Option(STAMP_OPTION, content=encode_stamp(stamp))


def encode_robust(doc: RobustDocument) -> bytes:
    """The document for `doc`, in the drafts' layout."""
    if isinstance(doc, Heartbeat):
        text = f"<heartbeat interval='{doc.interval_ms}' />"
    elif isinstance(doc, LinkReset):
        text = f"<linkreset{_a('reason', doc.reason)} />"
    elif isinstance(doc, Withheld):
        text = "<withheld />"
    elif isinstance(doc, GapRequest):
        text = (f"<gap link='{_esc(doc.link)}'{_a('epoch', doc.epoch)}"
                f" linkfrom='{doc.link_from}'{_a('linkto', doc.link_to)}"
                f" transID='{doc.trans_id}'{_a('batch', doc.batch)} />")
    elif isinstance(doc, RepairRequest):
        head = (f"<repair link='{_esc(doc.link)}'{_a('epoch', doc.epoch)}"
                f"{_a('since', doc.since)} transID='{doc.trans_id}'{_a('batch', doc.batch)}")
        rows = "".join(f"<source name='{_esc(p.source)}' after='{p.after}' />"
                       for p in doc.sources)
        text = f"{head}>{rows}</repair>" if rows else f"{head} />"
    elif isinstance(doc, CapabilityQuery):
        text = f"<capabilityquery transID='{doc.trans_id}' />"
    elif isinstance(doc, PubStatusQuery):
        text = f"<pubstatus transID='{doc.trans_id}' />"
    elif isinstance(doc, PubStatus):
        text = (f"<pubstatus{_a('transID', doc.trans_id)} source='{_esc(doc.source)}'"
                f" pubseq='{doc.pubseq}' sourceseq='{doc.source_seq}' />")
    elif isinstance(doc, SnapshotRequest):
        text = (f"<snapshot topic='{_esc(doc.topic)}'{_a('messageid', doc.message_id)}"
                f"{_a('link', doc.link)} transID='{doc.trans_id}' />")
    elif isinstance(doc, Capabilities):
        text = (f"<capabilities{_a('transID', doc.trans_id)} seqbits='{doc.seq_bits}'"
                f" heartbeat='{doc.heartbeat_ms}' linkretention='{doc.link_retention_ms}'"
                f" maxgap='{doc.max_gap}' maxrepair='{doc.max_repair}'"
                f" journalretention='{doc.journal_retention_ms}'>"
                + "".join(f"<selectorclass name='{_esc(c)}' />" for c in doc.selector_classes)
                + "".join(f"<publishtype name='{t}' />" for t in doc.publish_types)
                + f"<permissions scheme='{doc.permissions}' /></capabilities>")
    else:
        head = (f"<linkreply code='{doc.code}'{_a('transID', doc.trans_id)}"
                f" link='{_esc(doc.link)}'{_a('epoch', doc.epoch)}"
                f"{_a('linkseq', doc.link_seq)}{_a('oldest', doc.oldest)}"
                f"{_a('maxgap', doc.max_gap)}")
        text = f"{head}>{_esc(doc.text)}</linkreply>" if doc.text else f"{head} />"
    return text.encode("utf-8")
