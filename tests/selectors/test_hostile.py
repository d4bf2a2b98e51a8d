"""Selectors built to cost the broker: each is refused with 567 by a named limit
(`_limits.py`), or, where its shape is harmless, accepted and evaluated in linear time. The
timeouts are bounds that turn a hang into a failure, not measurements."""

from __future__ import annotations

import tracemalloc

import pytest

from broker import selectors
from broker.selectors import DEFAULT_MAX_ATOMS, DEFAULT_MAX_NESTING, DEFAULT_MAX_SELECTOR_LENGTH
from common.errors import SelectorError

#: One selector's compile may take this much memory at most, whatever its shape (a bound).
MAX_COMPILE_BYTES = 64 * 1024 * 1024

HOSTILE = {
    # an IN list past the length limit
    "huge IN": ("JMS", "x IN (" + ", ".join(f"'{i}'" for i in range(20_000)) + ")"),
    # 12,000 branches in 60 KB: each re-reads x per message (6.4 s per 1 MB x, unbounded)
    "LDAP OR of 12,000": ("RFC-2254", "(|" + "(x=1)" * 12_000 + ")"),
    "JMS OR of 3,000 LIKEs": ("JMS", " OR ".join(f"x LIKE '%{i}%'" for i in range(3_000))),
    "LDAP substrings": ("RFC-2254", "(|" + "".join(f"(x=*{i}*)" for i in range(1_000)) + ")"),
    "nested NOT": ("JMS", "NOT (" * 200 + "x = 1" + ")" * 200),
    "nested parentheses": ("JMS", "(" * 5_000 + "x = 1" + ")" * 5_000),
    "nested LDAP": ("RFC-2254", "(&" * 200 + "(x=1)" + ")" * 200),
    "arithmetic chain": ("JMS", "-" * 1_000 + "x = 1"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_selector_is_567_in_bounded_memory(name: str) -> None:
    """Each shape is refused by a limit (length, nesting, predicates), never a hang or a
    RecursionError, and compiling it costs bounded memory."""
    klass, text = HOSTILE[name]
    tracemalloc.start()
    try:
        with pytest.raises(SelectorError, match=r"limit|deeper") as caught:
            selectors.compile(klass, text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.code == 567
    assert peak < MAX_COMPILE_BYTES, f"{name}: compiling took {peak} bytes"


@pytest.mark.parametrize("klass, make", [
    ("JMS", lambda n: " OR ".join(f"x = '{i}'" for i in range(n))),
    ("RFC-2254", lambda n: "(|" + "".join(f"(x={i})" for i in range(n)) + ")"),
])
def test_the_predicate_limit_is_exact(klass: str, make: object) -> None:
    """DEFAULT_MAX_ATOMS predicates compile and match; one more is 567, naming the limit."""
    assert callable(make)
    at_limit = selectors.compile(klass, make(DEFAULT_MAX_ATOMS))
    assert at_limit.matches_fields({"x": [str(DEFAULT_MAX_ATOMS - 1)]})
    with pytest.raises(SelectorError, match=f"the limit is {DEFAULT_MAX_ATOMS}"):
        selectors.compile(klass, make(DEFAULT_MAX_ATOMS + 1))


def test_an_in_list_is_one_predicate_however_long() -> None:
    """A long IN list is cheap (one set lookup per instance): only the length limit bounds it."""
    items = ", ".join(f"'{i}'" for i in range(8_000))
    assert len(items) < DEFAULT_MAX_SELECTOR_LENGTH
    sel = selectors.compile("JMS", f"x IN ({items}) AND y IN ('1', '2')")
    assert sel.matches_fields({"x": ["7999"], "y": ["1"]})


@pytest.mark.timeout(30)
@pytest.mark.parametrize("klass, text", [
    ("JMS", "x LIKE '" + "%a" * 5_000 + "%b'"),
    ("RFC-2254", "(x=" + "*a" * 5_000 + "*b)"),
])
def test_a_pattern_of_many_wildcards_is_linear_not_refused(klass: str, text: str) -> None:
    """LIKE with 5,000 `%` (an LDAP filter with 5,000 `*`) matches leftmost-greedy, segment
    by segment, with no backtracking: accepted, and right, against a 100,000-character value
    that almost matches (the backtracking engines' worst case) and one that does."""
    sel = selectors.compile(klass, text)
    assert sel.evaluate({"x": ["a" * 100_000]}) is False
    assert sel.evaluate({"x": ["a" * 100_000 + "b"]}) is True


def test_the_limits_refuse_at_their_figures() -> None:
    """The nesting limit is DEFAULT_MAX_NESTING: at it compiles, one deeper is 567."""
    ok = "NOT (" * (DEFAULT_MAX_NESTING // 2 - 1) + "x = 1" + ")" * (DEFAULT_MAX_NESTING // 2 - 1)
    selectors.compile("JMS", ok)
    with pytest.raises(SelectorError, match="deeper"):
        selectors.compile("JMS", "NOT (" * DEFAULT_MAX_NESTING + "x = 1"
                          + ")" * DEFAULT_MAX_NESTING)
