"""The index's numeric-threshold filing returns exactly what evaluating every selector does."""

from __future__ import annotations

import random

from broker import selectors
from broker.selectors import SubscriptionIndex

#: Thresholds, including ties with message values, signed zeros and infinities (1e400).
_CONSTS = ("-1", "0", "-0", "2", "2.5", "5", "1e400", "-1e400", "1e2")
#: Instance texts: numbers (ties, +/-inf), and texts that are not numbers under selectors.md.
_VALUES = ("-1", "0", "-0", "2", "2.5", "3", "5", "5.0", "7", "100", "1e400", "-1e400",
           "NaN", "Infinity", "abc", "", "1_000", " 5", "A", "B")


def _conjunct(rng: random.Random) -> str:
    f, c = rng.choice(("p", "p", "q")), rng.choice(_CONSTS)
    lo, hi = sorted((rng.choice(_CONSTS), rng.choice(_CONSTS)), key=float)
    return rng.choice((
        f"{f} > {c}", f"{f} >= {c}", f"{f} < {c}", f"{f} <= {c}", f"{c} < {f}", f"{c} >= {f}",
        f"{f} BETWEEN {lo} AND {hi}", f"{f} BETWEEN {hi} AND {lo}",
        f"{f} NOT BETWEEN {lo} AND {hi}", f"{f} <> {c}", f"{f} = {c}", f"{f} IS NULL",
        f"{f} > 1e400 - 1e400", f"{f} > q", f"-{f} < {c}",
        "sym = 'A'", "sym IN ('A', 'B')", f"({f} > {c} OR sym = 'B')", f"NOT {f} > {c}",
    ))


def _selector(rng: random.Random) -> selectors.Selector:
    if rng.random() < 0.15:
        op = rng.choice((">=", "<="))
        return selectors.compile(
            "RFC-2254", f"(&(sym={rng.choice('AB')})(p{op}{rng.choice(_CONSTS)}))")
    parts = [_conjunct(rng) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.5:
        parts.insert(0, f"sym = '{rng.choice('AB')}'")
    return selectors.compile("JMS", " AND ".join(parts))


def _message(rng: random.Random) -> dict[str, list[str]]:
    fields = {}
    for name in ("sym", "p", "q"):
        if rng.random() < 0.8:
            pool = ("A", "B", "5") if name == "sym" else _VALUES
            fields[name] = [rng.choice(pool) for _ in range(rng.choice((1, 1, 2, 3)))]
    return fields


def _expected(sels: dict[int, selectors.Selector], fields: dict[str, list[str]]) -> set[int]:
    return {key for key, sel in sels.items() if sel.evaluate(fields) is True}


def test_threshold_index_agrees_with_full_evaluation() -> None:
    """Random threshold-heavy subscriptions, then removals: match == {evaluate is TRUE}."""
    rng = random.Random(2254)
    for _ in range(8):
        index: SubscriptionIndex[int] = SubscriptionIndex()
        sels: dict[int, selectors.Selector] = {}
        for key in range(rng.randint(50, 400)):
            sels[key] = _selector(rng)
            index.add(key, sels[key])
        for round_ in range(2):
            for _ in range(150):
                fields = _message(rng)
                assert index.match(fields) == _expected(sels, fields), (fields, round_)
            for key in rng.sample(sorted(sels), len(sels) // 2):
                index.remove(key)
                del sels[key]
        for key in list(sels):
            index.remove(key)
        assert len(index) == 0 and index.match({"p": ["5"], "sym": ["A"]}) == set()


def test_any_instance_rule_across_threshold_conjuncts() -> None:
    """Each conjunct may be made TRUE by a different instance; BETWEEN needs one instance."""
    index: SubscriptionIndex[str] = SubscriptionIndex()
    index.add("split", selectors.compile("JMS", "p > 5 AND p < 3"))
    index.add("between", selectors.compile("JMS", "sym = 'A' AND p BETWEEN 3 AND 5"))
    index.add("keyed", selectors.compile("JMS", "sym = 'A' AND p > 5"))
    assert index.match({"p": ["6", "2"], "sym": ["A"]}) == {"split", "keyed"}
    assert index.match({"p": ["abc", "6"], "sym": ["A"]}) == {"keyed"}
    assert index.match({"p": ["abc", "4"], "sym": ["A"]}) == {"between"}
    assert index.match({"p": ["abc"], "sym": ["A"]}) == set()


def test_infinite_values_and_thresholds_compare_like_the_evaluator() -> None:
    """'1e400' is inf: above every finite threshold, equal to a `1e400` threshold."""
    index: SubscriptionIndex[str] = SubscriptionIndex()
    for key, text in {"gt-big": "p > 1e308", "gt-inf": "p > 1e400", "ge-inf": "p >= 1e400",
                      "lt-ninf": "p < -1e400", "le-ninf": "p <= -1e400"}.items():
        index.add(key, selectors.compile("JMS", text))
    assert index.match({"p": ["1e400"]}) == {"gt-big", "ge-inf"}
    assert index.match({"p": ["-1e400", "Infinity"]}) == {"le-ninf"}
    assert index.match({"p": ["NaN"]}) == set()
