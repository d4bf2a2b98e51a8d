"""The live backend: a compiled condition tree becomes nested Python closures over stored fields.

Theory of operation
-------------------
`compile_condition(cond)` walks the tree once and returns `fields -> True | False | None`
(None is UNKNOWN), where `fields` is what `extract_fields` returns: identifier -> instances.
Nothing here raises on any input the compilers accept: number parsing returns None, division by
zero returns None, a NaN result (inf - inf) returns None, and every comparison is between values
the compile-time `Mode` already made comparable.

Inside an atom, value closures take the *binding*: for the common single-identifier atom the
binding is the instance string itself (no dict or tuple per instance, which is what keeps a
3-predicate selector well above 200k evaluations/s); for atoms reading several identifiers it
is a tuple of one instance per identifier, in `Atom.fields` order.

Every numeric rule here must equal `_spark.py`'s: `NUMBER_PATTERN` is the one regex both use,
floats are IEEE doubles in both, and NaN is UNKNOWN in both (Spark orders NaN above every number
and calls NaN = NaN true; Python calls every NaN comparison false; UNKNOWN sidesteps both).
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from ._ast import (
    And,
    Arith,
    ArithOp,
    Atom,
    Between,
    BoolLit,
    CmpOp,
    Compare,
    Cond,
    Const,
    Field,
    FieldType,
    InList,
    IsNull,
    Like,
    LikePattern,
    Mode,
    Neg,
    Not,
    NumLit,
    Or,
    StrLit,
    Truth,
    Value,
)
from ._limits import DEFAULT_MAX_BINDINGS

__all__ = [
    "APPROX_SPACE",
    "NUMBER_PATTERN",
    "Fields",
    "compile_condition",
    "compile_like",
    "normalize_approx",
    "read_bool",
    "to_number",
]

#: What selectors.md calls a number in message text (ASCII digits only: `\d` would take
#: Arabic-Indic digits in Python but not in Java). Spark uses the same text.
NUMBER_PATTERN = r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?"
_NUMBER = re.compile(NUMBER_PATTERN)

#: Whitespace that LDAP `~=` collapses; spelled out because Python's `\s` and Java's differ.
APPROX_SPACE = r"[ \t\n\r\f\x0b]+"
_APPROX_SPACE = re.compile(APPROX_SPACE)

Fields = Mapping[str, Sequence[str]]
Truth3 = bool | None
Evaluator = Callable[[Fields], Truth3]
_Getter = Callable[[Any], Any]


@lru_cache(maxsize=65536)
def to_number(text: str) -> float | None:
    """The number `text` denotes under selectors.md, or None ('1_000', 'NaN', '' are not)."""
    if _NUMBER.fullmatch(text) is None:
        return None
    return float(text)


def read_bool(text: str, field_type: FieldType) -> bool | None:
    """A text as a boolean: `true`/`false` any case; xs:boolean also takes `1`/`0`."""
    lowered = text.lower()
    if lowered == "true" or (field_type is FieldType.BOOLEAN and text == "1"):
        return True
    if lowered == "false" or (field_type is FieldType.BOOLEAN and text == "0"):
        return False
    return None


def normalize_approx(text: str) -> str:
    """LDAP `~=`: lower-case, collapse whitespace runs to one space, trim."""
    return _APPROX_SPACE.sub(" ", text.lower()).strip(" ")


def _arith(op: ArithOp, a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if op is ArithOp.ADD:
        r = a + b
    elif op is ArithOp.SUB:
        r = a - b
    elif op is ArithOp.MUL:
        r = a * b
    else:
        if b == 0:
            return None
        r = a / b
    return None if math.isnan(r) else r


# --- values --------------------------------------------------------------------------------


def _field_getter(field: Field, names: tuple[str, ...]) -> _Getter:
    if len(names) == 1:
        return lambda b: b
    index = names.index(field.name)
    return lambda b: b[index]


def _numeric(value: Value, names: tuple[str, ...]) -> _Getter:
    """A closure giving `value` as float | None."""
    if isinstance(value, NumLit):
        const = value.value
        return lambda b: const
    if isinstance(value, Field):
        get = _field_getter(value, names)
        return lambda b: to_number(get(b))
    if isinstance(value, Neg):
        inner = _numeric(value.operand, names)

        def neg(b: Any) -> float | None:
            x = inner(b)
            return None if x is None else -x

        return neg
    if isinstance(value, Arith):
        op, left, right = value.op, _numeric(value.left, names), _numeric(value.right, names)
        return lambda b: _arith(op, left(b), right(b))
    raise AssertionError(f"not numeric: {value!r}")  # the compilers never build this


def _textual(value: Value, names: tuple[str, ...]) -> _Getter:
    if isinstance(value, StrLit):
        const = value.value
        return lambda b: const
    if isinstance(value, Field):
        return _field_getter(value, names)
    raise AssertionError(f"not textual: {value!r}")


def _boolean(value: Value, names: tuple[str, ...]) -> _Getter:
    if isinstance(value, BoolLit):
        const = value.value
        return lambda b: const
    if isinstance(value, Field):
        get, ftype = _field_getter(value, names), value.type
        return lambda b: read_bool(get(b), ftype)
    raise AssertionError(f"not boolean: {value!r}")


_ORDER: dict[CmpOp, Callable[[Any, Any], bool]] = {
    CmpOp.EQ: operator.eq, CmpOp.NE: operator.ne, CmpOp.LT: operator.lt,
    CmpOp.LE: operator.le, CmpOp.GT: operator.gt, CmpOp.GE: operator.ge,
}
_MIRROR = {CmpOp.EQ: CmpOp.EQ, CmpOp.NE: CmpOp.NE, CmpOp.LT: CmpOp.GT, CmpOp.LE: CmpOp.GE,
           CmpOp.GT: CmpOp.LT, CmpOp.GE: CmpOp.LE}


def _compare(pred: Compare, names: tuple[str, ...]) -> _Getter:
    test = _ORDER[pred.op]
    mode = pred.mode
    if mode is Mode.NUMBER and len(names) == 1:
        # The hot shape, `price > 5` or `5 < price`: one closure instead of four.
        field, const, op = pred.left, pred.right, pred.op
        if isinstance(field, NumLit):
            field, const, op = const, field, _MIRROR[op]
        if isinstance(field, Field) and isinstance(const, NumLit):
            fast_test, c = _ORDER[op], const.value

            def field_vs_number(v: str) -> bool | None:
                n = to_number(v)
                return None if n is None else fast_test(n, c)

            return field_vs_number
    if mode is Mode.NUMBER:
        left, right = _numeric(pred.left, names), _numeric(pred.right, names)

        def numeric(b: Any) -> bool | None:
            x, y = left(b), right(b)
            if x is None or y is None:
                return None
            return test(x, y)

        return numeric
    if mode is Mode.BOOLEAN:
        left, right = _boolean(pred.left, names), _boolean(pred.right, names)

        def boolean(b: Any) -> bool | None:
            x, y = left(b), right(b)
            if x is None or y is None:
                return None
            return test(x, y)

        return boolean
    left, right = _textual(pred.left, names), _textual(pred.right, names)
    if mode is Mode.STRING:
        return lambda b: test(left(b), right(b))
    if mode is Mode.CASELESS:
        return lambda b: test(left(b).lower(), right(b).lower())
    if mode is Mode.APPROX:
        return lambda b: test(normalize_approx(left(b)), normalize_approx(right(b)))
    ordering = pred.op.is_ordering
    caseless_order = mode is Mode.LDAP_ORDER

    def dynamic(b: Any) -> bool | None:
        s, t = left(b), right(b)
        x, y = to_number(s), to_number(t)
        if x is not None and y is not None:
            return test(x, y)
        if caseless_order:
            return test(s.lower(), t.lower())
        return None if ordering else test(s, t)

    return dynamic


def _between(pred: Between, names: tuple[str, ...]) -> _Getter:
    value, low, high = (_numeric(v, names) for v in (pred.value, pred.low, pred.high))
    negated = pred.negated

    def between(b: Any) -> bool | None:
        x, lo, hi = value(b), low(b), high(b)
        # 3VL of `lo <= x AND x <= hi`: a FALSE side decides even when the other is UNKNOWN.
        ge = None if x is None or lo is None else lo <= x
        le = None if x is None or hi is None else x <= hi
        if ge is False or le is False:
            result: bool | None = False
        elif ge is None or le is None:
            result = None
        else:
            result = True
        return result if result is None or not negated else not result

    return between


def compile_like(pattern: LikePattern) -> Callable[[str], bool]:
    """A matcher for `pattern`, linear-ish on any input.

    Literal runs use str.startswith/find/endswith; a segment with `_` uses a regex with no
    quantifier (so no backtracking beyond the segment's length). Each `%`-separated middle
    segment is matched at its leftmost position after the previous one, which is optimal
    because segments have fixed length: a later occurrence can only leave less room.
    """
    segs = pattern.segments
    caseless = pattern.caseless
    matchers = [_segment(seg) for seg in segs]

    def match(value: str) -> bool:
        if caseless:
            value = value.lower()
        if len(segs) == 1:
            whole, length, literal = matchers[0]
            if literal is not None:
                return value == literal
            return len(value) == length and whole.fullmatch(value) is not None
        first, last = matchers[0], matchers[-1]
        if first[2] is not None:
            if not value.startswith(first[2]):
                return False
            pos = len(first[2])
        else:
            m = first[0].match(value)
            if m is None:
                return False
            pos = m.end()
        for regex, length, literal in matchers[1:-1]:
            if length == 0:
                continue
            if literal is not None:
                found = value.find(literal, pos)
                if found < 0:
                    return False
                pos = found + length
            else:
                m = regex.search(value, pos)
                if m is None:
                    return False
                pos = m.end()
        start = len(value) - last[1]
        if start < pos:
            return False
        if last[2] is not None:
            return value.endswith(last[2])
        return last[0].fullmatch(value, start) is not None

    return match


def _segment(seg: tuple[str | None, ...]) -> tuple[re.Pattern[str], int, str | None]:
    """(regex, length in code points, the literal text if the segment has no `_`)."""
    regex = re.compile("".join("." if p is None else re.escape(p) for p in seg), re.DOTALL)
    length = sum(1 if p is None else len(p) for p in seg)
    literal = None if None in seg else "".join(p for p in seg if p is not None)
    return regex, length, literal


def _like(pred: Like, names: tuple[str, ...]) -> _Getter:
    get, match, negated = _field_getter(pred.value, names), compile_like(pred.pattern), pred.negated
    if negated:
        return lambda b: not match(get(b))
    return lambda b: match(get(b))


def _in(pred: InList, names: tuple[str, ...]) -> _Getter:
    get, items = _field_getter(pred.value, names), frozenset(pred.items)
    if pred.negated:
        return lambda b: get(b) not in items
    return lambda b: get(b) in items


def _predicate(atom: Atom) -> _Getter:
    pred, names = atom.predicate, atom.fields
    if isinstance(pred, Compare):
        return _compare(pred, names)
    if isinstance(pred, Between):
        return _between(pred, names)
    if isinstance(pred, Like):
        return _like(pred, names)
    if isinstance(pred, InList):
        return _in(pred, names)
    if isinstance(pred, Truth):
        return _boolean(pred.value, names)
    raise AssertionError(f"unknown predicate {pred!r}")


#: What a missing identifier binds to inside a BETWEEN: a text that is not a number, so UNKNOWN
#: (see `_ast`: the other bound comparison may still make the BETWEEN FALSE).
_NOT_A_NUMBER = ("",)


def _atom(atom: Atom, max_bindings: int) -> Evaluator:
    test, names = _predicate(atom), atom.fields
    missing: Truth3 = False if atom.two_valued else None
    if isinstance(atom.predicate, Between):
        return _between_atom(test, names, max_bindings)
    if not names:
        constant = test(())
        return lambda fields: missing if constant is None else constant
    if len(names) == 1:
        (name,) = names

        def single(fields: Fields) -> Truth3:
            vals = fields.get(name)
            if not vals:
                return missing
            result: Truth3 = False
            for v in vals:
                r = test(v)
                if r:
                    return True
                if r is None:
                    result = missing
            return result

        return single

    def product(fields: Fields) -> Truth3:
        lists = []
        count = 1
        for name in names:
            vals = fields.get(name)
            if not vals:
                return missing
            lists.append(vals)
            count *= len(vals)
        if count > max_bindings:
            return missing
        result: Truth3 = False
        for binding in itertools.product(*lists):
            r = test(binding)
            if r:
                return True
            if r is None:
                result = missing
        return result

    return product


def _between_atom(test: _Getter, names: tuple[str, ...], max_bindings: int) -> Evaluator:
    """The any-instance rule for BETWEEN, with a missing identifier bound to a non-number."""
    if not names:
        constant = test(())
        return lambda fields: constant

    if len(names) == 1:
        (name,) = names

        def single(fields: Fields) -> Truth3:
            result: Truth3 = False
            for v in fields.get(name) or _NOT_A_NUMBER:
                r = test(v)
                if r:
                    return True
                if r is None:
                    result = None
            return result

        return single

    def product(fields: Fields) -> Truth3:
        lists = [fields.get(name) or _NOT_A_NUMBER for name in names]
        if math.prod(len(vals) for vals in lists) > max_bindings:
            return None
        result: Truth3 = False
        for binding in itertools.product(*lists):
            r = test(binding)
            if r:
                return True
            if r is None:
                result = None
        return result

    return product


def compile_condition(cond: Cond, max_bindings: int = DEFAULT_MAX_BINDINGS) -> Evaluator:
    """`fields -> True | False | None` for a condition tree; the result never raises."""
    if isinstance(cond, Atom):
        return _atom(cond, max_bindings)
    if isinstance(cond, IsNull):
        name, negated = cond.name, cond.negated
        return lambda fields: bool(fields.get(name)) is negated
    if isinstance(cond, Const):
        value = cond.value
        return lambda fields: value
    if isinstance(cond, Not):
        inner = compile_condition(cond.operand, max_bindings)

        def not_(fields: Fields) -> Truth3:
            r = inner(fields)
            return None if r is None else not r

        return not_
    if isinstance(cond, And):
        parts = tuple(compile_condition(c, max_bindings) for c in cond.operands)

        def and_(fields: Fields) -> Truth3:
            result: Truth3 = True
            for part in parts:
                r = part(fields)
                if r is False:
                    return False
                if r is None:
                    result = None
            return result

        return and_
    if isinstance(cond, Or):
        parts = tuple(compile_condition(c, max_bindings) for c in cond.operands)

        def or_(fields: Fields) -> Truth3:
            result: Truth3 = False
            for part in parts:
                r = part(fields)
                if r is True:
                    return True
                if r is None:
                    result = None
            return result

        return or_
    raise AssertionError(f"unknown condition {cond!r}")
