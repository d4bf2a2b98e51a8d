"""Selector class "RFC-2254": LDAP string filters (RFC 4515) plus the project's extensions.

Theory of operation
-------------------
A hand-written scanner over the RFC 4515 grammar, in prefix notation:

    filter     = "(" filtercomp ")"
    filtercomp = "&" 1*filter / "|" 1*filter / "!" filter / item
    item       = attr ("=" / "~=" / ">=" / "<=" / ">" / "<") value

with selectors.md's extensions, all needed by the draft's own example
`&(symbol='XMPL') (|(net-change-pct > 5.0)(net-change-pct < -5.0))`: strict `>` and `<`, the
outer parentheses may be left out, a value may be wrapped in single quotes (stripped, and then
`(` and `)` need no escaping inside), and whitespace may separate any two components. An
unquoted value and every attribute name are trimmed.

A value is decoded after the quotes are stripped: `*` splits substrings (escape it as `\\2a`),
and `\\XX` escapes denote bytes, so `Lu\\c4\\8di\\c4\\87` is UTF-8 for `Lučić`.

`filter` and `filtercomp` call each other once per level of nesting; like the JMS rules they do
it through `descend`'s explicit stack, not Python's, and the depth (every parenthesised filter is
a level) is refused beyond `DEFAULT_MAX_NESTING` with a 567, which bounds the tree the
evaluators then recurse over.

Every item becomes a *two-valued* atom (selectors.md: a missing attribute makes every item but
presence FALSE, and `(!…)` of FALSE is TRUE), so this class never yields UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

from common.errors import SelectorError

from ._ast import (
    And,
    Atom,
    BoolLit,
    CmpOp,
    Compare,
    Cond,
    Const,
    Field,
    FieldType,
    IsNull,
    Like,
    LikePattern,
    Mode,
    Not,
    NumLit,
    Or,
    StrLit,
)
from ._eval import read_bool, to_number
from ._jms import descend, is_name_char
from ._limits import DEFAULT_MAX_NESTING

__all__ = ["parse_ldap"]

_OPERATORS = ("~=", ">=", "<=", "=", ">", "<")
_ORDERING = {">=": CmpOp.GE, "<=": CmpOp.LE, ">": CmpOp.GT, "<": CmpOp.LT}
_HEX = frozenset("0123456789abcdefABCDEF")
_SPACE = " \t\r\n"

#: A filter rule as `descend` runs it: it yields sub-rules and returns a condition.
_Rule = Generator["_Rule", Cond, Cond]


class _Parser:
    def __init__(self, text: str, types: Mapping[str, FieldType] | None) -> None:
        self.text = text
        self.pos = 0
        self.types = types
        self.depth = 0

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _SPACE:
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos : self.pos + 1]

    def parse(self) -> Cond:
        self.skip_space()
        if self.pos == len(self.text):
            return Const(True)  # like an absent selector: every message
        # Without a leading '(' the outer parentheses were left out (a project extension).
        cond = descend(self.filter() if self.peek() == "(" else self.filtercomp(top=True))
        self.skip_space()
        if self.pos < len(self.text):
            if self.peek() == ")":
                raise SelectorError("unbalanced parentheses: unexpected ')'", self.pos)
            raise SelectorError("unexpected text after the filter", self.pos)
        return cond

    def filter(self) -> _Rule:
        self.skip_space()
        start = self.pos
        if self.peek() != "(":
            found = repr(self.peek()) if self.peek() else "the end"
            raise SelectorError(f"expected '(', found {found}", self.pos)
        self.pos += 1
        self.depth += 1
        if self.depth > DEFAULT_MAX_NESTING:
            raise SelectorError(f"filter nested deeper than {DEFAULT_MAX_NESTING} levels", start)
        cond = yield self.filtercomp(top=False)
        self.skip_space()
        if self.peek() != ")":
            if not self.peek():
                raise SelectorError("unbalanced parentheses: '(' is never closed", start)
            raise SelectorError(f"expected ')', found {self.peek()!r}", self.pos)
        self.pos += 1
        self.depth -= 1
        return cond

    def filtercomp(self, top: bool) -> _Rule:
        self.skip_space()
        ch, start = self.peek(), self.pos
        if ch in ("&", "|"):
            self.pos += 1
            parts: list[Cond] = []
            self.skip_space()
            while self.peek() == "(":
                parts.append((yield self.filter()))
                self.skip_space()
            if not parts:
                raise SelectorError(f"empty ({ch}): it needs at least one filter", start)
            return And(tuple(parts)) if ch == "&" else Or(tuple(parts))
        if ch == "!":
            self.pos += 1
            return Not((yield self.filter()))
        return self.item(top)

    def item(self, top: bool) -> Cond:
        self.skip_space()
        start = self.pos
        while self.pos < len(self.text) and is_name_char(self.text[self.pos]):
            self.pos += 1
        name = self.text[start : self.pos]
        if not name:
            if self.peek() in ("", ")") or self.peek() in "=<>~":
                raise SelectorError("empty attribute name", start)
            raise SelectorError(f"unexpected {self.peek()!r} where an attribute name belongs",
                                self.pos)
        if not (name[0] == "_" or name[0].isalpha()):
            raise SelectorError(f"attribute name {name!r} is not an XML name", start)
        self.skip_space()
        op_pos = self.pos
        op = next((o for o in _OPERATORS if self.text.startswith(o, self.pos)), None)
        if op is None:
            if self.peek() == ":":
                raise SelectorError("extensible match (:=) is not supported by this class",
                                    self.pos)
            found = repr(self.peek()) if self.peek() else "the end"
            raise SelectorError(f"unknown filter operator at {found}", self.pos)
        self.pos += len(op)
        ftype = self.field_type(name, start)
        raw, value_pos = self.raw_value(top)
        parts = self.split_stars(raw, value_pos)
        field = Field(name, ftype)
        if len(parts) > 1:
            if op != "=":
                raise SelectorError(f"'*' is only allowed with '=' (escape it as \\2a), "
                                    f"not with {op!r}", value_pos)
            if parts == ["", ""]:
                return IsNull(name, negated=True)
            segments = tuple((p.lower(),) if p else () for p in parts)
            return Atom(Like(field, LikePattern(segments, caseless=True)), (name,), True)
        value = parts[0]
        if op == "~=":
            pred = Compare(CmpOp.EQ, field, StrLit(value), Mode.APPROX)
        elif ftype is FieldType.NUMBER:
            number = to_number(value)
            if number is None:
                raise SelectorError(f"{name!r} is declared numeric, but {value!r} is not a "
                                    "number", value_pos)
            pred = Compare(_ORDERING.get(op, CmpOp.EQ), field, NumLit(number), Mode.NUMBER)
        elif ftype is FieldType.BOOLEAN:
            truth = read_bool(value, ftype)
            if truth is None or op != "=":
                raise SelectorError(f"{name!r} is declared boolean: only (x=true) and "
                                    "(x=false) apply", op_pos)
            pred = Compare(CmpOp.EQ, field, BoolLit(truth), Mode.BOOLEAN)
        elif op == "=":
            pred = Compare(CmpOp.EQ, field, StrLit(value), Mode.CASELESS)
        else:
            # Declared strings order as text even when both look numeric.
            mode = Mode.CASELESS if ftype is FieldType.STRING else Mode.LDAP_ORDER
            pred = Compare(_ORDERING[op], field, StrLit(value), mode)
        return Atom(pred, (name,), True)

    def field_type(self, name: str, pos: int) -> FieldType:
        if self.types is None:
            return FieldType.TEXT
        found = self.types.get(name)
        if found is None:
            raise SelectorError(f"attribute {name!r} is not in the topic's selector schema", pos)
        return found

    def raw_value(self, top: bool) -> tuple[str, int]:
        """The undecoded value text (quotes stripped, or trimmed) and where it starts."""
        self.skip_space()
        start = self.pos
        if self.peek() == "'":
            end = self.text.find("'", start + 1)
            if end < 0:
                raise SelectorError("unterminated quoted value", start)
            self.pos = end + 1
            return self.text[start + 1 : end], start + 1
        end = start
        while end < len(self.text) and self.text[end] != ")":
            if self.text[end] == "(":
                raise SelectorError("unescaped '(' in a value (write \\28)", end)
            end += 1
        if end == len(self.text) and not top:
            raise SelectorError("unbalanced parentheses: the filter is never closed", start)
        self.pos = end
        raw = self.text[start:end]
        trimmed = raw.strip(_SPACE)
        return trimmed, start + (len(raw) - len(raw.lstrip(_SPACE)))

    def split_stars(self, raw: str, pos: int) -> list[str]:
        """Split on unescaped `*` and decode each part's `\\XX` escapes as UTF-8."""
        parts: list[str] = []
        buf = bytearray()
        i = 0
        part_start = 0
        while i < len(raw):
            ch = raw[i]
            if ch == "\\":
                pair = raw[i + 1 : i + 3]
                if len(pair) != 2 or not set(pair) <= _HEX:
                    raise SelectorError("bad escape: '\\' must be followed by two hex digits",
                                        pos + i)
                buf.append(int(pair, 16))
                i += 3
                continue
            if ch == "*":
                parts.append(self.decode(buf, pos + part_start))
                buf = bytearray()
                part_start = i + 1
            else:
                buf.extend(ch.encode("utf-8", "surrogatepass"))
            i += 1
        parts.append(self.decode(buf, pos + part_start))
        return parts

    def decode(self, buf: bytearray, pos: int) -> str:
        try:
            return buf.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SelectorError("bad escape: the escaped bytes are not UTF-8", pos) from exc


def parse_ldap(text: str, types: Mapping[str, FieldType] | None = None) -> Cond:
    """Compile an RFC-2254 selector text to a condition tree, or raise SelectorError (567)."""
    return _Parser(text, types).parse()
