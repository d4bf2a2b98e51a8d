"""Grammar-based random selectors (both classes) and random messages, for differential tests.

Selectors are drawn from the full grammar each class accepts, over a small vocabulary so that
identifiers collide with message fields often; message values are drawn from the values where
the two backends could plausibly disagree (numbers Spark's cast would take but selectors.md does
not, case variants, whitespace runs, newlines, LIKE metacharacters, non-ASCII, huge exponents).
Everything is driven by a `random.Random`, so a seed reproduces a corpus.
"""

from __future__ import annotations

import random

from lxml import etree

#: Identifiers in selectors and element/attribute names in messages.
NAMES = ("a", "b", "price", "sym", "flag", "net-change", "x.y", "missing")

#: Message values, chosen for where two backends could disagree.
VALUES = (
    "5", "-5.25", "1e3", ".5", "7.", "10", "10.0", "0", "-0", "+62", "3.5", "2",
    "1_000", "NaN", "Infinity", "12abc", "1e400", "-1e400", "9999999999999999999", "",
    "abc", "ABC", "aBc", "a b", "a  B", "a%b", "a_b", "x\ny", "true", "TRUE", "false",
    "False", "yes", "1", "é", "É", "ü", "\U0001f600", "Lučić", "LUČIĆ", "xaxb", "ab", "ba",
)

_NUMS = ("0", "5", "-5.25", "1e3", ".5", "7.", "10", "2", "3.5", "+62", "-0", "1E2", "1e400")
_STRS = ("abc", "ABC", "a b", "a%b", "", "it''s", "é", "true", "5", "Lučić", "x\ny")
_LIKE_PIECES = ("a", "b", "%", "_", "x", "é", "\n", "ab", "%%", "\\%", "\\_", "y")


class JmsGen:
    """Random JMS selectors that compile (typing is respected by construction)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def ident(self) -> str:
        return self.rng.choice(NAMES)

    def num(self, depth: int) -> str:
        r = self.rng.random()
        if depth <= 0 or r < 0.45:
            return self.rng.choice(_NUMS) if self.rng.random() < 0.5 else self.ident()
        if r < 0.55:
            return f"-{self.num(depth - 1)}" if self.rng.random() < 0.7 else f"+{self.ident()}"
        if r < 0.65:
            return f"({self.num(depth - 1)})"
        op = self.rng.choice("+-*/")
        left, right = self.num(depth - 1), self.num(depth - 1)
        if op == "-" and left[-1] in "0123456789." and self.rng.random() < 0.5:
            return f"{left}-{right}"  # `0-A`: glued to a number, '-' is still subtraction
        return f"{left} {op} {right}"

    def string(self) -> str:
        return "'" + self.rng.choice(_STRS) + "'"

    def cmp_op(self, ordering: bool = True) -> str:
        ops = ["=", "<>", "<", "<=", ">", ">="] if ordering else ["=", "<>"]
        return self.rng.choice(ops)

    def predicate(self, depth: int) -> str:
        rng = self.rng
        kind = rng.randrange(9)
        negate = rng.choice(["", "NOT "])
        if kind == 0:
            return f"{self.num(depth)} {self.cmp_op()} {self.num(depth)}"
        if kind == 1:
            return f"{self.ident()} {self.cmp_op(False)} {self.string()}"
        if kind == 2:
            return f"{self.ident()} {self.cmp_op(False)} {rng.choice(['TRUE', 'FALSE', 'true'])}"
        if kind == 3:
            return f"{self.ident()} {self.cmp_op()} {self.ident()}"
        if kind == 4:
            return f"{self.num(depth)} {negate}BETWEEN {self.num(depth)} AND {self.num(depth)}"
        if kind == 5:
            items = ", ".join(self.string() for _ in range(rng.randint(1, 4)))
            return f"{self.ident()} {negate}IN ({items})"
        if kind == 6:
            pattern = "".join(rng.choice(_LIKE_PIECES) for _ in range(rng.randint(0, 6)))
            escape = " ESCAPE '\\'" if "\\" in pattern else ""
            if not escape:
                pattern = pattern.replace("\\", "")
            return f"{self.ident()} {negate}LIKE '{pattern}'{escape}"
        if kind == 7:
            return f"{self.ident()} IS {rng.choice(['', 'NOT '])}NULL"
        return rng.choice([self.ident(), "TRUE", "FALSE"])

    def cond(self, depth: int = 3) -> str:
        r = self.rng.random()
        if depth <= 0 or r < 0.4:
            return self.predicate(1)
        if r < 0.5:
            return f"NOT {self.cond(depth - 1)}"
        if r < 0.6:
            return f"({self.cond(depth - 1)})"
        op = self.rng.choice([" AND ", " OR ", " and ", " Or "])
        parts = [self.cond(depth - 1) for _ in range(self.rng.randint(2, 3))]
        return "(" + op.join(parts) + ")"


def _ldap_escape(text: str, rng: random.Random) -> str:
    out = []
    for ch in text:
        if ch in "()*\\" or (not ch.isascii() and rng.random() < 0.5):
            out.append("".join(f"\\{b:02x}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


class LdapGen:
    """Random RFC-2254 filters, with the project's extensions mixed in."""

    _VALUES = ("abc", "ABC", "a b", "a  B ", "5", "10", "-5.25", "1e3", "é", "Lučić", "true",
               "x(y)", "a*b", "", "7.", "ba", "12abc")

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def item(self) -> str:
        rng = self.rng
        name = rng.choice(NAMES)
        op = rng.choice(["=", "=", "~=", ">=", "<=", ">", "<", "=*", "sub"])
        if op == "=*":
            return f"({name}=*)"
        if op == "sub":
            parts = [_ldap_escape(rng.choice(self._VALUES[:12]), rng)
                     for _ in range(rng.randint(2, 4))]
            parts[0] = parts[0] if rng.random() < 0.5 else ""
            parts[-1] = parts[-1] if rng.random() < 0.5 else ""
            return f"({name}={'*'.join(parts)})"
        value = _ldap_escape(rng.choice(self._VALUES), rng)
        if rng.random() < 0.2 and value and "'" not in value:
            value = f"'{value}'"
        space = rng.choice(["", " "])
        return f"({name}{space}{op}{space}{value})"

    def filter(self, depth: int = 3) -> str:
        r = self.rng.random()
        if depth <= 0 or r < 0.4:
            return self.item()
        if r < 0.55:
            return f"(!{self.filter(depth - 1)})"
        op = self.rng.choice("&|")
        parts = "".join(self.filter(depth - 1) for _ in range(self.rng.randint(1, 3)))
        return f"({op}{parts})"

    def selector(self) -> str:
        text = self.filter()
        if self.rng.random() < 0.2 and text.startswith("(") and text[1] in "&|!":
            text = text[1:-1]  # leave out the outer parentheses
        return text


def random_message(rng: random.Random) -> bytes:
    """A bare-content XML message: repeated elements, attributes, missing names."""
    root = etree.Element("quote")
    for name in NAMES[:-1]:
        r = rng.random()
        if r < 0.25:
            continue
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            if rng.random() < 0.3:
                holder = etree.SubElement(root, "item")
                holder.set(name, rng.choice(VALUES))
            else:
                child = etree.SubElement(root, name)
                child.text = rng.choice([" ", "", "\n  "]) + rng.choice(VALUES)
    return bytes(etree.tostring(root, encoding="utf-8"))
