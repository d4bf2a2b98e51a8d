"""Selector schemas (draft §5.5): which names a topic lets selectors use, and their types.

A selector schema is an XML Schema fragment, usually wrapped in `<selector-schema class=…>`.
Only what selection needs is read: the `name` and `type` of every `xs:element` and
`xs:attribute`, at any depth. Types map to `FieldType` by their local name (the drafts use both
the 2000/10 and 2001 XML Schema namespaces, and both `xs:` and `xsd:` prefixes); an element with
no `type` (a complexType container) is a string, its value being its text content. A name
declared twice with different types is left untyped (typed by context, as without a schema),
rather than guessing which declaration a message follows.

The `class` attribute of each `<selector-schema>` element names a selector class the schema is
offered for (§5.5: "must refer to a particular message selector class"); a topic may list
several (`<selector-schemas>` wraps them when stored). apexps reads the union: one set of names
for every class listed. `classes` is None when the source names no class (any class may use it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from lxml import etree

from common.errors import SelectorError

from ._ast import FieldType
from ._fields import parse_message

__all__ = ["NUMERIC_TYPES", "SelectorSchema", "parse_selector_schema"]

#: XML Schema built-in types read as numbers.
NUMERIC_TYPES = frozenset({
    "decimal", "integer", "int", "long", "short", "byte", "double", "float",
    "nonNegativeInteger", "positiveInteger", "negativeInteger", "nonPositiveInteger",
    "unsignedLong", "unsignedInt", "unsignedShort", "unsignedByte",
})


@dataclass(frozen=True, slots=True)
class SelectorSchema:
    """The selectable names of a topic and how each is typed."""

    #: identifier -> FieldType; a name absent here is an error (567) in a selector.
    types: Mapping[str, FieldType] = field(default_factory=lambda: MappingProxyType({}))
    #: the selector classes the schema is offered for; None: any class.
    classes: frozenset[str] | None = None


def _field_type(type_name: str | None) -> FieldType:
    if type_name is None:
        return FieldType.STRING
    local = type_name.rsplit(":", 1)[-1]
    if local in NUMERIC_TYPES:
        return FieldType.NUMBER
    if local == "boolean":
        return FieldType.BOOLEAN
    return FieldType.STRING


def parse_selector_schema(source: bytes | str | Any) -> SelectorSchema:
    """Read a selector schema from XML text or an lxml element; SelectorError if unreadable."""
    if isinstance(source, bytes | str):
        try:
            root = parse_message(source)
        except Exception as exc:  # InvalidMessage: report it as the selector problem it is
            raise SelectorError(f"unreadable selector schema: {exc}") from exc
    else:
        root = source
    types: dict[str, FieldType] = {}
    classes: set[str] = set()
    for node in root.iter():
        if not isinstance(node.tag, str):
            continue
        kind = etree.QName(node.tag).localname
        if kind == "selector-schema":
            classes.update((node.get("class") or "").split())
            continue
        name = node.get("name")
        if kind not in ("element", "attribute") or not name:
            continue
        ftype = _field_type(node.get("type"))
        previous = types.setdefault(name, ftype)
        if previous is not ftype:
            types[name] = FieldType.TEXT
    return SelectorSchema(MappingProxyType(types), frozenset(classes) if classes else None)
