"""The one selector language both classes compile to, and both backends evaluate.

Theory of operation
-------------------
"JMS" and "RFC-2254" look nothing alike, but selectors.md gives them one model: a selector is a
boolean combination (AND / OR / NOT, three-valued) of *atomic predicates*, and an atomic
predicate reads one or more identifiers, each of which may have several instances in a message.
The parsers (`_jms.py`, `_ldap.py`) resolve every question of syntax *and typing* at compile
time, so the tree below carries no ambiguity left for an evaluator to decide: each comparison
names its `Mode` (numeric, exact string, caseless, dynamic...), each LIKE carries its pattern
already split into segments. The Python evaluator (`_eval.py`) and the Spark compiler
(`_spark.py`) are then two mechanical readings of the same tree, which is what lets the
differential test demand identical answers.

The any-instance rule lives in one place: `Atom`. An atom binds each distinct identifier it
reads to one instance at a time (the cross product, when it reads several), evaluates its
predicate per binding, and combines: TRUE if any binding is TRUE, else UNKNOWN if any is
UNKNOWN, else FALSE. A missing identifier makes the atom UNKNOWN ("JMS") or FALSE ("RFC-2254",
`two_valued`). `IsNull` is the one predicate that looks at the instance list itself.

`Between` is the exception to "missing means UNKNOWN": it is two comparisons joined by AND
(`lo <= x AND x <= hi`), and in three-valued logic a FALSE side decides even when the other side
reads a missing identifier (JMS 1.1: `x NOT BETWEEN lo AND hi` with no `lo` and x above `hi` is
NOT (UNKNOWN AND FALSE), TRUE). So a missing identifier in a BETWEEN binds to one instance with
the empty text: BETWEEN reads every identifier as a number, the empty text is not one, and a
non-number is UNKNOWN, exactly what a missing value is. `required_fields` says which identifiers
an atom cannot be TRUE without (the subscription index files by it).

Everything here is a frozen dataclass: compiled selectors are shared between subscriptions and
threads, and hashing them lets the subscription index deduplicate identical predicates.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "And",
    "Arith",
    "ArithOp",
    "Atom",
    "BoolLit",
    "CmpOp",
    "Compare",
    "Cond",
    "Const",
    "Field",
    "FieldType",
    "InList",
    "IsNull",
    "Like",
    "LikePattern",
    "Mode",
    "Neg",
    "Not",
    "NumLit",
    "Or",
    "Predicate",
    "StrLit",
    "Truth",
    "Value",
    "fields_of",
    "required_fields",
]


class FieldType(Enum):
    """How an identifier's text is read: by context (no schema) or by its declared type."""

    #: No schema: the text takes its type from the context it is used in.
    TEXT = "text"
    #: xs:decimal, xs:int, xs:double, ...: always read as a number.
    NUMBER = "number"
    #: xs:boolean: `true`/`false` (any case) and `1`/`0`.
    BOOLEAN = "boolean"
    #: xs:string and every other declared type: always text, compared only with = and <>.
    STRING = "string"


class CmpOp(Enum):
    EQ = "="
    NE = "<>"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="

    @property
    def is_ordering(self) -> bool:
        return self not in (CmpOp.EQ, CmpOp.NE)


class ArithOp(Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"


class Mode(Enum):
    """How a comparison reads its two operands; fixed at compile time."""

    #: Both sides as numbers; a text that is not a number makes the comparison UNKNOWN.
    NUMBER = "number"
    #: Both sides as text, case-sensitive; only = and <>.
    STRING = "string"
    #: Both sides as text, compared after lower-casing (LDAP equality, JMS `x = TRUE`).
    CASELESS = "caseless"
    #: Both sides as booleans (schema-typed xs:boolean against TRUE/FALSE or another boolean).
    BOOLEAN = "boolean"
    #: Identifier against identifier: numeric if both parse as numbers, else string (where an
    #: ordering operator makes it UNKNOWN).
    DYNAMIC = "dynamic"
    #: LDAP ordering: numeric if both parse as numbers, else caseless lexicographic.
    LDAP_ORDER = "ldap-order"
    #: LDAP `~=`: caseless, whitespace runs collapsed to one space, trimmed.
    APPROX = "approx"


# --- value expressions --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One instance of identifier `name` (bound by the enclosing `Atom`)."""

    name: str
    type: FieldType = FieldType.TEXT


@dataclass(frozen=True, slots=True)
class NumLit:
    value: float


@dataclass(frozen=True, slots=True)
class StrLit:
    value: str


@dataclass(frozen=True, slots=True)
class BoolLit:
    value: bool


@dataclass(frozen=True, slots=True)
class Arith:
    """Numeric arithmetic; an UNKNOWN operand, division by zero or a NaN result is UNKNOWN."""

    op: ArithOp
    left: Value
    right: Value


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Value


Value = Field | NumLit | StrLit | BoolLit | Arith | Neg


# --- atomic predicates (evaluated per binding of instances) -------------------------------


@dataclass(frozen=True, slots=True)
class Compare:
    op: CmpOp
    left: Value
    right: Value
    mode: Mode


@dataclass(frozen=True, slots=True)
class LikePattern:
    """A LIKE / LDAP-substring pattern split on `%` (or `*`).

    Each segment is a tuple of pieces: a `str` is literal text, `None` is one any-character
    (`_`). `segments[0]` must match at the start, `segments[-1]` at the end, the ones between
    in order; a single segment must match the whole value. `caseless` patterns are stored
    lower-cased and matched against the lower-cased value.
    """

    segments: tuple[tuple[str | None, ...], ...]
    caseless: bool = False


@dataclass(frozen=True, slots=True)
class Like:
    value: Field
    pattern: LikePattern
    negated: bool = False


@dataclass(frozen=True, slots=True)
class InList:
    value: Field
    items: tuple[str, ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Truth:
    """A bare identifier used as a condition: TRUE for `true`, FALSE for `false`, else UNKNOWN."""

    value: Field


Predicate = Compare | Like | InList | Truth


# --- conditions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Atom:
    """An atomic predicate under the any-instance rule over the identifiers it reads.

    `fields` lists the distinct identifiers in first-use order (the order Spark nests its
    `exists` calls in). `two_valued` atoms (LDAP) turn UNKNOWN into FALSE.
    """

    predicate: Predicate | Between
    fields: tuple[str, ...]
    two_valued: bool = False


@dataclass(frozen=True, slots=True)
class Between:
    """`value [NOT] BETWEEN low AND high`, numeric, as one atomic predicate."""

    value: Value
    low: Value
    high: Value
    negated: bool = False


@dataclass(frozen=True, slots=True)
class IsNull:
    """`name IS [NOT] NULL`: TRUE iff the identifier has no instance (never UNKNOWN)."""

    name: str
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Const:
    """A constant truth value: TRUE, FALSE or UNKNOWN (None), e.g. an empty selector."""

    value: bool | None


@dataclass(frozen=True, slots=True)
class Not:
    operand: Cond


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Cond, ...]


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Cond, ...]


Cond = Atom | IsNull | Const | Not | And | Or


def _value_fields(value: Value, out: dict[str, None]) -> None:
    if isinstance(value, Field):
        out.setdefault(value.name)
    elif isinstance(value, Arith):
        _value_fields(value.left, out)
        _value_fields(value.right, out)
    elif isinstance(value, Neg):
        _value_fields(value.operand, out)


def predicate_fields(predicate: Predicate | Between) -> tuple[str, ...]:
    """The distinct identifiers a predicate reads, in first-use order."""
    out: dict[str, None] = {}
    if isinstance(predicate, Compare):
        _value_fields(predicate.left, out)
        _value_fields(predicate.right, out)
    elif isinstance(predicate, Between):
        for value in (predicate.value, predicate.low, predicate.high):
            _value_fields(value, out)
    else:
        _value_fields(predicate.value, out)
    return tuple(out)


def fields_of(cond: Cond) -> frozenset[str]:
    """Every identifier a condition reads."""
    if isinstance(cond, Atom):
        return frozenset(cond.fields)
    if isinstance(cond, IsNull):
        return frozenset((cond.name,))
    if isinstance(cond, Not):
        return fields_of(cond.operand)
    if isinstance(cond, And | Or):
        return frozenset().union(*(fields_of(c) for c in cond.operands))
    return frozenset()


def required_fields(atom: Atom) -> tuple[str, ...]:
    """The identifiers without an instance of which `atom` cannot be TRUE, in first-use order.

    All of them, except for `NOT BETWEEN`: it is TRUE when either bound comparison is FALSE, so
    it needs the value's identifiers and only those the two bounds both read.
    """
    pred = atom.predicate
    if not (isinstance(pred, Between) and pred.negated):
        return atom.fields
    value: dict[str, None] = {}
    low: dict[str, None] = {}
    high: dict[str, None] = {}
    _value_fields(pred.value, value)
    _value_fields(pred.low, low)
    _value_fields(pred.high, high)
    return tuple(n for n in atom.fields if n in value or (n in low and n in high))
