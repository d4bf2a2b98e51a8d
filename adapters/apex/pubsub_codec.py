"""The pubsub service's vocabulary (draft-schwartz-apex-pubsub §6.1) <-> frozen dataclasses.

The content of data sent to `apex=pubsub@domain` is one of createtopic, deletetopic, listtopics,
subscribe, cancel; the service answers with reply or topiclist, and may send cancel on its own.
Parsed with the one hardened parser (`common.xml_safe`): XML that does not parse is 500, XML that
does not fit the DTD is 501, a bad endpoint is 553.

Where the DTD and the prose disagree (docs/pubsub-service.md) apexps reads:
- `topic` elements carry a `name` attribute (the evident intent of the malformed ATTLIST);
- `cancel` takes an optional `subscriber` (the prose's subject; default: the originator);
- `listtopics` and `topiclist` take an optional `transID` (the prose says the reply has one);
- `reply` is the APEX core's (RFC 3340 §6.1.2): code, optional transID, diagnostic text.
`subscribe` takes apexps's optional `link` (docs/robust-binding.md §3): the link its data
travel on; None means the default, the subscriber endpoint; `snapshot` (§9): 'true' asks for
the current state of the topic's data items first; and `batch` (§5.4): the link's live data may
come packed, up to that many per `<batch>`. From the content-based draft (§5.8) it takes
`cached`: any non-empty value asks for the topic's cached messages first, as the draft says
("the cached attribute of the subscribe element with a non-empty value"; apexps writes
`cached='true'`); empty or absent, only new messages.
Encoding uses the drafts' layout (single quotes, " />") so their examples are golden test data.
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from broker.robust.linkid import validate_link_id
from common.errors import ParameterSyntaxError, SyntaxError_
from common.xml_safe import UnsafeXml, checked_attributes, parse_hardened

from .endpoint import Endpoint
from .robust_codec import MAX_BATCH_ITEMS

__all__ = [
    "Cancel",
    "CreateTopic",
    "DeleteTopic",
    "ListTopics",
    "PubsubOperation",
    "Reply",
    "Subscribe",
    "TopicList",
    "decode_pubsub",
    "encode_pubsub",
]

#: A management document is one empty element, a topiclist one per topic; 1 MiB bounds both.
MAX_PUBSUB_XML = 1024 * 1024
MAX_TRANS_ID = 2_147_483_647
#: %SECONDS; of the APEX core DTD.
MAX_SECONDS = 2_147_483_647


@dataclass(frozen=True, slots=True)
class CreateTopic:
    topic: str
    trans_id: int


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    topic: str
    trans_id: int


@dataclass(frozen=True, slots=True)
class ListTopics:
    trans_id: int | None = None


@dataclass(frozen=True, slots=True)
class Subscribe:
    subscriber: Endpoint
    topic: str
    trans_id: int
    duration: int
    link: str | None = None
    snapshot: bool = False
    #: the subscriber takes the link's live data packed too, up to this many per `<batch>`
    #: (docs/robust-binding.md §5.4)
    batch: int | None = None
    #: content-based §5.8: the topic's cached messages first, then live data
    cached: bool = False

    def __post_init__(self) -> None:
        if self.batch is not None and (type(self.batch) is not int
                                       or not 1 <= self.batch <= MAX_BATCH_ITEMS):
            raise ParameterSyntaxError(f"batch is 1..{MAX_BATCH_ITEMS}")


@dataclass(frozen=True, slots=True)
class Cancel:
    topic: str
    trans_id: int
    subscriber: Endpoint | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    trans_id: int | None = None
    text: str = ""


@dataclass(frozen=True, slots=True)
class TopicList:
    names: tuple[str, ...]
    trans_id: int | None = None


PubsubOperation = CreateTopic | DeleteTopic | ListTopics | Subscribe | Cancel | Reply | TopicList


def _attrs(elem: etree._Element, allowed: set[str], required: set[str]) -> dict[str, str]:
    return checked_attributes(elem, allowed, required, ParameterSyntaxError)


def _number(value: str, what: str, low: int, high: int) -> int:
    text = value.strip()
    if not text.isdigit() and not (text.startswith("-") and text[1:].isdigit()):
        raise ParameterSyntaxError(f"{what} {value[:20]!r} is not a number")
    if len(text) > 12:
        raise ParameterSyntaxError(f"{what} {value[:20]!r} is out of range")
    number = int(text)
    if not low <= number <= high:
        raise ParameterSyntaxError(f"{what} {number} is outside {low}..{high}")
    return number


def _trans_id(attrs: dict[str, str]) -> int:
    return _number(attrs["transID"], "transID", 1, MAX_TRANS_ID)


def _empty(elem: etree._Element) -> None:
    if len(elem) or (elem.text or "").strip():
        raise ParameterSyntaxError(f"<{elem.tag}> is empty by the DTD")


def decode_pubsub(content: bytes) -> PubsubOperation:
    """Parse one pubsub document; raise 500/501/553 as the module docstring says."""
    try:
        root = parse_hardened(content, max_bytes=MAX_PUBSUB_XML, max_depth=4,
                              what="pubsub document")
    except UnsafeXml as exc:
        raise SyntaxError_(str(exc)) from None
    tag = root.tag
    if tag in {"createtopic", "deletetopic"}:
        _empty(root)
        a = _attrs(root, {"topic", "transID"}, {"topic", "transID"})
        kind = CreateTopic if tag == "createtopic" else DeleteTopic
        return kind(a["topic"], _trans_id(a))
    if tag == "listtopics":
        _empty(root)
        a = _attrs(root, {"transID"}, set())
        return ListTopics(_trans_id(a) if "transID" in a else None)
    if tag == "subscribe":
        _empty(root)
        a = _attrs(root, {"subscriber", "topic", "transID", "duration", "link", "snapshot",
                          "batch", "cached"}, {"subscriber", "topic", "transID", "duration"})
        # A duration ≤ 0 is well-formed: the service answers it with 553 (§4.5 step 3).
        duration = _number(a["duration"], "duration", -MAX_SECONDS, MAX_SECONDS)
        link = validate_link_id(a["link"]) if "link" in a else None
        snapshot = a.get("snapshot", "false")
        if snapshot not in ("true", "false"):
            raise ParameterSyntaxError("snapshot is true or false")
        batch = _number(a["batch"], "batch", 1, MAX_BATCH_ITEMS) if "batch" in a else None
        return Subscribe(Endpoint.parse(a["subscriber"]), a["topic"], _trans_id(a), duration,
                         link, snapshot == "true", batch, bool(a.get("cached", "").strip()))
    if tag == "cancel":
        _empty(root)
        a = _attrs(root, {"subscriber", "topic", "transID"}, {"topic", "transID"})
        who = Endpoint.parse(a["subscriber"]) if "subscriber" in a else None
        return Cancel(a["topic"], _trans_id(a), who)
    if tag == "reply":
        if len(root):
            raise ParameterSyntaxError("<reply> holds only text")
        a = _attrs(root, {"code", "transID", "{http://www.w3.org/XML/1998/namespace}lang"},
                   {"code"})
        trans = _trans_id(a) if "transID" in a else None
        return Reply(_number(a["code"], "code", 100, 999), trans, (root.text or "").strip())
    if tag == "topiclist":
        a = _attrs(root, {"transID"}, set())
        names: list[str] = []
        for child in root:
            if child.tag != "topic":
                raise ParameterSyntaxError(f"<topiclist> holds <topic>s, not <{child.tag}>")
            _empty(child)
            names.append(_attrs(child, {"name"}, {"name"})["name"])
        return TopicList(tuple(names), _trans_id(a) if "transID" in a else None)
    raise ParameterSyntaxError(f"<{str(tag)[:40]}> is not a pubsub operation")


def _esc(value: str) -> str:
    return (value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("'", "&apos;"))


def _quote(value: str) -> str:
    return f"'{_esc(value)}'"


def _trans(trans_id: int | None) -> str:
    return "" if trans_id is None else f" transID='{trans_id}'"


def encode_pubsub(op: PubsubOperation) -> bytes:
    """The document for `op`, in the drafts' layout."""
    if isinstance(op, CreateTopic | DeleteTopic):
        tag = "createtopic" if isinstance(op, CreateTopic) else "deletetopic"
        text = f"<{tag} topic='{_esc(op.topic)}' transID='{op.trans_id}' />"
    elif isinstance(op, ListTopics):
        text = f"<listtopics{_trans(op.trans_id)} />"
    elif isinstance(op, Subscribe):
        text = (f"<subscribe subscriber='{_esc(str(op.subscriber))}' topic='{_esc(op.topic)}'"
                f" duration='{op.duration}' transID='{op.trans_id}'"
                f"{'' if op.link is None else f' link={_quote(op.link)}'}"
                f"{' snapshot=' + _quote('true') if op.snapshot else ''}"
                f"{'' if op.batch is None else f' batch={_quote(str(op.batch))}'}"
                f"{' cached=' + _quote('true') if op.cached else ''} />")
    elif isinstance(op, Cancel):
        who = "" if op.subscriber is None else f" subscriber='{_esc(str(op.subscriber))}'"
        text = f"<cancel{who} topic='{_esc(op.topic)}' transID='{op.trans_id}' />"
    elif isinstance(op, Reply):
        head = f"<reply code='{op.code}'{_trans(op.trans_id)}"
        text = f"{head}>{_esc(op.text)}</reply>" if op.text else f"{head} />"
    else:
        rows = "".join(f"<topic name='{_esc(n)}' />" for n in op.names)
        text = f"<topiclist{_trans(op.trans_id)}>{rows}</topiclist>"
    return text.encode("utf-8")
