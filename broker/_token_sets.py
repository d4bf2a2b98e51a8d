"""Token sets: which permission tokens (XEP-0040 §5.1) a grant or deny names. Pure; the
grammar is documented in `broker/entitlements.py`, which re-exports every public name.

A set is a comma list of items, each one of

    *            every token
    PREFIX*      every token that starts with PREFIX (PREFIX itself included)
    LOW-HIGH     every token that is a decimal number from LOW to HIGH, inclusive
    TOKEN        exactly that token

Items are parsed strictly: anything the grammar does not name is refused with
InvalidParameter (553) saying what is wrong, never read as an exact token by accident -- a
typo in a deny must not quietly deny nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from common.errors import InvalidParameter

__all__ = [
    "MAX_ITEMS",
    "MAX_SPEC_LENGTH",
    "MAX_TOKEN_LENGTH",
    "TokenSet",
    "parse_token_items",
    "parse_token_set",
]

#: The publish option's limit on a permission token (robust-binding §2.3); an item longer than
#: any token could match nothing.
MAX_TOKEN_LENGTH = 256
#: Items in one set. A desk's entitlements are tens of ranges; thousands would be a mistake.
MAX_ITEMS = 1024
#: The whole comma list, as the CLI or the access file gives it.
MAX_SPEC_LENGTH = 64 * 1024

_DIGITS = re.compile(r"[0-9]+")
_RANGE = re.compile(r"([0-9]+)-([0-9]+)")
#: an item of digits and dashes that is not LOW-HIGH: an open or doubled range, a negative
_RANGE_LIKE = re.compile(r"[0-9-]*-[0-9-]*")
#: characters no item may contain (whitespace anywhere inside is refused separately)
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f,]")


@dataclass(frozen=True, slots=True)
class TokenSet:
    """A compiled token set; build it with `parse_token_set` or `parse_token_items`.

    `items` is the set as written (deduplicated, in order): what is stored and listed."""

    items: tuple[str, ...]
    everything: bool
    exact: frozenset[str]
    prefixes: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...]

    def matches(self, token: str) -> bool:
        """Is `token` (a message's permission token) in this set?"""
        if self.everything or token in self.exact:
            return True
        if any(token.startswith(p) for p in self.prefixes):
            return True
        if self.ranges and len(token) <= MAX_TOKEN_LENGTH and _DIGITS.fullmatch(token):
            value = int(token)
            return any(lo <= value <= hi for lo, hi in self.ranges)
        return False

    def __str__(self) -> str:
        return ",".join(self.items)


def _item(item: str, spec: str) -> tuple[str, object]:
    """Classify one stripped item: ("all", None), ("prefix", p), ("range", (lo, hi)) or
    ("exact", token); InvalidParameter for anything else."""
    shown = item if len(item) <= 40 else item[:40] + "…"
    if not item:
        raise InvalidParameter(f"token set {spec[:80]!r} has an empty item (two commas, or a "
                               "comma at an end); give TOKEN, PREFIX*, LOW-HIGH or *")
    if len(item) > MAX_TOKEN_LENGTH:
        raise InvalidParameter(f"token set item {shown!r} is longer than "
                               f"{MAX_TOKEN_LENGTH} characters, the longest permission token")
    if _FORBIDDEN.search(item) or any(c.isspace() for c in item):
        raise InvalidParameter(f"token set item {shown!r} contains whitespace or a control "
                               "character; items are separated by commas")
    if item == "*":
        return "all", None
    star = item.find("*")
    if star != -1:
        if star != len(item) - 1:
            raise InvalidParameter(f"token set item {shown!r}: '*' may only end an item "
                                   "(PREFIX*) or stand alone (*)")
        return "prefix", item[:-1]
    if "-" in item and _RANGE_LIKE.fullmatch(item):
        match = _RANGE.fullmatch(item)
        if match is None:
            raise InvalidParameter(f"token set item {shown!r} is not a range; write LOW-HIGH "
                                   "with both bounds, e.g. 6000-6999")
        lo, hi = int(match.group(1)), int(match.group(2))
        if lo > hi:
            raise InvalidParameter(f"token set range {shown!r} runs backwards; write "
                                   f"{match.group(2)}-{match.group(1)}")
        return "range", (lo, hi)
    return "exact", item


def parse_token_items(items: Iterable[str], *, spec: str | None = None) -> TokenSet:
    """Compile items already split (an entry's stored tokens); duplicates collapse."""
    listed = list(items)
    text = spec if spec is not None else ",".join(listed)
    if not listed:
        raise InvalidParameter("the token set is empty; give TOKEN, PREFIX*, LOW-HIGH or *, "
                               "comma-separated")
    if len(listed) > MAX_ITEMS:
        raise InvalidParameter(f"a token set has at most {MAX_ITEMS} items")
    seen: dict[str, None] = {}
    everything = False
    exact: set[str] = set()
    prefixes: list[str] = []
    ranges: list[tuple[int, int]] = []
    for raw in listed:
        if not isinstance(raw, str):
            raise InvalidParameter(f"token set item {raw!r} is not text")
        kind, value = _item(raw, text)
        if raw in seen:
            continue
        seen[raw] = None
        if kind == "all":
            everything = True
        elif kind == "prefix":
            assert isinstance(value, str)
            prefixes.append(value)
        elif kind == "range":
            assert isinstance(value, tuple)
            ranges.append(value)
        else:
            assert isinstance(value, str)
            exact.add(value)
    return TokenSet(tuple(seen), everything, frozenset(exact), tuple(prefixes), tuple(ranges))


def parse_token_set(spec: str) -> TokenSet:
    """Parse a comma list (`6747, 6000-6999,fx.*`); spaces around commas are allowed."""
    if not isinstance(spec, str):
        raise InvalidParameter("a token set is text, e.g. 6747,6000-6999,fx.*")
    if len(spec) > MAX_SPEC_LENGTH:
        raise InvalidParameter(f"a token set is at most {MAX_SPEC_LENGTH} characters")
    if not spec.strip():
        raise InvalidParameter("the token set is empty; give TOKEN, PREFIX*, LOW-HIGH or *, "
                               "comma-separated")
    return parse_token_items([part.strip(" \t") for part in spec.split(",")], spec=spec)
