"""Message selectors: classes "JMS" and "RFC-2254", one meaning, two backends.

Compile once, at subscribe time; evaluate as often as messages arrive:

    >>> from broker import selectors
    >>> sel = selectors.compile("JMS", "symbol IN ('XMPL', 'TEST') AND net-change-pct > 5.0")
    >>> sel.matches(b"<equity-quote symbol='XMPL'><net-change-pct>10.0</net-change-pct>"
    ...             b"</equity-quote>")
    True
    >>> sorted(sel.fields)
    ['net-change-pct', 'symbol']

`compile` raises `SelectorError` (reply 567, with `position` and `reason`) for an incorrect
selector and `UnsupportedSelectorClass` (566) for an unknown class; a compiled `Selector`
never raises while evaluating. `extract_fields` reduces a message to the field map the journal
stores, which `Selector.matches_fields` reads without parsing XML again, and which Spark jobs
read as a `map<string, array<string>>` column (`Selector.to_spark`). The semantics are
selectors.md's; `_ast.py` describes the shared tree both classes compile to.

Everything in `__all__` is public; the underscore modules are not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from common.errors import SelectorError, UnsupportedSelectorClass

from ._ast import And, Atom, Cond, FieldType, Not, Or, fields_of
from ._eval import compile_condition
from ._fields import HEADER_FIELDS, extract_fields
from ._index import SubscriptionIndex
from ._jms import parse_jms
from ._ldap import parse_ldap
from ._limits import (
    DEFAULT_MAX_ATOMS,
    DEFAULT_MAX_BINDINGS,
    DEFAULT_MAX_FIELD_INSTANCES,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_NESTING,
    DEFAULT_MAX_SELECTOR_LENGTH,
    DEFAULT_MAX_XML_DEPTH,
)
from ._schema import SelectorSchema, parse_selector_schema
from ._spark import FIELDS_TYPE_DDL, condition_column, condition_sql

__all__ = [
    "DEFAULT_MAX_ATOMS",
    "DEFAULT_MAX_BINDINGS",
    "DEFAULT_MAX_FIELD_INSTANCES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_NESTING",
    "DEFAULT_MAX_SELECTOR_LENGTH",
    "DEFAULT_MAX_XML_DEPTH",
    "FIELDS_TYPE_DDL",
    "HEADER_FIELDS",
    "FieldType",
    "Selector",
    "SelectorClass",
    "SelectorSchema",
    "SubscriptionIndex",
    "compile",
    "extract_fields",
    "parse_selector_schema",
]


class SelectorClass(StrEnum):
    """The selector classes this broker implements (draft §7.2, §7.3)."""

    #: JMS 1.1 message selectors over XML identifiers.
    JMS = "JMS"
    #: LDAP string filters (RFC 2254 / RFC 4515) with the project's extensions.
    RFC_2254 = "RFC-2254"


_PARSERS: dict[SelectorClass, Callable[[str, Mapping[str, FieldType] | None], Cond]] = {
    SelectorClass.JMS: parse_jms,
    SelectorClass.RFC_2254: parse_ldap,
}


@dataclass(frozen=True, slots=True, eq=False)
class Selector:
    """A compiled selector. Immutable and safe to share between subscriptions and threads."""

    #: The class it was compiled as.
    selector_class: SelectorClass
    #: The selector text as given.
    text: str
    #: The compiled condition tree (`_ast.py`), read by both backends.
    condition: Cond
    #: The identifiers the selector reads.
    fields: frozenset[str]
    _evaluate: Callable[[Mapping[str, Sequence[str]]], bool | None] = field(repr=False)

    def evaluate(self, fields: Mapping[str, Sequence[str]]) -> bool | None:
        """The three-valued result over stored fields: True, False, or None for UNKNOWN."""
        return self._evaluate(fields)

    def matches_fields(self, fields: Mapping[str, Sequence[str]]) -> bool:
        """Whether the selector matches a message's stored fields (UNKNOWN does not match)."""
        return self._evaluate(fields) is True

    def matches(self, message: bytes | str | Any, schema: SelectorSchema | None = None) -> bool:
        """Whether the selector matches an XML message (bytes, str or lxml element).

        Raises:
            InvalidMessage: (561) the XML itself is refused; evaluation never raises.
        """
        return self._evaluate(extract_fields(message, schema)) is True

    def to_spark(self, fields_column: str = "fields") -> Any:
        """A Spark boolean Column over the named `map<string,array<string>>` column.

        NULL is UNKNOWN, so `df.filter(sel.to_spark())` keeps exactly the rows the live path
        matches. Imports pyspark on first use; `to_spark_sql` gives the same as SQL text.
        """
        return condition_column(self.condition, _quote_column(fields_column))

    def to_spark_sql(self, fields_column: str = "fields") -> str:
        """The Spark SQL text of `to_spark` (for `expr()`, SQL queries, or reading)."""
        return condition_sql(self.condition, _quote_column(fields_column))


def _quote_column(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def compile(
    selector_class: str,
    text: str,
    schema: SelectorSchema | str | bytes | None = None,
) -> Selector:
    """Compile a selector of `selector_class` ("JMS" or "RFC-2254"), once.

    Args:
        selector_class: the class named in the subscribe request's `selector` element.
        text: the selector text; empty (or only whitespace) selects every message.
        schema: the topic's selector schema (a `SelectorSchema` or its XML); when given, names
            outside it are errors and declared types drive comparisons.

    Raises:
        UnsupportedSelectorClass: (566) the class is not one of SelectorClass.
        SelectorError: (567) the text is incorrect, or over a limit (`_limits.py`: length,
            nesting, predicates); `.position` and `.reason` say where and why.
    """
    try:
        klass = SelectorClass(selector_class)
    except ValueError:
        raise UnsupportedSelectorClass(
            f"unsupported message selector class {selector_class!r}; this broker supports "
            + ", ".join(repr(c.value) for c in SelectorClass)
        ) from None
    if len(text) > DEFAULT_MAX_SELECTOR_LENGTH:
        raise SelectorError(
            f"selector is {len(text)} characters long; the limit is {DEFAULT_MAX_SELECTOR_LENGTH}",
            DEFAULT_MAX_SELECTOR_LENGTH,
        )
    if isinstance(schema, str | bytes):
        schema = parse_selector_schema(schema)
    types = None if schema is None else schema.types
    condition = _PARSERS[klass](text, types)
    atoms = _atom_count(condition)
    if atoms > DEFAULT_MAX_ATOMS:
        raise SelectorError(f"selector has {atoms} predicates; the limit is {DEFAULT_MAX_ATOMS}"
                            " (an IN list counts as one)")
    return Selector(klass, text, condition, fields_of(condition), compile_condition(condition))


def _atom_count(condition: Cond) -> int:
    count, stack = 0, [condition]  # iterative: the tree may be DEFAULT_MAX_NESTING deep
    while stack:
        node = stack.pop()
        if isinstance(node, Atom):
            count += 1
        elif isinstance(node, Not):
            stack.append(node.operand)
        elif isinstance(node, And | Or):
            stack.extend(node.operands)
    return count
