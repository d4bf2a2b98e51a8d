"""Robust delivery's documents (docs/robust-binding.md, docs/apexps-robust.dtd) <-> dataclasses.

Documents carried as data content: `heartbeat`, `linkreset` and `withheld` (what heartbeat,
reset and withheld data hold), `gap`, `repair`, `capabilityquery`, `snapshot` and `pubstatus`
(sent to `apex=pubsub@D`), `linkreply`, `capabilities` and `pubstatus` with a position (its
answers) — `decode_robust`, `encode_robust`. The two APEX options every delivery and
publication carry (the sequence stamp and the publish option) are adapters/apex/
robust_stamp.py; the syntax both share (limits, checkers, escaping) is `_robust_syntax`.

Parsed with the one hardened parser (`common.xml_safe`), as `_pubsub_codec` does: XML that does
not parse or is hostile is 500; XML that does not fit the DTD (unknown element or attribute,
missing attribute, a number that is not one) is 501; a link id, endpoint or topic that is not
one is 553, and so is a link seq that is negative or beyond 64 bits (`BadGapRange`) — the
resolution check proper (16/32 bits) is the link's, in `broker.robust.linkseq`. `decode_*`
raise nothing but `ApexpsError`, whatever the bytes. Each element's decoder sits beside its
encoder's case, so that the two cannot drift. Encoding uses the drafts' layout (single quotes,
" />").
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from broker.names import validate_topic
from broker.records import PublishType
from broker.robust.linkid import validate_link_id
from broker.robust.linkseq import SUPPORTED_BITS
from common.errors import (
    ApexpsError,
    BadGapRange,
    InvalidParameter,
    SyntaxError_,
)

from ._robust_syntax import (
    MAX_BATCH_ITEMS,
    MAX_LINK_SEQ,
    MAX_LONG,
    MAX_MESSAGE_ID_LEN,
    MAX_REPAIR_SOURCES,
    MAX_ROBUST_XML,
    MAX_SELECTOR_CLASSES,
    MAX_TEXT_LEN,
    MAX_TRANS_ID,
    NAME,
    XML_LANG,
    attr,
    attributes,
    bad,
    check_batch,
    check_int,
    check_text,
    decimal,
    empty_element,
    esc,
    linkseq,
    optional,
    parse,
    source_name,
)

__all__ = [
    "MAX_BATCH_ITEMS",
    "MAX_LINK_SEQ",
    "MAX_REPAIR_SOURCES",
    "MAX_ROBUST_XML",
    "MAX_TRANS_ID",
    "ROBUST_ELEMENTS",
    "Capabilities",
    "CapabilityQuery",
    "GapRequest",
    "Heartbeat",
    "LinkReply",
    "LinkReset",
    "PubStatus",
    "PubStatusQuery",
    "RepairRequest",
    "RobustDocument",
    "SnapshotRequest",
    "SourcePosition",
    "Withheld",
    "decode_robust",
    "document_element",
    "encode_robust",
]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Content of a heartbeat data: the link's heartbeat interval in ms."""

    interval_ms: int

    def __post_init__(self) -> None:
        check_int(self.interval_ms, "interval", 1, MAX_LONG)


@dataclass(frozen=True, slots=True)
class LinkReset:
    """Content of a reset data; `reason` is for people."""

    reason: str | None = None

    def __post_init__(self) -> None:
        if self.reason is not None:
            check_text(self.reason, "a reset reason", MAX_TEXT_LEN)


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
        check_batch(self.batch)
        for value in (self.link_from, self.link_to):
            if value is not None and (type(value) is not int or not 0 <= value <= MAX_LINK_SEQ):
                raise BadGapRange(f"link seq {value!r} is negative or beyond any resolution")
        check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)
        if self.epoch is not None:
            check_int(self.epoch, "epoch", 0, MAX_LONG)


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """The last source seq the subscriber has of `source` (0: none)."""

    source: str
    after: int

    def __post_init__(self) -> None:
        check_int(self.after, "after", 0, MAX_LONG)


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
        check_batch(self.batch)
        check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)
        if len(self.sources) > MAX_REPAIR_SOURCES:
            raise InvalidParameter(f"a repair names at most {MAX_REPAIR_SOURCES} sources")
        if len({p.source for p in self.sources}) != len(self.sources):
            raise InvalidParameter("a repair names each source once")
        if self.since is not None:
            check_int(self.since, "since", 0, MAX_LONG)
        if self.epoch is not None:
            check_int(self.epoch, "epoch", 0, MAX_LONG)


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
        check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)
        if self.message_id is not None:
            check_text(self.message_id, "a message-id", MAX_MESSAGE_ID_LEN)
        if self.link is not None:
            validate_link_id(self.link)


@dataclass(frozen=True, slots=True)
class CapabilityQuery:
    """What to expect of this service (§6)."""

    trans_id: int

    def __post_init__(self) -> None:
        check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)


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
            raise bad(f"seqbits is one of {SUPPORTED_BITS}")
        for value, what in ((self.heartbeat_ms, "heartbeat"),
                            (self.link_retention_ms, "linkretention"),
                            (self.max_gap, "maxgap"), (self.max_repair, "maxrepair")):
            check_int(value, what, 1, MAX_LONG)
        check_int(self.journal_retention_ms, "journalretention", -1, MAX_LONG)
        if len(self.selector_classes) > MAX_SELECTOR_CLASSES or any(
                not isinstance(c, str) or not NAME.fullmatch(c) for c in self.selector_classes):
            raise bad("selector class names are short tokens")
        if len(set(self.selector_classes)) != len(self.selector_classes) \
                or len(set(self.publish_types)) != len(self.publish_types):
            raise bad("each selector class and publish type is listed once")
        if self.permissions not in ("tokens", "none"):
            raise bad("the permissions scheme is tokens or none")
        if self.trans_id is not None:
            check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)


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
        check_int(self.code, "code", 100, 999)
        validate_link_id(self.link)
        if self.trans_id is not None:
            check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)
        if self.epoch is not None:
            check_int(self.epoch, "epoch", 0, MAX_LONG)
        for value in (self.link_seq, self.oldest):
            if value is not None:
                check_int(value, "linkseq", 0, MAX_LINK_SEQ)
        if self.max_gap is not None:
            check_int(self.max_gap, "maxgap", 1, MAX_LONG)
        if len(self.text) > MAX_TEXT_LEN:
            raise bad(f"a diagnostic has at most {MAX_TEXT_LEN} characters")

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
        check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)


@dataclass(frozen=True, slots=True)
class PubStatus:
    """The answer to a `PubStatusQuery` (§8): the requester's highest durable publisher seq and
    its newest source seq in the journal, 0 for none. A publisher resumes at `pubseq` + 1."""

    source: str
    pubseq: int
    source_seq: int
    trans_id: int | None = None

    def __post_init__(self) -> None:
        check_int(self.pubseq, "pubseq", 0, MAX_LONG)
        check_int(self.source_seq, "sourceseq", 0, MAX_LONG)
        if self.trans_id is not None:
            check_int(self.trans_id, "transID", 1, MAX_TRANS_ID)


RobustDocument = (Heartbeat | LinkReset | Withheld | GapRequest | RepairRequest
                  | CapabilityQuery | Capabilities | LinkReply | PubStatusQuery | PubStatus
                  | SnapshotRequest)


#: Root elements `decode_robust` reads: a service can dispatch on a document's root tag.
ROBUST_ELEMENTS = frozenset({"heartbeat", "linkreset", "withheld", "gap", "repair",
                             "capabilityquery", "capabilities", "linkreply", "pubstatus",
                             "snapshot"})


def _text(root: etree._Element) -> str:
    if len(root):
        raise bad(f"<{root.tag}> holds only text")
    return (root.text or "").strip()


def document_element(root: etree._Element) -> RobustDocument:
    """The robust document `root` is (its tag says which)."""
    tag = root.tag
    if tag == "heartbeat":
        empty_element(root)
        a = attributes(root, {"interval"}, {"interval"})
        return Heartbeat(decimal(a["interval"], "interval", 1))
    if tag == "linkreset":
        empty_element(root)
        a = attributes(root, {"reason"}, set())
        return LinkReset(a.get("reason"))
    if tag == "withheld":
        empty_element(root)
        attributes(root, set(), set())
        return Withheld()
    if tag == "gap":
        empty_element(root)
        a = attributes(root, {"link", "epoch", "linkfrom", "linkto", "transID", "batch"},
                   {"link", "linkfrom", "transID"})
        return GapRequest(
            validate_link_id(a["link"]), linkseq(a["linkfrom"], "linkfrom"),
            decimal(a["transID"], "transID", 1, MAX_TRANS_ID),
            linkseq(a["linkto"], "linkto") if "linkto" in a else None, optional(a, "epoch"),
            optional(a, "batch", low=1, high=MAX_BATCH_ITEMS))
    if tag == "repair":
        if (root.text or "").strip() or any((c.tail or "").strip() for c in root):
            raise bad("<repair> holds only <source> elements")
        a = attributes(root, {"link", "epoch", "since", "transID", "batch"}, {"link", "transID"})
        if len(root) > MAX_REPAIR_SOURCES:
            raise InvalidParameter(f"a repair names at most {MAX_REPAIR_SOURCES} sources")
        positions = []
        for child in root:
            if child.tag != "source":
                raise bad(f"<repair> holds <source>s, not <{str(child.tag)[:40]}>")
            empty_element(child)
            s = attributes(child, {"name", "after"}, {"name", "after"})
            positions.append(SourcePosition(source_name(s["name"]), decimal(s["after"], "after")))
        return RepairRequest(validate_link_id(a["link"]),
                             decimal(a["transID"], "transID", 1, MAX_TRANS_ID),
                             tuple(positions), optional(a, "since"), optional(a, "epoch"),
                             optional(a, "batch", low=1, high=MAX_BATCH_ITEMS))
    if tag == "snapshot":
        empty_element(root)
        a = attributes(root, {"topic", "messageid", "link", "transID"}, {"topic", "transID"})
        return SnapshotRequest(validate_topic(a["topic"]),
                               decimal(a["transID"], "transID", 1, MAX_TRANS_ID),
                               a.get("messageid"),
                               validate_link_id(a["link"]) if "link" in a else None)
    if tag == "capabilityquery":
        empty_element(root)
        a = attributes(root, {"transID"}, {"transID"})
        return CapabilityQuery(decimal(a["transID"], "transID", 1, MAX_TRANS_ID))
    if tag == "capabilities":
        return _capabilities(root)
    if tag == "pubstatus":
        return _pubstatus(root)
    if tag == "linkreply":
        a = attributes(root, {"code", "transID", "link", "epoch", "linkseq", "oldest", "maxgap",
                          XML_LANG}, {"code", "link"})
        return LinkReply(
            decimal(a["code"], "code", 100, 999), validate_link_id(a["link"]),
            optional(a, "transID", low=1, high=MAX_TRANS_ID), optional(a, "epoch"),
            optional(a, "linkseq", high=MAX_LINK_SEQ), optional(a, "oldest", high=MAX_LINK_SEQ),
            optional(a, "maxgap", low=1), _text(root)[:MAX_TEXT_LEN])
    raise bad(f"<{str(tag)[:40]}> is not a robust delivery document")


_POSITION_ATTRS = {"source", "pubseq", "sourceseq"}


def _pubstatus(root: etree._Element) -> PubStatusQuery | PubStatus:
    """A query carries only its transID; an answer all of source, pubseq and sourceseq."""
    empty_element(root)
    a = attributes(root, {"transID"} | _POSITION_ATTRS, set())
    given = _POSITION_ATTRS & a.keys()
    if not given:
        if "transID" not in a:
            raise bad("a pubstatus query carries its transID")
        return PubStatusQuery(decimal(a["transID"], "transID", 1, MAX_TRANS_ID))
    if given != _POSITION_ATTRS:
        raise bad("a pubstatus answer carries source, pubseq and sourceseq")
    return PubStatus(source_name(a["source"]), decimal(a["pubseq"], "pubseq"),
                     decimal(a["sourceseq"], "sourceseq"),
                     optional(a, "transID", low=1, high=MAX_TRANS_ID))


_CAP_ATTRS = {"transID", "seqbits", "heartbeat", "linkretention", "maxgap", "maxrepair",
              "journalretention"}


_CAP_ORDER = {"selectorclass": 0, "publishtype": 1, "permissions": 2}


def _capabilities(root: etree._Element) -> Capabilities:
    if (root.text or "").strip() or any((c.tail or "").strip() for c in root):
        raise bad("<capabilities> holds only elements")
    a = attributes(root, _CAP_ATTRS, _CAP_ATTRS - {"transID"})
    classes: list[str] = []
    types: list[PublishType] = []
    scheme = "none"
    last = -1
    if len(root) > MAX_SELECTOR_CLASSES + len(PublishType) + 1:
        raise bad("<capabilities> lists too many elements")
    for child in root:
        order = _CAP_ORDER.get(str(child.tag))
        if order is None or order < last or (order == 2 and last == 2):
            raise bad("<capabilities> holds selectorclass*, publishtype*, permissions?")
        last = order
        empty_element(child)
        if order == 0:
            classes.append(attributes(child, {"name"}, {"name"})["name"])
        elif order == 1:
            name = attributes(child, {"name"}, {"name"})["name"]
            try:
                types.append(PublishType(name))
            except ValueError:
                raise bad(f"{name[:40]!r} is not a publish type") from None
        else:
            scheme = attributes(child, {"scheme"}, {"scheme"})["scheme"]
    retention = a["journalretention"]
    return Capabilities(
        seq_bits=decimal(a["seqbits"], "seqbits", 16, 64),
        heartbeat_ms=decimal(a["heartbeat"], "heartbeat", 1),
        link_retention_ms=decimal(a["linkretention"], "linkretention", 1),
        max_gap=decimal(a["maxgap"], "maxgap", 1),
        max_repair=decimal(a["maxrepair"], "maxrepair", 1),
        journal_retention_ms=-1 if retention == "-1" else decimal(retention, "journalretention"),
        selector_classes=tuple(classes),
        publish_types=tuple(types),
        permissions=scheme,
        trans_id=optional(a, "transID", low=1, high=MAX_TRANS_ID),
    )


def decode_robust(content: bytes) -> RobustDocument:
    """Parse one robust delivery document (500/501/553 as the module docstring says)."""
    try:
        return document_element(parse(content, MAX_ROBUST_XML, 2, "robust delivery document"))
    except (RecursionError, MemoryError, UnicodeError) as exc:
        raise SyntaxError_(f"undecodable document: {type(exc).__name__}") from None


def encode_robust(doc: RobustDocument) -> bytes:
    """The document for `doc`, in the drafts' layout."""
    if isinstance(doc, Heartbeat):
        text = f"<heartbeat interval='{doc.interval_ms}' />"
    elif isinstance(doc, LinkReset):
        text = f"<linkreset{attr('reason', doc.reason)} />"
    elif isinstance(doc, Withheld):
        text = "<withheld />"
    elif isinstance(doc, GapRequest):
        text = (f"<gap link='{esc(doc.link)}'{attr('epoch', doc.epoch)}"
                f" linkfrom='{doc.link_from}'{attr('linkto', doc.link_to)}"
                f" transID='{doc.trans_id}'{attr('batch', doc.batch)} />")
    elif isinstance(doc, RepairRequest):
        head = (f"<repair link='{esc(doc.link)}'{attr('epoch', doc.epoch)}"
                f"{attr('since', doc.since)} transID='{doc.trans_id}'{attr('batch', doc.batch)}")
        rows = "".join(f"<source name='{esc(p.source)}' after='{p.after}' />"
                       for p in doc.sources)
        text = f"{head}>{rows}</repair>" if rows else f"{head} />"
    elif isinstance(doc, CapabilityQuery):
        text = f"<capabilityquery transID='{doc.trans_id}' />"
    elif isinstance(doc, PubStatusQuery):
        text = f"<pubstatus transID='{doc.trans_id}' />"
    elif isinstance(doc, PubStatus):
        text = (f"<pubstatus{attr('transID', doc.trans_id)} source='{esc(doc.source)}'"
                f" pubseq='{doc.pubseq}' sourceseq='{doc.source_seq}' />")
    elif isinstance(doc, SnapshotRequest):
        text = (f"<snapshot topic='{esc(doc.topic)}'{attr('messageid', doc.message_id)}"
                f"{attr('link', doc.link)} transID='{doc.trans_id}' />")
    elif isinstance(doc, Capabilities):
        text = (f"<capabilities{attr('transID', doc.trans_id)} seqbits='{doc.seq_bits}'"
                f" heartbeat='{doc.heartbeat_ms}' linkretention='{doc.link_retention_ms}'"
                f" maxgap='{doc.max_gap}' maxrepair='{doc.max_repair}'"
                f" journalretention='{doc.journal_retention_ms}'>"
                + "".join(f"<selectorclass name='{esc(c)}' />" for c in doc.selector_classes)
                + "".join(f"<publishtype name='{t}' />" for t in doc.publish_types)
                + f"<permissions scheme='{doc.permissions}' /></capabilities>")
    else:
        head = (f"<linkreply code='{doc.code}'{attr('transID', doc.trans_id)}"
                f" link='{esc(doc.link)}'{attr('epoch', doc.epoch)}"
                f"{attr('linkseq', doc.link_seq)}{attr('oldest', doc.oldest)}"
                f"{attr('maxgap', doc.max_gap)}")
        text = f"{head}>{esc(doc.text)}</linkreply>" if doc.text else f"{head} />"
    return text.encode("utf-8")
