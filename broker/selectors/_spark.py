"""The batch backend: a compiled condition tree becomes a Spark SQL boolean expression.

Theory of operation
-------------------
The input is a `map<string, array<string>>` column holding exactly what `extract_fields`
returns. This module is a second, mechanical reading of the tree `_eval.py` reads, and each
rule below is the SQL spelling of the Python one next to it. It writes SQL text, turned into
a Column by one `functions.expr` call: building the same expression through the Column API
costs a py4j round trip per node (about 80 ms for a typical generated selector, against well
under 1 ms here), and the text is what one wants to read when a replay disagrees anyway.

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
  Division is `a / nullif(b, 0)` (ANSI mode would raise on zero), and a NaN result becomes
  NULL through `nanvl` (Spark says NaN = NaN and orders NaN above everything; Python says neither).
  One `nanvl` around a whole arithmetic expression is enough: Python makes UNKNOWN of the first
  NaN, and no IEEE operation turns a NaN back into a number, so Spark's NaN reaches the top.
- Spark's SQL parser recurses on the JVM stack once per parenthesis or function call, and a
  cold (not yet JIT-compiled) parser overflows somewhere under 256 nested parentheses. So the
  text is kept shallow where the meaning allows: nested ANDs (ORs) are one balanced tree,
  `NOT NOT x` is `x` and `- - x` is `x` (both exact, in three-valued logic and in IEEE doubles),
  and a left-deep arithmetic chain is written without parentheses (`a + b - c`, which Spark
  parses left-associatively in a loop). A selector at `DEFAULT_MAX_NESTING` in any of the shapes
  tests/selectors/test_differential.py tries parses on a fresh session.
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

import math
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
from ._eval import APPROX_SPACE, NUMBER_PATTERN
from ._limits import DEFAULT_MAX_BINDINGS

__all__ = ["FIELDS_TYPE_DDL", "condition_column", "condition_sql", "like_regex"]

#: The Spark SQL type of the fields column.
FIELDS_TYPE_DDL = "map<string,array<string>>"

Column = Any  # pyspark.sql.Column; pyspark ships no type stubs here
_Env = dict[str, str]

_NUMBER_RLIKE = f"\\A{NUMBER_PATTERN}\\z"
# Java's `\x0B` is the same vertical tab Python's `\x0b` is.
_JAVA_APPROX_SPACE = APPROX_SPACE.replace("\\x0b", "\\x0B")
_NULL_BOOL = "CAST(NULL AS BOOLEAN)"
_SQL_OPS = {CmpOp.EQ: "=", CmpOp.NE: "<>", CmpOp.LT: "<", CmpOp.LE: "<=", CmpOp.GT: ">",
            CmpOp.GE: ">="}
_ARITH_OPS = {ArithOp.ADD: "+", ArithOp.SUB: "-", ArithOp.MUL: "*"}


def sql_string(text: str) -> str:
    """A Spark SQL string literal for any text: printable ASCII as is, the rest as \\uXXXX."""
    out = []
    for unit in text.encode("utf-16-be").hex(" ", 2).split(" ") if text else ():
        code = int(unit, 16)
        ch = chr(code)
        if ch in "\\'":
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\u{code:04X}")
    return "'" + "".join(out) + "'"


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


def _number(text: str) -> str:
    rlike = sql_string(_NUMBER_RLIKE)
    return f"CASE WHEN {text} RLIKE {rlike} THEN TRY_CAST({text} AS DOUBLE) END"


def _numeric(value: Value, env: _Env) -> str:
    """`value` as a DOUBLE, NULL for UNKNOWN (a NaN anywhere inside included)."""
    text = _arith(value, env)
    return f"nanvl({text}, CAST(NULL AS DOUBLE))" if isinstance(value, Arith | Neg) else text


def _strip_negations(value: Value) -> Value:
    while isinstance(value, Neg) and isinstance(value.operand, Neg):
        value = value.operand.operand
    return value


def _arith(value: Value, env: _Env) -> str:
    """`value` as a DOUBLE that may be NaN; a sum, difference, product or quotient unbracketed."""
    value = _strip_negations(value)
    if isinstance(value, NumLit):
        literal = repr(value.value) if math.isfinite(value.value) else (
            "Infinity" if value.value > 0 else "-Infinity")
        return f"CAST('{literal}' AS DOUBLE)"
    if isinstance(value, Field):
        return _number(env[value.name])
    if isinstance(value, Neg):
        return f"(- {_operand(value.operand, env)})"
    if isinstance(value, Arith):
        additive = value.op in (ArithOp.ADD, ArithOp.SUB)
        left = _strip_negations(value.left)
        # Same or tighter precedence on the left needs no parentheses (both are left-assoc).
        if isinstance(left, Arith) and (additive or left.op in (ArithOp.MUL, ArithOp.DIV)):
            a = _arith(left, env)
        else:
            a = _operand(left, env)
        b = _operand(value.right, env)
        if value.op is ArithOp.DIV:
            return f"{a} / nullif({b}, 0)"
        return f"{a} {_ARITH_OPS[value.op]} {b}"
    raise AssertionError(f"not numeric: {value!r}")


def _operand(value: Value, env: _Env) -> str:
    text = _arith(value, env)
    return f"({text})" if isinstance(_strip_negations(value), Arith) else text


def _textual(value: Value, env: _Env) -> str:
    if isinstance(value, StrLit):
        return sql_string(value.value)
    if isinstance(value, Field):
        return env[value.name]
    raise AssertionError(f"not textual: {value!r}")


def _boolean(value: Value, env: _Env) -> str:
    if isinstance(value, BoolLit):
        return "TRUE" if value.value else "FALSE"
    if isinstance(value, Field):
        x = env[value.name]
        true, false = f"lower({x}) = 'true'", f"lower({x}) = 'false'"
        if value.type is FieldType.BOOLEAN:
            true, false = f"{true} OR {x} = '1'", f"{false} OR {x} = '0'"
        return f"CASE WHEN {true} THEN TRUE WHEN {false} THEN FALSE END"
    raise AssertionError(f"not boolean: {value!r}")


def _compare(pred: Compare, env: _Env) -> str:
    mode, op = pred.mode, _SQL_OPS[pred.op]
    if mode is Mode.NUMBER:
        return f"({_numeric(pred.left, env)} {op} {_numeric(pred.right, env)})"
    if mode is Mode.BOOLEAN:
        return f"({_boolean(pred.left, env)} {op} {_boolean(pred.right, env)})"
    a, b = _textual(pred.left, env), _textual(pred.right, env)
    if mode is Mode.STRING:
        return f"({a} {op} {b})"
    if mode is Mode.CASELESS:
        return f"(lower({a}) {op} lower({b}))"
    if mode is Mode.APPROX:
        space = sql_string(_JAVA_APPROX_SPACE)

        def norm(x: str) -> str:
            # One-argument trim strips only ' ', which is all that is left to strip.
            return f"trim(regexp_replace(lower({x}), {space}, ' '))"

        return f"({norm(a)} {op} {norm(b)})"
    rlike = sql_string(_NUMBER_RLIKE)
    numeric = f"({_number(a)} {op} {_number(b)})"
    if mode is Mode.LDAP_ORDER:
        fallback = f"(lower({a}) {op} lower({b}))"
    elif pred.op.is_ordering:
        fallback = _NULL_BOOL
    else:
        fallback = f"({a} {op} {b})"
    return f"CASE WHEN {a} RLIKE {rlike} AND {b} RLIKE {rlike} THEN {numeric} ELSE {fallback} END"


def _predicate(atom: Atom, env: _Env) -> str:
    pred = atom.predicate
    if isinstance(pred, Compare):
        return _compare(pred, env)
    if isinstance(pred, Between):
        x, lo, hi = (_numeric(v, env) for v in (pred.value, pred.low, pred.high))
        inside = f"({lo} <= {x} AND {x} <= {hi})"
        return f"(NOT {inside})" if pred.negated else inside
    if isinstance(pred, Like):
        text = env[pred.value.name]
        if pred.pattern.caseless:
            text = f"lower({text})"
        matched = f"({text} RLIKE {sql_string(like_regex(pred.pattern))})"
        return f"(NOT {matched})" if pred.negated else matched
    if isinstance(pred, InList):
        items = ", ".join(sql_string(item) for item in pred.items)
        return f"({env[pred.value.name]} {'NOT ' if pred.negated else ''}IN ({items}))"
    if isinstance(pred, Truth):
        return _boolean(pred.value, env)
    raise AssertionError(f"unknown predicate {pred!r}")


def _atom(atom: Atom, fields: str, max_bindings: int) -> str:
    missing = "FALSE" if atom.two_valued else _NULL_BOOL
    names = atom.fields
    if not names:
        result = _predicate(atom, {})
        return f"coalesce({result}, FALSE)" if atom.two_valued else result
    arrays = [f"{fields}[{sql_string(name)}]" for name in names]
    if isinstance(atom.predicate, Between):
        # As `_eval._between_atom`: a missing identifier is one instance that is not a number.
        arrays = [f"CASE WHEN coalesce(size({arr}), 0) <= 0 THEN array('') ELSE {arr} END"
                  for arr in arrays]
    env = {name: f"x{i}" for i, name in enumerate(names)}
    result = _predicate(atom, env)
    for i in reversed(range(len(names))):
        result = f"exists({arrays[i]}, x{i} -> {result})"
    if isinstance(atom.predicate, Between):
        if len(names) == 1:
            return result
        count = " * ".join(f"CAST(size({arr}) AS BIGINT)" for arr in arrays)
        return f"CASE WHEN {count} > {max_bindings} THEN {_NULL_BOOL} ELSE {result} END"
    if atom.two_valued:
        result = f"coalesce({result}, FALSE)"
    # `<= 0`: size(NULL) is NULL under ANSI but -1 with spark.sql.legacy.sizeOfNull.
    absent = " OR ".join(f"coalesce(size({arr}), 0) <= 0" for arr in arrays)
    chain = f"CASE WHEN {absent} THEN {missing}"
    if len(names) > 1:
        count = " * ".join(f"CAST(size({arr}) AS BIGINT)" for arr in arrays)
        chain += f" WHEN {count} > {max_bindings} THEN {missing}"
    return f"{chain} ELSE {result} END"


def condition_sql(
    cond: Cond, fields: str = "fields", max_bindings: int = DEFAULT_MAX_BINDINGS
) -> str:
    """The three-valued Spark SQL expression for `cond` over the fields column (NULL = UNKNOWN).

    `fields` is SQL text naming the column, e.g. "fields" or "`my fields`".
    """
    if isinstance(cond, Atom):
        return _atom(cond, fields, max_bindings)
    if isinstance(cond, IsNull):
        test = "> 0" if cond.negated else "<= 0"
        return f"(coalesce(size({fields}[{sql_string(cond.name)}]), 0) {test})"
    if isinstance(cond, Const):
        return _NULL_BOOL if cond.value is None else ("TRUE" if cond.value else "FALSE")
    if isinstance(cond, Not):
        inner = cond.operand
        while isinstance(inner, Not) and isinstance(inner.operand, Not):
            inner = inner.operand.operand  # NOT NOT x is x, UNKNOWN included
        if isinstance(inner, Not):
            return condition_sql(inner.operand, fields, max_bindings)
        return f"(NOT {condition_sql(inner, fields, max_bindings)})"
    joiner = " AND " if isinstance(cond, And) else " OR "
    parts = [condition_sql(c, fields, max_bindings) for c in _flatten(cond)]
    # Combine as a balanced tree: a chain of thousands of ORs would be parsed and analysed
    # as a tree thousands of levels deep, enough to overflow the JVM stack.
    while len(parts) > 1:
        paired = [f"({parts[i]}{joiner}{parts[i + 1]})" for i in range(0, len(parts) - 1, 2)]
        parts = paired + parts[-1:] if len(parts) % 2 else paired
    return parts[0]


def _flatten(cond: And | Or) -> list[Cond]:
    """The operands of `cond` with nested conditions of its own kind spliced in, in order."""
    kind = type(cond)
    out: list[Cond] = []
    stack: list[Cond] = [cond]
    while stack:
        c = stack.pop()
        if type(c) is kind:
            assert isinstance(c, And | Or)
            stack.extend(reversed(c.operands))
        else:
            out.append(c)
    return out


def condition_column(
    cond: Cond, fields: str = "fields", max_bindings: int = DEFAULT_MAX_BINDINGS
) -> Column:
    """`condition_sql` as a pyspark Column (imports pyspark on first use)."""
    from pyspark.sql import functions

    return functions.expr(condition_sql(cond, fields, max_bindings))
