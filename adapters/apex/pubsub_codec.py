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

import re
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
    "message_schema_element",
    "selector_schema_elements",
]

#: A management document is one element, a topiclist one per topic, a createtopic carries its
#: schemas (each at most broker/pubsub/schemas.py's 256 KiB); 1 MiB bounds them all.
MAX_PUBSUB_XML = 1024 * 1024
#: Deepest nesting: a createtopic's schemas nest (MAX_SCHEMA_DEPTH, 64, inside their two
#: wrapping elements); every other document is at most two deep, which the DTD checks below keep.
MAX_PUBSUB_DEPTH = 66
MAX_TRANS_ID = 2_147_483_647
#: %SECONDS; of the APEX core DTD.
MAX_SECONDS = 2_147_483_647
#: What a subscription id may be: the service's numbers, or (a subscription recorded before
#: ids existed) its topic's name.
SUBSCRIPTION_ID = re.compile(r"[\w.:=/@+-]{1,256}")


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """createtopic (content-based draft §6.2.3): the topic, and optionally its description,
    publishers, message schema and selector schemas. The schemas are the XML text of the
    `<message-schema>` and each `<selector-schema>` element, whole (the service reads them)."""

    topic: str
    trans_id: int
    description: str | None = None
    publishers: tuple[str, ...] = ()
    message_schema: str | None = None
    selector_schemas: tuple[str, ...] = ()


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
    #: draft-content §5.6: the `<selector class=…>` element's class and text (None: the
    #: subscription takes every message of the topic)
    selector_class: str | None = None
    selector: str | None = None

    def __post_init__(self) -> None:
        if self.batch is not None and (type(self.batch) is not int
                                       or not 1 <= self.batch <= MAX_BATCH_ITEMS):
            raise ParameterSyntaxError(f"batch is 1..{MAX_BATCH_ITEMS}")
        if (self.selector_class is None) != (self.selector is None):
            raise ParameterSyntaxError("a selector has a class and a text (maybe empty)")


@dataclass(frozen=True, slots=True)
class Cancel:
    """§4.6 / draft-content §5.8.2: by `subscription_id`; without one, every subscription of
    the subject to `topic`; with neither, all of the subject's subscriptions."""

    topic: str | None
    trans_id: int
    subscriber: Endpoint | None = None
    subscription_id: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    code: int
    trans_id: int | None = None
    text: str = ""
    #: the 250 to a subscribe names the subscription it made (draft-content §5.8)
    subscription_id: str | None = None


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
        root = parse_hardened(content, max_bytes=MAX_PUBSUB_XML, max_depth=MAX_PUBSUB_DEPTH,
                              what="pubsub document")
    except UnsafeXml as exc:
        raise SyntaxError_(str(exc)) from None
    tag = root.tag
    if tag == "createtopic":
        return _createtopic(root)
    if tag == "deletetopic":
        _empty(root)
        a = _attrs(root, {"topic", "transID"}, {"topic", "transID"})
        return DeleteTopic(a["topic"], _trans_id(a))
    if tag == "listtopics":
        _empty(root)
        a = _attrs(root, {"transID"}, set())
        return ListTopics(_trans_id(a) if "transID" in a else None)
    if tag == "subscribe":
        selector = _selector(root)
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
                         link, snapshot == "true", batch, bool(a.get("cached", "").strip()),
                         *selector)
    if tag == "cancel":
        sub_id = _subscription_id(root, "cancel")
        if (root.text or "").strip():
            raise ParameterSyntaxError("<cancel> holds at most a <subscription-id>")
        a = _attrs(root, {"subscriber", "topic", "transID"}, {"transID"})
        who = Endpoint.parse(a["subscriber"]) if "subscriber" in a else None
        return Cancel(a.get("topic"), _trans_id(a), who, sub_id)
    if tag == "reply":
        sub_id = _subscription_id(root, "reply")
        a = _attrs(root, {"code", "transID", "{http://www.w3.org/XML/1998/namespace}lang"},
                   {"code"})
        trans = _trans_id(a) if "transID" in a else None
        return Reply(_number(a["code"], "code", 100, 999), trans, (root.text or "").strip(),
                     sub_id)
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


def _selector(root: etree._Element) -> tuple[str | None, str | None]:
    """The subscribe's `<selector class=…>` (or the DTD's `<select>`), if any: (class, text)."""
    if (root.text or "").strip():
        raise ParameterSyntaxError("<subscribe> holds at most a <selector>")
    children = list(root)
    if not children:
        return None, None
    child = children[0]
    if len(children) > 1 or child.tag not in ("selector", "select") \
            or (child.tail or "").strip():
        raise ParameterSyntaxError("<subscribe> holds at most one <selector>")
    if len(child):
        raise ParameterSyntaxError("<selector> holds the selector's text only")
    a = _attrs(child, {"class", "Name", "dtd"}, {"class"})
    return a["class"], child.text or ""


def _subscription_id(root: etree._Element, what: str) -> str | None:
    """The one `<subscription-id>` child of a cancel or reply, if any."""
    children = list(root)
    if not children:
        return None
    child = children[0]
    if len(children) > 1 or child.tag != "subscription-id" or len(child) \
            or (child.tail or "").strip():
        raise ParameterSyntaxError(f"<{what}> holds at most one <subscription-id>")
    _attrs(child, set(), set())
    value = (child.text or "").strip()
    if not SUBSCRIPTION_ID.fullmatch(value):
        raise ParameterSyntaxError(f"subscription-id {value[:40]!r} is not one")
    return value


#: createtopic's children in the DTD's order (docs/apexps-pubsub.dtd); `topic-name` and
#: `disposition` belong to messages on the Topics topic and are implied by the operation.
_CREATETOPIC_ORDER = {"publisher": 0, "description": 1, "message-schema": 2, "selector-schema": 3}
_ONCE = frozenset({"description", "message-schema"})


def _createtopic(root: etree._Element) -> CreateTopic:
    a = _attrs(root, {"topic", "transID"}, {"topic", "transID"})
    if (root.text or "").strip():
        raise ParameterSyntaxError("<createtopic> holds elements, not text")
    description, message_schema, last = None, None, -1
    publishers: list[str] = []
    schemas: list[str] = []
    for child in root:
        tag = child.tag if isinstance(child.tag, str) else ""
        place = _CREATETOPIC_ORDER.get(tag)
        if place is None:
            raise ParameterSyntaxError(f"<createtopic> does not hold <{tag[:40]}>")
        if place < last or (place == last and tag in _ONCE):
            raise ParameterSyntaxError(f"<{tag}> is out of the DTD's order or repeated")
        last = place
        if tag == "publisher":
            # The DTD's EMPTY element with `endpoint`; the draft's §6.2.3 example gives the
            # endpoint as text. Either is read; apexps records neither yet.
            attrs = _attrs(child, {"endpoint", "info"}, set())
            publishers.append(attrs.get("endpoint") or (child.text or "").strip())
        elif tag == "description":
            if len(child):
                raise ParameterSyntaxError("<description> holds only text")
            description = " ".join((child.text or "").split())
        elif tag == "message-schema":
            _attrs(child, {"uri"}, set())
            message_schema = etree.tostring(child, encoding="unicode", with_tail=False)
        else:
            _attrs(child, {"uri", "class"}, set())
            schemas.append(etree.tostring(child, encoding="unicode", with_tail=False))
    return CreateTopic(a["topic"], _trans_id(a), description, tuple(publishers),
                       message_schema, tuple(schemas))


def _esc(value: str) -> str:
    return (value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("'", "&apos;"))


def _quote(value: str) -> str:
    return f"'{_esc(value)}'"


def _trans(trans_id: int | None) -> str:
    return "" if trans_id is None else f" transID='{trans_id}'"


def encode_pubsub(op: PubsubOperation) -> bytes:
    """The document for `op`, in the drafts' layout."""
    if isinstance(op, CreateTopic):
        text = _encode_createtopic(op)
    elif isinstance(op, DeleteTopic):
        text = f"<deletetopic topic='{_esc(op.topic)}' transID='{op.trans_id}' />"
    elif isinstance(op, ListTopics):
        text = f"<listtopics{_trans(op.trans_id)} />"
    elif isinstance(op, Subscribe):
        text = (f"<subscribe subscriber='{_esc(str(op.subscriber))}' topic='{_esc(op.topic)}'"
                f" duration='{op.duration}' transID='{op.trans_id}'"
                f"{'' if op.link is None else f' link={_quote(op.link)}'}"
                f"{' snapshot=' + _quote('true') if op.snapshot else ''}"
                f"{'' if op.batch is None else f' batch={_quote(str(op.batch))}'}"
                f"{' cached=' + _quote('true') if op.cached else ''}")
        if op.selector_class is None:
            text += " />"
        else:
            text += (f"><selector class={_quote(op.selector_class)}>{_esc(op.selector or '')}"
                     "</selector></subscribe>")
    elif isinstance(op, Cancel):
        who = "" if op.subscriber is None else f" subscriber='{_esc(str(op.subscriber))}'"
        topic = "" if op.topic is None else f" topic='{_esc(op.topic)}'"
        head = f"<cancel{who}{topic} transID='{op.trans_id}'"
        text = f"{head} />" if op.subscription_id is None else \
            f"{head}><subscription-id>{_esc(op.subscription_id)}</subscription-id></cancel>"
    elif isinstance(op, Reply):
        head = f"<reply code='{op.code}'{_trans(op.trans_id)}"
        sub_id = "" if op.subscription_id is None else \
            f"<subscription-id>{_esc(op.subscription_id)}</subscription-id>"
        text = f"{head}>{_esc(op.text)}{sub_id}</reply>" if op.text or sub_id else f"{head} />"
    else:
        rows = "".join(f"<topic name='{_esc(n)}' />" for n in op.names)
        text = f"<topiclist{_trans(op.trans_id)}>{rows}</topiclist>"
    return text.encode("utf-8")


def _encode_createtopic(op: CreateTopic) -> str:
    head = f"<createtopic topic='{_esc(op.topic)}' transID='{op.trans_id}'"
    body = "".join(f"<publisher endpoint={_quote(p)} />" for p in op.publishers)
    if op.description is not None:
        body += f"<description>{_esc(op.description)}</description>"
    # The schemas are XML already (the element, whole): they go in as they are.
    body += (op.message_schema or "") + "".join(op.selector_schemas)
    return f"{head}>{body}</createtopic>" if body else f"{head} />"


#: `uri` of a message schema registered by name (broker/pubsub/schemas.py NAMED_SCHEMA_PREFIX):
#: the message schema of the existing topic NAME.
NAMED_SCHEMA_URI = "apexps:topic/"


def message_schema_element(source: bytes | None = None, *, named: str | None = None) -> str:
    """The `<message-schema>` element for createtopic: from an XML Schema document (an
    xs:schema, or a `<message-schema>` element as the draft writes it), or naming the topic
    whose message schema the new topic takes. ParameterSyntaxError if `source` is neither."""
    if named is not None:
        return f"<message-schema uri={_quote(NAMED_SCHEMA_URI + named)} />"
    root = _schema_file(source or b"")
    if etree.QName(root).localname == "schema":
        return ("<message-schema>" + etree.tostring(root, encoding="unicode")
                + "</message-schema>")
    if root.tag == "message-schema":
        return etree.tostring(root, encoding="unicode")
    raise ParameterSyntaxError(f"a message schema is an xs:schema, not <{root.tag}>")


def selector_schema_elements(source: bytes) -> tuple[str, ...]:
    """The `<selector-schema class=…>` elements of a file holding one, or several inside a
    `<selector-schemas>` element (as a topic record stores them)."""
    root = _schema_file(source)
    found = list(root) if root.tag == "selector-schemas" else [root]
    if not found or any(e.tag != "selector-schema" for e in found):
        raise ParameterSyntaxError("a selector schema file holds <selector-schema class=…>")
    return tuple(etree.tostring(e, encoding="unicode", with_tail=False) for e in found)


def _schema_file(source: bytes) -> etree._Element:
    try:
        return parse_hardened(source, max_bytes=MAX_PUBSUB_XML, max_depth=MAX_PUBSUB_DEPTH,
                              what="schema file")
    except UnsafeXml as exc:
        raise ParameterSyntaxError(str(exc)) from None
