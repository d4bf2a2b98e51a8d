"""Property tests: the compilers never fail in any way but SelectorError, and parse stably."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker import selectors
from common.errors import SelectorError

from .generator import VALUES, JmsGen, LdapGen

JMS_TOKENS = ["a", "b-c", "x.y", "AND", "or", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS",
              "NULL", "TRUE", "false", "(", ")", ",", "=", "<>", "<", "<=", ">", ">=", "+", "-",
              "*", "/", "'s'", "''", "'", "5", "-957", "7E3", ".5", "7.", "1e", "!", "%", " "]
LDAP_TOKENS = ["(", ")", "&", "|", "!", "a", "net-pct", "=", "~=", ">=", "<=", ">", "<", "*",
               "\\2a", "\\c4\\8d", "\\", "\\zz", "'", "x", "5.0", ":", ":=", " ", "\n"]

_FIELDS = st.dictionaries(st.sampled_from(["a", "b-c", "x.y", "net-pct"]),
                          st.lists(st.sampled_from(VALUES), min_size=1, max_size=3))


def _check_compiles_or_567(klass: str, text: str, fields: dict[str, list[str]]) -> None:
    try:
        sel = selectors.compile(klass, text)
    except SelectorError as exc:
        assert exc.position is not None and 0 <= exc.position <= len(text)
        return
    result = sel.evaluate(fields)  # evaluation never raises
    assert result in (True, False, None)
    if klass == "RFC-2254":
        assert result is not None


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(JMS_TOKENS), max_size=25).map(" ".join), _FIELDS)
def test_jms_token_soup_compiles_or_raises_selector_error(text: str, fields: dict) -> None:
    """Any arrangement of JMS tokens either compiles (and evaluates) or raises 567."""
    _check_compiles_or_567("JMS", text, fields)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(LDAP_TOKENS), max_size=25).map("".join), _FIELDS)
def test_ldap_token_soup_compiles_or_raises_selector_error(text: str, fields: dict) -> None:
    """Any arrangement of LDAP tokens either compiles (two-valued) or raises 567."""
    _check_compiles_or_567("RFC-2254", text, fields)


@settings(max_examples=300)
@given(st.text(max_size=60), st.sampled_from(["JMS", "RFC-2254"]))
@example(".\u00b2", "JMS")  # a non-ASCII digit after the point: isdigit() but not a number
def test_arbitrary_text_compiles_or_raises_selector_error(text: str, klass: str) -> None:
    """Arbitrary Unicode text never raises anything but SelectorError."""
    _check_compiles_or_567(klass, text, {})


def _reformat_jms(text: str, rng: random.Random) -> str:
    """The same JMS selector with keyword case and spacing changed, and extra parentheses."""
    out, in_string = [], False
    for word in text.split(" "):
        if word.count("'") % 2:
            in_string = not in_string
        keyword = not in_string and word.upper() in {
            "AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "IS", "NULL", "TRUE", "FALSE", "ESCAPE"}
        out.append("".join(c.upper() if rng.random() < 0.5 else c.lower() for c in word)
                   if keyword else word)
    joined = (" " if in_string else rng.choice([" ", "  ", "\n", "\t "])).join(out)
    return f"({joined})" if rng.random() < 0.5 else joined


@settings(max_examples=300)
@given(st.integers(0, 2**32))
def test_generated_selectors_compile_stably(seed: int) -> None:
    """Generated selectors compile, and reformatting one compiles to the same tree."""
    rng = random.Random(seed)
    jms = JmsGen(rng).cond()
    first = selectors.compile("JMS", jms).condition
    if "'" not in jms:  # reformatting must not touch string literals' spacing
        again = selectors.compile("JMS", _reformat_jms(jms, rng)).condition
        assert again == first
    ldap = LdapGen(rng).selector()
    tree = selectors.compile("RFC-2254", ldap).condition
    spaced = ldap.replace(")(", ") \n (")
    assert selectors.compile("RFC-2254", spaced).condition == tree
