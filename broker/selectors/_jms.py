"""Selector class "JMS": tokenizer and recursive-descent parser to the shared condition tree.

Theory of operation
-------------------
The grammar is JMS 1.1 §3.8 with selectors.md's identifier rule (XML NCNames, so `a-b` is one
identifier and subtraction needs spaces). One function per precedence level, high to low:
unary `+ -`; `* /`; `+ -`; comparison / BETWEEN / IN / LIKE / IS NULL; NOT; AND; OR.

Typing happens while parsing. Each sub-expression carries a static `_Kind`: a number (numeric
literal, arithmetic, or an identifier declared numeric), a string, a boolean, an untyped
identifier (no schema: typed by context), or a condition. Every operator checks its operands'
kinds and either picks the comparison `Mode` the evaluators follow or raises `SelectorError`
with the operator's position. So everything selectors.md calls a compile error is one here, and
the evaluators never meet a combination they have to guess about.

Nesting is bounded twice over, so that no selector text, however deep, reaches Python's
recursion limit (a `RecursionError` would be a crash, not a 567):

- The rules do not call each other on the Python stack. Each is a generator that *yields* the
  sub-rule it needs and is sent back its result; `descend` runs them off an explicit list. So the
  parser's own stack use is constant, whatever the depth.
- The tree it builds is what the evaluators and the Spark compiler recurse over, once per level,
  so its depth is bounded by `DEFAULT_MAX_NESTING` (567 beyond, at the offending token). One
  counter, `depth`, holds the constructs open around the current token (parentheses, NOT, unary
  signs); every node built records its own tree depth (AND, OR, NOT, a sign or an arithmetic
  operator is one level, an atomic predicate and a leaf none) and the two together must stay
  within the bound. So `n` nested parentheses, `n` NOTs, `n` signs or an `n`-long arithmetic
  chain each compile for n <= the bound and are refused beyond it, and any mixture of them
  builds a tree no deeper than the bound.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from common.errors import SelectorError

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
    predicate_fields,
)
from ._limits import DEFAULT_MAX_NESTING

__all__ = ["KEYWORDS", "descend", "parse_jms"]

#: Reserved words, matched case-insensitively; none of them can be an identifier.
KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"}
)

_NUMBER = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",")
_COMPARISONS = {op.value: op for op in CmpOp}


def is_name_start(ch: str) -> bool:
    return ch == "_" or ch.isalpha()


def is_name_char(ch: str) -> bool:
    # NCName: letters, digits, '-', '_', '.', plus the combining marks and U+00B7 XML allows.
    return ch.isalnum() or ch in "-_.\u00b7" or (ch >= "\u0300" and ch <= "\u036f")


_T = TypeVar("_T")


def descend(rule: Generator[Any, _T, _T]) -> _T:
    """Run a recursive-descent `rule` on an explicit stack instead of Python's.

    A rule is a generator: where a plain parser would call a sub-rule, it yields the sub-rule's
    generator and is sent back what that returned. The stack here grows with the nesting of the
    text, Python's does not, so only the parsers' depth bound decides what is too deep.
    """
    stack = [rule]
    result: Any = None
    while True:
        try:
            sub = stack[-1].send(result)
        except StopIteration as done:
            stack.pop()
            if not stack:
                return done.value  # type: ignore[no-any-return]
            result = done.value
            continue
        stack.append(sub)
        result = None


class _Tok(Enum):
    IDENT = "identifier"
    KEYWORD = "keyword"
    NUMBER = "number"
    STRING = "string"
    OP = "operator"
    END = "end of selector"


@dataclass(frozen=True, slots=True)
class _Token:
    kind: _Tok
    text: str
    pos: int


def tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch == "'":
            j, parts = i + 1, []
            while True:
                k = text.find("'", j)
                if k < 0:
                    raise SelectorError("unterminated string literal", i)
                parts.append(text[j:k])
                if k + 1 < n and text[k + 1] == "'":
                    parts.append("'")
                    j = k + 2
                    continue
                break
            tokens.append(_Token(_Tok.STRING, "".join(parts), i))
            i = k + 1
        elif (ch.isdigit() and ch.isascii()) or (ch == "." and text[i + 1 : i + 2].isdigit()
                                                   and text[i + 1 : i + 2].isascii()):
            m = _NUMBER.match(text, i)
            assert m is not None  # the first character guarantees a match
            end = m.end()
            # No identifier starts with a digit, so a '-' straight after a number can only be
            # subtraction (`0-A`); any other name character glued on (`12abc`, `1.5.3`) is a
            # malformed literal.
            if end < n and text[end] != "-" and is_name_char(text[end]):
                bad = end
                while bad < n and is_name_char(text[bad]):
                    bad += 1
                raise SelectorError(f"invalid numeric literal {text[i:bad]!r}", i)
            tokens.append(_Token(_Tok.NUMBER, m.group(), i))
            i = end
        elif is_name_start(ch):
            j = i + 1
            while j < n and is_name_char(text[j]):
                j += 1
            word = text[i:j]
            if word.upper() in KEYWORDS:
                tokens.append(_Token(_Tok.KEYWORD, word.upper(), i))
            else:
                tokens.append(_Token(_Tok.IDENT, word, i))
            i = j
        else:
            for op in _OPERATORS:
                if text.startswith(op, i):
                    tokens.append(_Token(_Tok.OP, op, i))
                    i += len(op)
                    break
            else:
                hint = " (JMS writes not-equal as <>)" if text.startswith("!=", i) else ""
                raise SelectorError(f"unexpected character {ch!r}{hint}", i)
    tokens.append(_Token(_Tok.END, "", n))
    return tokens


class _Kind(Enum):
    NUMBER = "a number"
    STRING = "a string"
    BOOLEAN = "a boolean"
    TEXT = "an identifier"
    COND = "a condition"


@dataclass(frozen=True, slots=True)
class _Expr:
    kind: _Kind
    node: Value | Cond
    pos: int
    #: The depth of `node`'s tree (see the module docstring; a leaf or an atom is 0).
    depth: int = 0


#: A JMS grammar rule as `descend` runs it: it yields sub-rules and returns an expression.
_Rule = Generator["_Rule", _Expr, _Expr]


_FIELD_KIND = {
    FieldType.TEXT: _Kind.TEXT,
    FieldType.NUMBER: _Kind.NUMBER,
    FieldType.STRING: _Kind.STRING,
    FieldType.BOOLEAN: _Kind.BOOLEAN,
}


class _Parser:
    def __init__(self, text: str, types: Mapping[str, FieldType] | None) -> None:
        self.tokens = tokenize(text)
        self.i = 0
        self.types = types
        self.depth = 0

    # --- token helpers ----------------------------------------------------------------------

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at_keyword(self, *words: str) -> bool:
        return self.tok.kind is _Tok.KEYWORD and self.tok.text in words

    def at_op(self, *ops: str) -> bool:
        return self.tok.kind is _Tok.OP and self.tok.text in ops

    def expect_keyword(self, word: str) -> _Token:
        if not self.at_keyword(word):
            raise self.unexpected(f"expected {word}")
        return self.take()

    def unexpected(self, wanted: str) -> SelectorError:
        tok = self.tok
        found = tok.kind.value if tok.kind is _Tok.END else f"{tok.kind.value} {tok.text!r}"
        return SelectorError(f"{wanted}, found {found}", tok.pos)

    def enter(self, pos: int) -> None:
        """Open one construct (a parenthesis, NOT or a sign) around what is parsed next."""
        self.depth += 1
        self.check_depth(0, pos)

    def check_depth(self, depth: int, pos: int) -> None:
        if self.depth + depth > DEFAULT_MAX_NESTING:
            raise SelectorError(f"selector nested deeper than {DEFAULT_MAX_NESTING} levels", pos)

    def node(self, kind: _Kind, node: Value | Cond, pos: int, depth: int) -> _Expr:
        """A new expression whose tree is `depth` deep, refused if that goes past the bound."""
        self.check_depth(depth, pos)
        return _Expr(kind, node, pos, depth)

    # --- conditions -------------------------------------------------------------------------

    def parse(self) -> Cond:
        if self.tok.kind is _Tok.END:
            return Const(True)  # an empty selector matches every message
        expr = descend(self.parse_or())
        tok = self.tok
        if tok.kind is not _Tok.END:
            if self.at_op(")"):
                raise SelectorError("unbalanced parentheses: unexpected ')'", tok.pos)
            raise self.unexpected("expected an operator or the end of the selector")
        return self.as_cond(expr)

    def parse_or(self) -> _Rule:
        first = yield self.parse_and()
        if not self.at_keyword("OR"):
            return first
        parts, depth = [self.as_cond(first)], first.depth
        while self.at_keyword("OR"):
            self.take()
            nxt = yield self.parse_and()
            parts.append(self.as_cond(nxt))
            depth = max(depth, nxt.depth)
        return self.node(_Kind.COND, Or(tuple(parts)), first.pos, depth + 1)

    def parse_and(self) -> _Rule:
        first = yield self.parse_not()
        if not self.at_keyword("AND"):
            return first
        parts, depth = [self.as_cond(first)], first.depth
        while self.at_keyword("AND"):
            self.take()
            nxt = yield self.parse_not()
            parts.append(self.as_cond(nxt))
            depth = max(depth, nxt.depth)
        return self.node(_Kind.COND, And(tuple(parts)), first.pos, depth + 1)

    def parse_not(self) -> _Rule:
        if self.at_keyword("NOT"):
            pos = self.take().pos
            self.enter(pos)
            operand = yield self.parse_not()
            self.depth -= 1
            return self.node(_Kind.COND, Not(self.as_cond(operand)), pos, operand.depth + 1)
        return (yield self.parse_predicate())

    def as_cond(self, expr: _Expr) -> Cond:
        node = expr.node
        if expr.kind is _Kind.COND:
            assert isinstance(node, Atom | IsNull | Const | Not | And | Or)
            return node
        if isinstance(node, BoolLit):
            return Const(node.value)
        if isinstance(node, Field) and node.type in (FieldType.TEXT, FieldType.BOOLEAN):
            return Atom(Truth(node), (node.name,))
        raise SelectorError(f"expected a condition, found {expr.kind.value}", expr.pos)

    def parse_predicate(self) -> _Rule:
        left = yield self.parse_additive()
        tok = self.tok
        if tok.kind is _Tok.OP and tok.text in _COMPARISONS:
            self.take()
            right = yield self.parse_additive()
            result = self.compare(_COMPARISONS[tok.text], left, right, tok.pos)
            if self.tok.kind is _Tok.OP and self.tok.text in _COMPARISONS:
                raise SelectorError("comparisons do not chain; use AND", self.tok.pos)
            return result
        negated = False
        if self.at_keyword("NOT"):
            nxt = self.tokens[self.i + 1]
            if not (nxt.kind is _Tok.KEYWORD and nxt.text in ("BETWEEN", "IN", "LIKE")):
                raise SelectorError("NOT here must be followed by BETWEEN, IN or LIKE", tok.pos)
            self.take()
            negated = True
        if self.at_keyword("BETWEEN"):
            return (yield self.between(left, negated))
        if self.at_keyword("IN"):
            return self.in_list(left, negated)
        if self.at_keyword("LIKE"):
            return self.like(left, negated)
        if self.at_keyword("IS"):
            pos = self.take().pos
            is_not = bool(self.at_keyword("NOT")) and self.take() is not None
            self.expect_keyword("NULL")
            return _Expr(_Kind.COND, IsNull(self.field_name(left, "IS NULL", pos), is_not), pos)
        return left

    def field_name(self, expr: _Expr, what: str, pos: int) -> str:
        if not isinstance(expr.node, Field):
            raise SelectorError(f"{what} applies to an identifier, not {expr.kind.value}", pos)
        return expr.node.name

    def text_field(self, expr: _Expr, what: str, pos: int) -> Field:
        self.field_name(expr, what, pos)
        assert isinstance(expr.node, Field)
        if expr.node.type not in (FieldType.TEXT, FieldType.STRING):
            raise SelectorError(
                f"{what} needs a string, but {expr.node.name!r} is declared "
                f"{expr.node.type.value} in the selector schema", pos)
        return expr.node

    def between(self, left: _Expr, negated: bool) -> _Rule:
        pos = self.take().pos
        low = yield self.parse_additive()
        self.expect_keyword("AND")
        high = yield self.parse_additive()
        for part in (left, low, high):
            self.numeric_operand(part, "BETWEEN")
        pred = Between(self.value(left), self.value(low), self.value(high), negated)
        depth = max(left.depth, low.depth, high.depth)
        return self.node(_Kind.COND, Atom(pred, predicate_fields(pred)), pos, depth)

    def in_list(self, left: _Expr, negated: bool) -> _Expr:
        pos = self.take().pos
        field = self.text_field(left, "IN", pos)
        if not self.at_op("("):
            raise self.unexpected("expected '(' after IN")
        self.take()
        items: list[str] = []
        while True:
            if self.tok.kind is not _Tok.STRING:
                if self.at_op(")"):
                    what = "an empty IN list" if not items else "a trailing comma in the IN list"
                    raise SelectorError(f"{what} is not allowed", self.tok.pos)
                raise self.unexpected("IN takes string literals only")
            items.append(self.take().text)
            if self.at_op(","):
                self.take()
                continue
            if self.at_op(")"):
                self.take()
                break
            raise self.unexpected("expected ',' or ')' in the IN list")
        pred = InList(field, tuple(items), negated)
        return _Expr(_Kind.COND, Atom(pred, (field.name,)), pos)

    def like(self, left: _Expr, negated: bool) -> _Expr:
        pos = self.take().pos
        field = self.text_field(left, "LIKE", pos)
        if self.tok.kind is not _Tok.STRING:
            raise self.unexpected("LIKE takes a string literal pattern")
        pattern_tok = self.take()
        escape: str | None = None
        if self.at_keyword("ESCAPE"):
            self.take()
            if self.tok.kind is not _Tok.STRING:
                raise self.unexpected("ESCAPE takes a string literal")
            esc = self.take()
            if len(esc.text) != 1:
                raise SelectorError("the ESCAPE string must be exactly one character", esc.pos)
            escape = esc.text
        pattern = like_pattern(pattern_tok.text, escape, pattern_tok.pos)
        return _Expr(_Kind.COND, Atom(Like(field, pattern, negated), (field.name,)), pos)

    def compare(self, op: CmpOp, left: _Expr, right: _Expr, pos: int) -> _Expr:
        kinds = {left.kind, right.kind}
        if _Kind.COND in kinds:
            raise SelectorError("a condition cannot be compared; use it directly", pos)
        lnode, rnode = self.value(left), self.value(right)
        if kinds == {_Kind.TEXT}:
            mode = Mode.DYNAMIC
        elif kinds <= {_Kind.TEXT, _Kind.NUMBER}:
            mode = Mode.NUMBER
        elif kinds <= {_Kind.TEXT, _Kind.STRING}:
            mode = Mode.STRING
        elif kinds <= {_Kind.TEXT, _Kind.BOOLEAN}:
            mode = Mode.BOOLEAN
            if _Kind.TEXT in kinds:
                # An untyped identifier meets TRUE/FALSE as the text 'true'/'false', any case.
                lnode, rnode = (_bool_text(n) for n in (lnode, rnode))
                mode = Mode.CASELESS if any(
                    isinstance(n, StrLit) for n in (lnode, rnode)) else Mode.BOOLEAN
        else:
            a, b = sorted(k.value for k in kinds)
            raise SelectorError(f"cannot compare {a} with {b}", pos)
        if op.is_ordering and mode in (Mode.STRING, Mode.BOOLEAN, Mode.CASELESS):
            what = "strings" if mode is Mode.STRING else "booleans"
            raise SelectorError(f"{what} compare only with = and <>, not {op.value}", pos)
        pred = Compare(op, lnode, rnode, mode)
        depth = max(left.depth, right.depth)
        return self.node(_Kind.COND, Atom(pred, predicate_fields(pred)), pos, depth)

    def value(self, expr: _Expr) -> Value:
        node = expr.node
        assert isinstance(node, Field | NumLit | StrLit | BoolLit | Arith | Neg)
        return node

    def numeric_operand(self, expr: _Expr, what: str) -> None:
        if expr.kind not in (_Kind.NUMBER, _Kind.TEXT):
            raise SelectorError(f"{what} needs numbers, found {expr.kind.value}", expr.pos)

    # --- values -----------------------------------------------------------------------------

    def parse_additive(self) -> _Rule:
        left = yield self.parse_multiplicative()
        while self.at_op("+", "-"):
            tok = self.take()
            right = yield self.parse_multiplicative()
            left = self.arith(ArithOp(tok.text), left, right, tok.pos)
        return left

    def parse_multiplicative(self) -> _Rule:
        left = yield self.parse_unary()
        while self.at_op("*", "/"):
            tok = self.take()
            right = yield self.parse_unary()
            left = self.arith(ArithOp(tok.text), left, right, tok.pos)
        return left

    def arith(self, op: ArithOp, left: _Expr, right: _Expr, pos: int) -> _Expr:
        self.numeric_operand(left, f"'{op.value}'")
        self.numeric_operand(right, f"'{op.value}'")
        depth = max(left.depth, right.depth) + 1
        self.check_depth(depth, pos)  # refused at the operator; the expression starts at left
        node = Arith(op, self.value(left), self.value(right))
        return _Expr(_Kind.NUMBER, node, left.pos, depth)

    def parse_unary(self) -> _Rule:
        if self.at_op("+", "-"):
            tok = self.take()
            self.enter(tok.pos)
            operand = yield self.parse_unary()
            self.depth -= 1
            self.numeric_operand(operand, f"unary '{tok.text}'")
            node = self.value(operand)
            result: Value
            depth = operand.depth
            if tok.text == "+":
                # `+x` reads x in numeric context, so it is not the bare (untyped) identifier.
                if isinstance(node, Field):
                    result, depth = Neg(Neg(node)), depth + 2
                else:
                    result = node
            elif isinstance(node, NumLit):
                result = NumLit(-node.value)  # so `-957` is a literal, as in JMS
            else:
                result, depth = Neg(node), depth + 1
            return self.node(_Kind.NUMBER, result, tok.pos, depth)
        return (yield self.parse_primary())

    def parse_primary(self) -> _Rule:
        tok = self.tok
        if tok.kind is _Tok.NUMBER:
            self.take()
            return _Expr(_Kind.NUMBER, NumLit(float(tok.text)), tok.pos)
        if tok.kind is _Tok.STRING:
            self.take()
            return _Expr(_Kind.STRING, StrLit(tok.text), tok.pos)
        if tok.kind is _Tok.IDENT:
            self.take()
            return self.identifier(tok)
        if self.at_keyword("TRUE", "FALSE"):
            self.take()
            return _Expr(_Kind.BOOLEAN, BoolLit(tok.text == "TRUE"), tok.pos)
        if self.at_keyword("NULL"):
            raise SelectorError("NULL is only allowed in IS [NOT] NULL", tok.pos)
        if tok.kind is _Tok.KEYWORD:
            raise SelectorError(
                f"keyword {tok.text} cannot be used as an identifier or value", tok.pos)
        if self.at_op("("):
            self.take()
            self.enter(tok.pos)
            inner = yield self.parse_or()
            self.depth -= 1
            if not self.at_op(")"):
                if self.tok.kind is _Tok.END:
                    raise SelectorError("unbalanced parentheses: '(' is never closed", tok.pos)
                raise self.unexpected("expected ')'")
            self.take()
            return inner
        if tok.kind is _Tok.END:
            raise SelectorError("the selector ends where an operand was expected", tok.pos)
        if self.at_op(")"):
            raise SelectorError("unexpected ')': an operand is missing", tok.pos)
        raise self.unexpected("expected an operand")

    def identifier(self, tok: _Token) -> _Expr:
        if self.types is None:
            ftype = FieldType.TEXT
        else:
            found = self.types.get(tok.text)
            if found is None:
                raise SelectorError(
                    f"identifier {tok.text!r} is not in the topic's selector schema", tok.pos)
            ftype = found
        return _Expr(_FIELD_KIND[ftype], Field(tok.text, ftype), tok.pos)


def _bool_text(node: Value) -> Value:
    return StrLit("true" if node.value else "false") if isinstance(node, BoolLit) else node


def like_pattern(text: str, escape: str | None, pos: int) -> LikePattern:
    """Split a JMS LIKE pattern into `%`-separated segments of literal runs and `_`s."""
    segments: list[tuple[str | None, ...]] = []
    pieces: list[str | None] = []
    run: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if escape is not None and ch == escape:
            nxt = text[i + 1 : i + 2]
            if nxt not in ("_", "%", escape) or nxt == "":
                raise SelectorError(
                    f"escape character {escape!r} must be followed by '_', '%' or itself "
                    "in the LIKE pattern", pos + 1 + i)
            run.append(nxt)
            i += 2
            continue
        if ch in "_%":
            if run:
                pieces.append("".join(run))
                run = []
            if ch == "_":
                pieces.append(None)
            else:
                segments.append(tuple(pieces))
                pieces = []
        else:
            run.append(ch)
        i += 1
    if run:
        pieces.append("".join(run))
    segments.append(tuple(pieces))
    return LikePattern(tuple(segments))


def parse_jms(text: str, types: Mapping[str, FieldType] | None = None) -> Cond:
    """Compile a JMS selector text to a condition tree, or raise SelectorError (567)."""
    return _Parser(text, types).parse()
