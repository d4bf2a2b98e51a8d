"""Pathological selectors and messages finish quickly or are refused by a documented limit."""

from __future__ import annotations

import pytest

from broker import selectors
from broker.selectors import DEFAULT_MAX_ATOMS, DEFAULT_MAX_NESTING, DEFAULT_MAX_SELECTOR_LENGTH
from common.errors import SelectorError


@pytest.mark.timeout(10)
@pytest.mark.parametrize("value", ["a" * 10_000, "ab" * 5_000, "a" * 9_999 + "b"])
def test_like_with_many_percent_signs_is_linear(value: str) -> None:
    """'%a%a%a%a%a%a%b' against 10,000 characters runs without backtracking blow-up."""
    sel = selectors.compile("JMS", "v LIKE '%a%a%a%a%a%a%b' OR v LIKE '%a_a_a_a_a_a_b'")
    expected = value.endswith("b")
    for _ in range(100):  # 100 evaluations: seconds if quadratic, milliseconds if linear
        assert sel.matches_fields({"v": [value]}) is expected


@pytest.mark.timeout(10)
def test_ldap_substring_with_many_stars_is_linear() -> None:
    """The LDAP substring matcher is the same linear matcher."""
    sel = selectors.compile("RFC-2254", "(v=*a*a*a*a*a*a*b)")
    assert sel.matches_fields({"v": ["A" * 10_000]}) is False


def test_nesting_beyond_the_limit_is_567() -> None:
    """A selector one level deeper than the bound is refused with 567; one within the limit
    compiles and runs (tests/selectors/test_conformance.py has the property version)."""
    over = DEFAULT_MAX_NESTING + 1
    deep = "(" * over + "a = 1" + ")" * over
    with pytest.raises(SelectorError, match="nested deeper"):
        selectors.compile("JMS", deep)
    with pytest.raises(SelectorError, match="nested deeper"):
        selectors.compile("JMS", "NOT " * over + "a = 1")
    with pytest.raises(SelectorError, match="nested deeper"):
        selectors.compile("JMS", "a" + " + 1" * over + " > 0")
    with pytest.raises(SelectorError, match="nested deeper"):
        selectors.compile("RFC-2254", "(!" * over + "(a=1)" + ")" * over)
    ok = DEFAULT_MAX_NESTING - 1
    assert selectors.compile("JMS", "(" * ok + "a = 1" + ")" * ok).matches_fields({"a": ["1"]})
    assert selectors.compile("RFC-2254", "(!" * ok + "(a=1)" + ")" * ok).matches_fields({})


@pytest.mark.timeout(20)
def test_selector_of_64_kib_compiles_and_longer_is_567() -> None:
    """64 KiB of selector text compiles and evaluates; one character more is refused."""
    terms = [f"sym = 'S{i:05d}'" for i in range(DEFAULT_MAX_ATOMS)]
    text = " OR ".join(terms)
    text += " " * (DEFAULT_MAX_SELECTOR_LENGTH - len(text))
    sel = selectors.compile("JMS", text)
    assert sel.matches_fields({"sym": [f"S{DEFAULT_MAX_ATOMS - 1:05d}"]}) is True
    assert sel.matches_fields({"sym": ["nope"]}) is False
    items = ", ".join(f"'S{i:05d}'" for i in range(7000))[: DEFAULT_MAX_SELECTOR_LENGTH - 20]
    items = items[: items.rfind(",")]
    assert selectors.compile("JMS", f"sym IN ({items})").matches_fields({"sym": ["S00001"]})
    with pytest.raises(SelectorError, match="limit") as info:
        selectors.compile("JMS", text + " ")
    assert info.value.position == DEFAULT_MAX_SELECTOR_LENGTH


@pytest.mark.timeout(10)
def test_cross_product_of_instances_is_bounded() -> None:
    """`a = b` over 1,000 x 1,000 instances is UNKNOWN by DEFAULT_MAX_BINDINGS, not a stall."""
    fields = {"a": [str(i) for i in range(1000)], "b": [str(i + 5000) for i in range(1000)]}
    sel = selectors.compile("JMS", "a = b")
    assert sel.evaluate(fields) is None
    assert sel.evaluate({"a": ["1", "2"], "b": ["3", "2"]}) is True
