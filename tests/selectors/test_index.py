"""SubscriptionIndex returns exactly the subscriptions whose selectors match."""

from __future__ import annotations

import random

from broker import selectors
from broker.selectors import SubscriptionIndex

from .generator import JmsGen, LdapGen, random_message


def _parenthesized(ldap: str) -> str:
    return ldap if ldap.startswith("(") else f"({ldap})"


def test_index_agrees_with_evaluating_every_selector() -> None:
    """On a generated corpus the index matches exactly what full evaluation matches."""
    rng = random.Random(7)
    jms, ldap = JmsGen(rng), LdapGen(rng)
    index: SubscriptionIndex[tuple[str, int]] = SubscriptionIndex()
    sels = {}
    for i in range(600):
        klass, text = ("JMS", jms.cond()) if i % 3 else ("RFC-2254", ldap.selector())
        if i % 4 == 0:  # make keyed conjuncts common, as in real subscriptions
            text = (f"sym = '{rng.choice(['abc', 'ABC', '5'])}' AND ({text})" if klass == "JMS"
                    else f"(&(sym={rng.choice(['abc', '5'])}){_parenthesized(text)})")
        if i % 7 == 0 and klass == "JMS":
            text = f"price = {rng.choice(['5', '10', '2'])} AND ({text})"
        sels[(f"sub{i % 5}", i)] = selectors.compile(klass, text)
        index.add((f"sub{i % 5}", i), sels[(f"sub{i % 5}", i)])
    assert len(index) == 600
    for _ in range(60):
        fields = selectors.extract_fields(random_message(rng))
        want = {key for key, sel in sels.items() if sel.matches_fields(fields)}
        assert index.match(fields) == want


def test_add_replace_and_remove() -> None:
    """Adding under an existing key replaces; removing forgets; empty selectors match all."""
    index: SubscriptionIndex[str] = SubscriptionIndex()
    index.add("s", selectors.compile("JMS", "symbol IN ('A', 'B')"))
    index.add("all", selectors.compile("JMS", ""))
    assert index.match({"symbol": ["B"]}) == {"s", "all"}
    index.add("s", selectors.compile("JMS", "symbol = 'C'"))
    assert index.match({"symbol": ["B"]}) == {"all"}
    assert index.match({"symbol": ["C"]}) == {"s", "all"}
    index.remove("s")
    assert "s" not in index and index.match({"symbol": ["C"]}) == {"all"}


def test_keyed_lookup_handles_numbers_case_and_repeats() -> None:
    """Numeric keys find '5.0' for `x = 5`; LDAP keys fold case; repeats match once."""
    index: SubscriptionIndex[int] = SubscriptionIndex()
    index.add(1, selectors.compile("JMS", "x = 5"))
    index.add(2, selectors.compile("RFC-2254", "(sym=xmpl)"))
    index.add(3, selectors.compile("JMS", "sym IN ('A', 'B') AND x > 1"))
    assert index.match({"x": ["5.0"], "sym": ["XMPL"]}) == {1, 2}
    assert index.match({"x": ["2"], "sym": ["A", "B"]}) == {3}
