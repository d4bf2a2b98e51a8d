"""A topic's message schema (content-based draft §5.3) and selector schemas (§5.5).

Theory of operation
-------------------
A topic may carry a message schema, an XML Schema every publication to it must satisfy (561,
`MessageNotConforming`, when one does not), and selector schemas, naming what subscribers may
select on and with which selector classes (567 / 566 when a selector does not fit). Both arrive
inline in `createtopic`; `prepare` turns them into the text the topic record stores, refusing
(553, `InvalidSchema`) anything that does not compile, so a bad schema never makes a topic.
`TopicSchemas.of(topic)` compiles what a record holds, once per topic revision (`_CACHE`).

A schema never reads anything outside its own text. Three guards, each enough alone:

1. the schema document goes through the one hardened parser (`common.xml_safe`: size cap, no
   DOCTYPE or ENTITY, no network, bounded depth);
2. `xs:include`, `xs:import`, `xs:redefine` and `xs:override` are refused before compiling, as
   is a `uri` attribute on `<message-schema>` / `<selector-schema>`: a topic's schema is
   self-contained. A schema "registered by name" is the message schema of a topic that already
   exists (`uri='apexps:topic/NAME'`), copied into the new topic's record by `prepare`, so a
   restart needs nothing but the record itself;
3. the compile runs on a parser whose resolver answers every load with a refusal: a reference
   guard 2 missed reaches neither a file nor the network, and is reported as refused.

Cost. The schema's author holds `pubsub:createtopic`, the message's author only `core:data`, and
validation runs once per publication, so what makes libxml2's validator backtrack is refused at
createtopic. Its content-model automata backtrack when a repeating particle holds another one in
the same content model: `(c*|d)*` took 1.2 s on 40 elements, `(c{0,100}){0,100}` 0.7 s on
5,000, `((c|d)*)*` 1.6 s on 100 — per element whose model it is, so a message of many such
elements costs minutes; so nested repetition is refused, and one repeating particle per path
of a content model (`(c|d)*`, `c{0,100000}`, `(c*, d)`) is linear and accepted. Its regular
expressions backtrack over a quantified group (`xs:pattern value='(a|aa)*b'`: 0.4 s per value
before libxml2 gives up), so such patterns are refused too. A message is refused by size
before it is parsed (`DEFAULT_MAX_MESSAGE_BYTES`, by ingest's one parse, whose tree `validate`
takes); what remains is linear in the message.

What is validated: the message body (§5.2) — the one element inside `ps:content` of a
`ps:message-content` document, or the document element of a bare body. The default message
schema (§5.3.2) is `message-content` enclosing anything: every message conforms, so a topic
without a message schema validates nothing. The default selector schema (§5.5.1) is the message
schema itself plus the six `ps:message-content` headers (§8.2 types them); a topic with neither
has no selector schema, and selectors may name anything, untyped.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from lxml import etree

from broker import selectors
from broker.records import Topic
from broker.selectors import FieldType, Selector, SelectorClass, SelectorSchema
from common.errors import (
    InvalidMessage,
    InvalidSchema,
    MessageNotConforming,
    UnsupportedSelectorClass,
)
from common.xml_safe import UnsafeXml, parse_hardened

__all__ = [
    "HEADER_TYPES",
    "MAX_SCHEMA_BYTES",
    "NAMED_SCHEMA_PREFIX",
    "MessageSchema",
    "TopicSchemas",
    "check_selector",
    "compile_message_schema",
    "message_body",
    "prepare",
]

#: Largest schema text accepted (553 beyond): a hand-written topic schema is a few KB; the
#: largest public industry schemas (FpML's, whole) run to a few hundred KB, and are not one
#: topic's message.
MAX_SCHEMA_BYTES = 256 * 1024
#: Deepest element nesting in a schema document: XSD nests a declaration about four levels
#: per level of the message it describes; 64 leaves room for any hand-written schema.
MAX_SCHEMA_DEPTH = 64
#: `uri` of a schema registered by name: the message schema of the topic NAME.
NAMED_SCHEMA_PREFIX = "apexps:topic/"

XSD = "http://www.w3.org/2001/XMLSchema"
#: The drafts' own examples (§8) use the 2000/10 candidate recommendation's namespace; its
#: vocabulary is the same for everything a topic schema uses, so it is read as XSD 1.0.
_XSD_2000 = "http://www.w3.org/2000/10/XMLSchema"
_REFERENCES = frozenset({"include", "import", "redefine", "override"})
_PARTICLES = frozenset({"element", "sequence", "choice", "all", "any", "group"})
_CLASSES = frozenset(c.value for c in SelectorClass)
#: a group closed and then quantified: `(...)*`, `(...)+`, `(...)?`, `(...){n,m}`
_QUANTIFIED_GROUP = re.compile(r"(?<!\\)\)(?:[*+?]|\{\d+(?:,\d*)?\})")

#: §8.2: the ps:message-content headers and their XML Schema types.
HEADER_TYPES = MappingProxyType({
    "topic": FieldType.STRING, "publisher": FieldType.STRING,
    "publication-date": FieldType.STRING, "expiration-date": FieldType.STRING,
    "message-id": FieldType.NUMBER, "revision-id": FieldType.NUMBER,
})


def _local(tag: Any) -> str | None:
    return etree.QName(tag).localname if isinstance(tag, str) else None


def _is_xsd(tag: Any) -> bool:
    return isinstance(tag, str) and etree.QName(tag).namespace in (XSD, _XSD_2000)


# --- compiling, never reading outside the text ------------------------------------------------


class _Refuse(etree.Resolver):
    """Answers every load libxml2 asks for with a document that is no schema, and remembers
    what was asked: nothing a schema names is ever read."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def resolve(self, system_url: str, public_id: str,  # type: ignore[override]
                context: Any) -> Any:
        self.asked.append(str(system_url))
        return self.resolve_string("<refused/>", context)  # type: ignore[call-arg]


def _parse_schema(data: bytes) -> etree._Element:
    try:
        return parse_hardened(data, max_bytes=MAX_SCHEMA_BYTES, max_depth=MAX_SCHEMA_DEPTH,
                              what="schema")
    except UnsafeXml as exc:
        raise InvalidSchema(str(exc)) from None


def _repeats(node: etree._Element) -> bool:
    value = (node.get("maxOccurs") or "1").strip()
    if value == "unbounded":
        return True
    if not value.isdigit() or len(value) > 9:
        raise InvalidSchema(f"maxOccurs {value[:20]!r} is not a number up to 10^9")
    return int(value) > 1


def _model_repeats(top: etree._Element, repeating_groups: set[str]) -> bool:
    """Whether a repeating particle is in `top`'s content model (an element's type is not)."""
    stack = list(top)
    while stack:
        node = stack.pop()
        name = _local(node.tag)
        if name is None or not _is_xsd(node.tag):
            continue
        if name in _PARTICLES and (_repeats(node) or _ref(node) in repeating_groups):
            return True
        if name != "element":
            stack.extend(node)
    return False


def _ref(node: etree._Element) -> str:
    return (node.get("ref") or "").rpartition(":")[2] if _local(node.tag) == "group" else ""


def _repeating_groups(root: etree._Element) -> set[str]:
    """Top-level xs:group definitions with repetition inside, through references too."""
    groups = {g.get("name", ""): g for g in root
              if _local(g.tag) == "group" and _is_xsd(g.tag) and g.get("name")}
    found: set[str] = set()
    changed = True
    while changed:  # a fixpoint: a group is repeating if a group it refers to is
        changed = False
        for name, group in groups.items():
            if name not in found and _model_repeats(group, found):
                found.add(name)
                changed = True
    return found


def _check_costs(root: etree._Element) -> None:
    """Guard 2 and the cost bounds of the module docstring, in one walk (no recursion).
    The flag carried down says a repeating particle encloses the node in its content model;
    an element's own type is a new content model; a reference to a group with repetition
    inside counts as repeating."""
    repeating_groups = _repeating_groups(root) if _local(root.tag) == "schema" else set()
    stack: list[tuple[etree._Element, bool]] = [(root, False)]
    while stack:
        node, inside_repeat = stack.pop()
        name = _local(node.tag)
        if name is None or not _is_xsd(node.tag):
            stack.extend((child, inside_repeat) for child in node)
            continue
        if name in _REFERENCES:
            where = node.get("schemaLocation") or node.get("namespace") or ""
            raise InvalidSchema(f"xs:{name} {where[:80]!r} refused: a topic's schema is"
                                " self-contained (apexps reads no file and no URL)")
        if name == "pattern" and _QUANTIFIED_GROUP.search(node.get("value") or ""):
            raise InvalidSchema(f"xs:pattern {node.get('value', '')[:60]!r} quantifies a"
                                " group; libxml2 may backtrack exponentially over it")
        if name in _PARTICLES and _repeats(node) and _ref(node) in repeating_groups:
            raise InvalidSchema(f"xs:group {_ref(node)!r} repeats at line {node.sourceline} and"
                                " repeats inside; libxml2 may backtrack exponentially over it")
        if name in _PARTICLES and (_repeats(node) or _ref(node) in repeating_groups):
            if inside_repeat:
                raise InvalidSchema(
                    f"xs:{name} at line {node.sourceline} repeats inside a repeating particle;"
                    " libxml2 may backtrack exponentially over such a content model")
            inside_repeat = name != "element"
        elif name == "element":
            inside_repeat = False
        stack.extend((child, inside_repeat) for child in node)


@dataclass(frozen=True, slots=True, eq=False)
class MessageSchema:
    """A compiled message schema; `validate` is safe to call from any thread."""

    #: the standalone xs:schema document, as the topic record stores it
    text: str
    _schema: etree.XMLSchema
    _lock: threading.Lock

    def validate(self, message: bytes | etree._Element) -> None:
        """None if `message` (its XML, or its parsed document element) conforms.

        Raises:
            MessageNotConforming: (561) it does not; the text names the first violation.
            InvalidMessage: (561) it is not a message at all (not XML, too large, a DOCTYPE).
        """
        root = message if isinstance(message, etree._Element) else parse_message(message)
        body = message_body(root)
        with self._lock:  # an XMLSchema keeps its error log on itself
            try:
                ok = self._schema.validate(body)
            except etree.XMLSchemaValidateError as exc:  # libxml2 gave up (a limit it keeps)
                raise MessageNotConforming(f"validation gave up: {exc}") from None
            if not ok:
                first = self._schema.error_log[0]  # type: ignore[index]  # (lxml-stubs lack it)
                raise MessageNotConforming(f"{first.message[:200]} (line {first.line})")


def parse_message(data: bytes) -> etree._Element:
    """The hardened parse of a publication: refused by size before lxml reads a byte.

    The one place the publish path parses for validation; once ingest parses each message
    for its headers and fields, its tree is passed to `validate` instead.
    """
    try:
        return parse_hardened(data, max_bytes=selectors.DEFAULT_MAX_MESSAGE_BYTES,
                              max_depth=selectors.DEFAULT_MAX_XML_DEPTH,
                              refuse_declarations=False, what="message")
    except UnsafeXml as exc:
        raise InvalidMessage(str(exc)) from None


def message_body(root: etree._Element) -> etree._Element:
    """The element a message schema describes (§5.2): inside `ps:content`, or `root` itself."""
    name = _local(root.tag)
    if name == "content" and etree.QName(root.tag).namespace:
        return _one_item(root)
    if name != "message-content":
        return root
    for child in root:
        if _local(child.tag) == "content":
            return _one_item(child)
    raise MessageNotConforming("ps:message-content has no ps:content")


def _one_item(content: etree._Element) -> etree._Element:
    items = [item for item in content if isinstance(item.tag, str)]
    if len(items) != 1:
        raise MessageNotConforming(f"ps:content holds {len(items)} elements, not one")
    return items[0]


def compile_message_schema(text: str | bytes) -> MessageSchema:
    """Compile a standalone xs:schema document; InvalidSchema (553) if refused."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    data = data.replace(_XSD_2000.encode(), XSD.encode())
    root = _parse_schema(data)
    if root.tag != f"{{{XSD}}}schema":
        raise InvalidSchema(f"a message schema is an xs:schema, not <{_local(root.tag)}>")
    _check_costs(root)
    refuse = _Refuse()
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                             huge_tree=False)
    parser.resolvers.add(refuse)
    try:
        schema = etree.XMLSchema(etree.fromstring(data, parser))
    except etree.XMLSchemaParseError as exc:
        if refuse.asked:
            raise InvalidSchema(f"{refuse.asked[0][:80]!r} refused: a topic's schema is"
                                " self-contained") from None
        raise InvalidSchema(f"not a usable XML Schema: {str(exc)[:200]}") from None
    if refuse.asked:
        raise InvalidSchema(f"{refuse.asked[0][:80]!r} refused: a topic's schema is"
                            " self-contained")
    return MessageSchema(data.decode("utf-8"), schema, threading.Lock())


# --- createtopic: what the record stores -----------------------------------------------------


def _standalone(element: etree._Element) -> str:
    """The xs:schema document of a `<message-schema>`: its xs:schema child, or its top-level
    declarations wrapped in one (the draft's §5.3.1 form)."""
    children = [c for c in element if isinstance(c.tag, str)]
    if len(children) == 1 and _local(children[0].tag) == "schema" and _is_xsd(children[0].tag):
        return etree.tostring(children[0], encoding="unicode")
    if not children or not all(_is_xsd(c.tag) for c in children):
        raise InvalidSchema("<message-schema> holds an xs:schema or XML Schema declarations")
    # Every prefix in scope stays declared: QNames in attribute values (type='xsd:string')
    # use them, and lxml keeps only the declarations element names need.
    nsmap = dict(element.nsmap)
    if XSD not in nsmap.values():
        nsmap["xs" if "xs" not in nsmap else "apexps-xs"] = XSD
    schema = etree.Element(f"{{{XSD}}}schema", nsmap=nsmap)  # type: ignore[arg-type]
    for child in children:
        schema.append(etree.fromstring(etree.tostring(child)))
    return etree.tostring(schema, encoding="unicode")


def prepare(message_schema: str | None, selector_schemas: Iterable[str] = (), *,
            named: Callable[[str], Topic | None] = lambda name: None,
            ) -> tuple[str | None, str | None]:
    """What a topic record stores for createtopic's `<message-schema>` and `<selector-schema>`
    elements (their XML text): the standalone message schema and the selector schemas.

    `named(topic)` looks up a topic for `uri='apexps:topic/NAME'`. Raises InvalidSchema (553)
    for anything refused and UnsupportedSelectorClass (566) for a class apexps lacks.
    """
    message = None
    if message_schema is not None:
        element = _parse_schema(message_schema.encode("utf-8"))
        uri = element.get("uri")
        message = _by_name(uri, named) if uri is not None else _standalone(element)
        compile_message_schema(message)
    elements = [_parse_schema(s.encode("utf-8")) for s in selector_schemas]
    for element in elements:
        if element.get("uri") is not None:
            raise InvalidSchema("a selector schema is given inline: apexps fetches no uri")
        if _local(element.tag) != "selector-schema":
            raise InvalidSchema(f"<{_local(element.tag)}> is not a <selector-schema>")
        for name in (element.get("class") or "").split():
            if name not in _CLASSES:
                raise UnsupportedSelectorClass(
                    f"selector class {name!r} is not one apexps implements: "
                    + ", ".join(c.value for c in SelectorClass))
        _check_costs(element)
    if not elements:
        return message, None
    if len(elements) == 1:
        return message, etree.tostring(elements[0], encoding="unicode")
    wrapper = etree.Element("selector-schemas")
    wrapper.extend(elements)
    return message, etree.tostring(wrapper, encoding="unicode")


def _by_name(uri: str, named: Callable[[str], Topic | None]) -> str:
    if not uri.startswith(NAMED_SCHEMA_PREFIX):
        raise InvalidSchema(f"uri {uri[:80]!r} refused: apexps fetches no schema; give it inline"
                            f" or name a topic's ({NAMED_SCHEMA_PREFIX}NAME)")
    name = uri[len(NAMED_SCHEMA_PREFIX):]
    topic = named(name)
    if topic is None or topic.message_schema is None:
        raise InvalidSchema(f"no topic {name!r} with a message schema to take it from")
    return topic.message_schema


# --- a topic's schemas, compiled once per revision --------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicSchemas:
    """What one topic revision's schemas decide."""

    #: validates publications; None: the default schema (§5.3.2), every message conforms
    message: MessageSchema | None
    #: what selectors may name and how it is typed; None: anything, untyped
    selector: SelectorSchema | None

    @staticmethod
    def of(topic: Topic) -> TopicSchemas:
        """The compiled schemas of `topic` (cached per name, revision and creation)."""
        key = (topic.name, topic.revision, topic.created_at)
        with _CACHE_LOCK:
            found = _CACHE.get(key)
        if found is not None and found[0] == (topic.message_schema, topic.selector_schema):
            return found[1]
        made = _compile_topic(topic)
        with _CACHE_LOCK:
            if len(_CACHE) >= _CACHE_SIZE:
                _CACHE.clear()
            _CACHE[key] = ((topic.message_schema, topic.selector_schema), made)
        return made

    def validate(self, message: bytes | etree._Element) -> None:
        """`MessageSchema.validate`, or nothing for a topic without a message schema."""
        if self.message is not None:
            self.message.validate(message)


_CACHE_SIZE = 4096
_CACHE: dict[tuple[str, int, int], tuple[tuple[str | None, str | None], TopicSchemas]] = {}
_CACHE_LOCK = threading.Lock()


def _compile_topic(topic: Topic) -> TopicSchemas:
    message = (None if topic.message_schema is None
               else compile_message_schema(topic.message_schema))
    declared = (None if topic.selector_schema is None
                else selectors.parse_selector_schema(topic.selector_schema))
    if declared is not None and declared.types:
        return TopicSchemas(message, declared)
    classes = None if declared is None else declared.classes
    if message is None:
        # No names anywhere: only the classes (if any were listed) constrain selectors.
        return TopicSchemas(None, None if classes is None else _untyped(classes))
    from_message = selectors.parse_selector_schema(message.text)
    types = {**HEADER_TYPES, **from_message.types}
    return TopicSchemas(message, SelectorSchema(MappingProxyType(types), classes))


def _untyped(classes: frozenset[str]) -> SelectorSchema:
    # A schema whose only content is its classes: `check_selector` reads `types` as "no names
    # declared", i.e. untyped.
    return SelectorSchema(MappingProxyType({}), classes)


def check_selector(selector: Selector, schema: TopicSchemas | SelectorSchema | None) -> Selector:
    """`selector` recompiled against a topic's selector schema, for subscribe (§5.8.1).

    Returns the selector typed by the schema (what the subscription should evaluate).

    Raises:
        UnsupportedSelectorClass: (566) the topic lists classes and this is not one of them.
        SelectorError: (567) the selector names a field the schema does not offer, or uses
            one with the wrong type.
    """
    if isinstance(schema, TopicSchemas):
        schema = schema.selector
    if schema is None:
        return selector
    klass = selector.selector_class.value
    if schema.classes is not None and klass not in schema.classes:
        raise UnsupportedSelectorClass(
            f"this topic offers selector classes {', '.join(sorted(schema.classes))},"
            f" not {klass!r}")
    if not schema.types:
        return selector
    return selectors.compile(klass, selector.text, schema)
