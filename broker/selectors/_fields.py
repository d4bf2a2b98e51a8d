"""`extract_fields`: the selectable fields of one XML message, as the journal stores them.

Theory of operation
-------------------
selectors.md makes an identifier the local name of any element or attribute in the message
content (the children of `ps:content`, at any depth) or one of the six `ps:message-content`
headers. So a message reduces, once, to `{name: [instance, ...]}`: element values are their
text content (all descendant text, comments excluded) trimmed of XML whitespace, attribute
values are their text as the parser normalized it; instances are in document order, an
element before its own attributes. Both backends read only this map (the Spark column is
exactly it, as `map<string, array<string>>`), which is what makes their answers comparable,
and what lets the live path match stored fields without parsing XML again.

The message may be the whole `ps:message-content` document (recognized by its local name, since
the drafts use more than one namespace URI for `ps:`), a namespaced `ps:content` element, or the
bare content element itself (e.g. `<equity-quote>`), as bytes, str or an lxml element.

Parsing is hardened: no DTD loading, no entity expansion, no network, no huge trees, and any
DOCTYPE is refused outright (it has no legitimate use in a published message and is the
carrier of every XML bomb). Size, depth and instance count are capped (`_limits.py`).
"""

from __future__ import annotations

from typing import Any

from lxml import etree

from common.errors import InvalidMessage
from common.xml_safe import UnsafeXml, parse_hardened

from ._limits import DEFAULT_MAX_FIELD_INSTANCES, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_XML_DEPTH

__all__ = ["HEADER_FIELDS", "extract_fields", "parse_message"]

#: The `ps:message-content` headers selectors may name (draft §5.2).
HEADER_FIELDS = frozenset(
    {"topic", "publisher", "publication-date", "expiration-date", "message-id", "revision-id"}
)

_XML_SPACE = " \t\r\n"


def parse_message(message: bytes | str, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Any:
    """Parse one XML message with the hardened parser; InvalidMessage (561) if it is refused."""
    data = message.encode("utf-8") if isinstance(message, str) else message
    try:
        # extract_fields checks depth itself, counting only the content it reads.
        return parse_hardened(data, max_bytes=max_bytes, refuse_declarations=False,
                              what="message")
    except UnsafeXml as exc:
        raise InvalidMessage(str(exc)) from None


def _local(tag: Any) -> str | None:
    if not isinstance(tag, str):
        return None  # a comment or processing instruction
    return tag if tag[0] != "{" else etree.QName(tag).localname  # no namespace: the name


def extract_fields(
    message: bytes | str | Any,
    schema: Any = None,
    *,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_depth: int = DEFAULT_MAX_XML_DEPTH,
    max_instances: int = DEFAULT_MAX_FIELD_INSTANCES,
) -> dict[str, list[str]]:
    """The selectable fields of `message`: identifier -> instances, in document order.

    Args:
        message: the XML message (bytes, str, or an lxml element of `ps:message-content`,
            `ps:content` or the bare content).
        schema: a `SelectorSchema`; when given, only the names it declares are kept.

    Raises:
        InvalidMessage: (561) not well-formed, has a DOCTYPE, or exceeds a limit.
    """
    root = parse_message(message, max_bytes) if isinstance(message, bytes | str) else message
    keep = None if schema is None else frozenset(schema.types)
    fields: dict[str, list[str]] = {}
    count = 0

    def add(name: str, value: str) -> None:
        nonlocal count
        if keep is not None and name not in keep:
            return
        count += 1
        if count > max_instances:
            raise InvalidMessage(f"message has more than {max_instances} field instances")
        fields.setdefault(name, []).append(value)

    def walk(element: Any, depth: int) -> None:
        name = _local(element.tag)
        if name is None:
            return
        if depth > max_depth:
            raise InvalidMessage(f"message is nested deeper than {max_depth} elements")
        # An element's value is all its descendants' text: joined only when it is kept (a
        # topic's schema names a few fields; the root's text was the whole message, joined
        # and thrown away per publication: py-spy, W3, 2026-11-26).
        if keep is None or name in keep:
            add(name, "".join(element.itertext()).strip(_XML_SPACE))
        for attr, value in element.attrib.items():
            add(attr if attr[0] != "{" else etree.QName(attr).localname, value)
        for child in element:
            walk(child, depth + 1)

    name = _local(root.tag)
    if name == "message-content":
        for child in root:
            child_name = _local(child.tag)
            if child_name in HEADER_FIELDS:
                add(child_name, "".join(child.itertext()).strip(_XML_SPACE))
            elif child_name == "content":
                for item in child:
                    walk(item, 2)
    elif name == "content" and etree.QName(root.tag).namespace:
        for item in root:
            walk(item, 1)
    else:
        walk(root, 0)
    return fields
