"""The batch backend: a compiled condition tree becomes a Spark SQL boolean Column.

Theory of operation
-------------------
The input is a `map<string, array<string>>` column holding exactly what `extract_fields`
returns. This module is a second, mechanical reading of the tree `_eval.py` reads, and each
rule below is the SQL spelling of the Python one next to it:

- UNKNOWN is SQL NULL, and Spark's AND / OR / NOT already follow the JMS truth tables.
- The any-instance rule is `exists(array, x -> …)`, nested once per identifier the atom reads:
  Spark's `exists` is three-valued (TRUE if any element is TRUE, else NULL if any is NULL, else
  FALSE), checked on pyspark 4.2 with `spark.sql.legacy.followThreeValuedLogicInArrayExists`
  at its default.
- A missing identifier (`fields[name]` is NULL) makes the atom NULL, or FALSE for LDAP, up
  front, exactly as the Python atom returns before looking at instances; so do more bindings
  than `DEFAULT_MAX_BINDINGS`.
- A number is `try_cast(x AS DOUBLE)` only where `x RLIKE NUMBER_PATTERN` (anchored), so
  '1_000', 'NaN', 'Infinity' or ' 5' never count, whatever Spark's cast would accept.
  Division by zero is guarded with `when` (ANSI mode would raise), and a NaN result becomes
  NULL (Spark says NaN = NaN and orders NaN above everything; Python says neither).
- LIKE and LDAP substrings become a Java regex with atomic groups:
  `(?s)\\A seg0 (?>.*?seg1) … .* segN \\z`. Each middle segment is taken at its leftmost
  occurrence and never revisited, the same greedy algorithm as `compile_like`, so a pattern like
  '%a%a%a%b' runs in linear-ish time instead of backtracking polynomially; `(?s)` makes `.`
  match newlines, and Java's `.` takes a whole code point, like Python's.
- Caseless comparisons use Spark's `lower` on both sides. Python's `str.lower` and Java's
  `toLowerCase` agree on every character the differential corpus uses; they could differ on
  exotic characters whose lower-casing Unicode versions changed.

pyspark is imported lazily so the live broker never needs a JVM.
"""

from __future__ import annotations

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
    StrLit,
    Truth,
    Value,
)
from ._eval import APPROX_SPACE, NUMBER_PATTERN
from ._limits import DEFAULT_MAX_BINDINGS

__all__ = ["FIELDS_TYPE_DDL", "condition_column", "like_regex"]

#: The Spark SQL type of the fields column.
FIELDS_TYPE_DDL = "map<string,array<string>>"

Column = Any  # pyspark.sql.Column; pyspark ships no type stubs here
_Env = dict[str, Column]

_NUMBER_RLIKE = f"\\A{NUMBER_PATTERN}\\z"
# Java's `\x0B` is the same vertical tab Python's `\x0b` is.
_JAVA_APPROX_SPACE = APPROX_SPACE.replace("\\x0b", "\\x0B")


def _f() -> Any:
    from pyspark.sql import functions  # noqa: PLC0415 - lazy, see the module docstring

    return functions


def _java_quote(text: str) -> str:
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)


def _java_segment(seg: tuple[str | None, ...]) -> str:
    return "".join("." if p is None else _java_quote(p) for p in seg)


def like_regex(pattern: LikePattern) -> str:
    """The linear-time Java regex equivalent to `pattern` (see the module docstring)."""
    segs = pattern.segments
    if len(segs) == 1:
        return f"(?s)\\A{_java_segment(segs[0])}\\z"
    middle = "".join(f"(?>.*?{_java_segment(s)})" for s in segs[1:-1] if s)
    return f"(?s)\\A{_java_segment(segs[0])}{middle}.*{_java_segment(segs[-1])}\\z"


def _number(text: Column) -> Column:
    F = _f()
    return F.when(text.rlike(_NUMBER_RLIKE), text.try_cast("double"))


def _no_nan(x: Column) -> Column:
    F = _f()
    return F.when(~F.isnan(x), x)


def _numeric(value: Value, env: _Env) -> Column:
    F = _f()
    if isinstance(value, NumLit):
        return F.lit(value.value).cast("double")
    if isinstance(value, Field):
        return _number(env[value.name])
    if isinstance(value, Neg):
        return -_numeric(value.operand, env)
    if isinstance(value, Arith):
        a, b = _numeric(value.left, env), _numeric(value.right, env)
        if value.op is ArithOp.ADD:
            r = a + b
        elif value.op is ArithOp.SUB:
            r = a - b
        elif value.op is ArithOp.MUL:
            r = a * b
        else:
            r = F.when(b != 0, a / b)
        return _no_nan(r)
    raise AssertionError(f"not numeric: {value!r}")


def _textual(value: Value, env: _Env) -> Column:
    F = _f()
    if isinstance(value, StrLit):
        return F.lit(value.value)
    if isinstance(value, Field):
        return env[value.name]
    raise AssertionError(f"not textual: {value!r}")


def _boolean(value: Value, env: _Env) -> Column:
    F = _f()
    if isinstance(value, BoolLit):
        return F.lit(value.value)
    if isinstance(value, Field):
        text = env[value.name]
        lowered = F.lower(text)
        true = lowered == "true"
        false = lowered == "false"
        if value.type is FieldType.BOOLEAN:
            true, false = true | (text == "1"), false | (text == "0")
        return F.when(true, F.lit(True)).when(false, F.lit(False))
    raise AssertionError(f"not boolean: {value!r}")


def _apply(op: CmpOp, a: Column, b: Column) -> Column:
    if op is CmpOp.EQ:
        return a == b
    if op is CmpOp.NE:
        return a != b
    if op is CmpOp.LT:
        return a < b
    if op is CmpOp.LE:
        return a <= b
    if op is CmpOp.GT:
        return a > b
    return a >= b


def _compare(pred: Compare, env: _Env) -> Column:
    F = _f()
    mode, op = pred.mode, pred.op
    if mode is Mode.NUMBER:
        return _apply(op, _numeric(pred.left, env), _numeric(pred.right, env))
    if mode is Mode.BOOLEAN:
        return _apply(op, _boolean(pred.left, env), _boolean(pred.right, env))
    a, b = _textual(pred.left, env), _textual(pred.right, env)
    if mode is Mode.STRING:
        return _apply(op, a, b)
    if mode is Mode.CASELESS:
        return _apply(op, F.lower(a), F.lower(b))
    if mode is Mode.APPROX:
        def norm(x: Column) -> Column:
            return F.trim(F.regexp_replace(F.lower(x), _JAVA_APPROX_SPACE, " "), " ")
        return _apply(op, norm(a), norm(b))
    both_numbers = a.rlike(_NUMBER_RLIKE) & b.rlike(_NUMBER_RLIKE)
    numeric = _apply(op, _number(a), _number(b))
    if mode is Mode.LDAP_ORDER:
        fallback = _apply(op, F.lower(a), F.lower(b))
    elif op.is_ordering:
        fallback = F.lit(None).cast("boolean")
    else:
        fallback = _apply(op, a, b)
    return F.when(both_numbers, numeric).otherwise(fallback)


def _predicate(atom: Atom, env: _Env) -> Column:
    F = _f()
    pred = atom.predicate
    if isinstance(pred, Compare):
        return _compare(pred, env)
    if isinstance(pred, Between):
        x, lo, hi = (_numeric(v, env) for v in (pred.value, pred.low, pred.high))
        inside = (lo <= x) & (x <= hi)
        return ~inside if pred.negated else inside
    if isinstance(pred, Like):
        text = env[pred.value.name]
        if pred.pattern.caseless:
            text = F.lower(text)
        matched = text.rlike(like_regex(pred.pattern))
        return ~matched if pred.negated else matched
    if isinstance(pred, InList):
        found = env[pred.value.name].isin(list(pred.items))
        return ~found if pred.negated else found
    if isinstance(pred, Truth):
        return _boolean(pred.value, env)
    raise AssertionError(f"unknown predicate {pred!r}")


def _atom(atom: Atom, fields: Column, max_bindings: int) -> Column:
    F = _f()
    missing = F.lit(False) if atom.two_valued else F.lit(None).cast("boolean")
    names = atom.fields
    if not names:
        result = _predicate(atom, {})
        return F.coalesce(result, F.lit(False)) if atom.two_valued else result
    arrays = [fields[name] for name in names]

    def nest(i: int, env: _Env) -> Column:
        if i == len(names):
            return _predicate(atom, env)
        return F.exists(arrays[i], lambda x: nest(i + 1, {**env, names[i]: x}))

    result = nest(0, {})
    absent = arrays[0].isNull() | (F.size(arrays[0]) == 0)
    for arr in arrays[1:]:
        absent = absent | arr.isNull() | (F.size(arr) == 0)
    chain = F.when(absent, missing)
    if len(names) > 1:
        count = F.size(arrays[0]).cast("long")
        for arr in arrays[1:]:
            count = count * F.size(arr).cast("long")
        chain = chain.when(count > max_bindings, missing)
    if atom.two_valued:
        result = F.coalesce(result, F.lit(False))
    return chain.otherwise(result)


def condition_column(
    cond: Cond, fields: Column, max_bindings: int = DEFAULT_MAX_BINDINGS
) -> Column:
    """The three-valued Spark Column for `cond` over the fields column (NULL is UNKNOWN)."""
    F = _f()
    if isinstance(cond, Atom):
        return _atom(cond, fields, max_bindings)
    if isinstance(cond, IsNull):
        arr = fields[cond.name]
        present = arr.isNotNull() & (F.size(arr) > 0)
        return present if cond.negated else ~present
    if isinstance(cond, Const):
        return F.lit(cond.value).cast("boolean")
    if isinstance(cond, Not):
        return ~condition_column(cond.operand, fields, max_bindings)
    parts = [condition_column(c, fields, max_bindings) for c in cond.operands]
    # Combine as a balanced tree: a left-deep chain of thousands of ORs would overflow the
    # JVM stack in Spark's analyzer.
    while len(parts) > 1:
        pairs = [
            (parts[i] & parts[i + 1]) if isinstance(cond, And) else (parts[i] | parts[i + 1])
            for i in range(0, len(parts) - 1, 2)
        ]
        parts = pairs + parts[len(parts) - len(parts) % 2 :] if len(parts) % 2 else pairs
    return parts[0]
