"""The live (Python) and batch (Spark) backends give the same answer on a generated corpus."""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker import selectors
from broker.selectors import DEFAULT_MAX_NESTING, FIELDS_TYPE_DDL, Selector

from .generator import JmsGen, LdapGen, random_message
from .test_conformance import BETWEEN_CASES, MINUS_CASES, SHAPES, expected_at

#: Corpus size: selectors x messages >= 5,000 pairs, evaluated in one Spark job.
N_JMS, N_LDAP, N_MESSAGES = 260, 130, 12
SEED = 20020315

#: Hand-picked selectors for the rules most likely to differ between Python and Spark SQL.
FIXED = [
    ("JMS", "a LIKE '%a%a%a%a%a%a%b'"), ("JMS", "a LIKE '%a_a_a%b'"),
    ("JMS", "sym LIKE 'x_y'"), ("JMS", "sym LIKE '_'"), ("JMS", "sym LIKE 'x%'"),
    ("JMS", "price - price = 0"), ("JMS", "price * 0 = 0"), ("JMS", "price / 0 = 1"),
    ("JMS", "NOT (price / 0 = 1)"), ("JMS", "price > 1e308"), ("JMS", "-price < 0"),
    ("JMS", "a = b"), ("JMS", "a < b"), ("JMS", "a IS NULL OR b IS NOT NULL"),
    ("JMS", "flag = TRUE"), ("JMS", "flag"), ("JMS", "NOT flag"), ("JMS", "7 / 2 = 3.5"),
    ("RFC-2254", "(a=*A*A*A*A*b)"), ("RFC-2254", "(sym~=X Y)"),
    ("RFC-2254", r"(sym=\f0\9f\98\80*)"),
    ("RFC-2254", "(price>=1e300)"), ("RFC-2254", "(b<=ABD)"), ("RFC-2254", "(!(missing=*))"),
    # The conformance-corpus cases (test_conformance.py states their answers).
    ("JMS", "-A = 0 - A"), ("JMS", "-A=0-A"), ("JMS", "1e3-A = 958"), ("JMS", "0--A = A"),
    ("JMS", "x NOT BETWEEN lo AND hi"), ("JMS", "x BETWEEN lo AND hi"),
    ("JMS", "10 NOT BETWEEN lo + 1 AND 5"), ("JMS", "NOT (x BETWEEN lo AND hi)"),
    ("JMS", "price NOT BETWEEN missing AND a"), ("JMS", "a BETWEEN missing AND missing"),
    ("JMS", "NOT (" * 50 + "a = 5" + ")" * 50),
    ("JMS", "NOT " * (DEFAULT_MAX_NESTING - 1) + "(a = 5)"),
    ("JMS", "(" * DEFAULT_MAX_NESTING + "a = 5" + ")" * DEFAULT_MAX_NESTING),
    ("JMS", "-" * DEFAULT_MAX_NESTING + "a = 5"),
    ("JMS", "a" + " * 1" * DEFAULT_MAX_NESTING + " = 5"),
    ("JMS", "a = 5 AND (" * (DEFAULT_MAX_NESTING - 1) + "b = 'abc'" + ")" * (
        DEFAULT_MAX_NESTING - 1)),
    ("RFC-2254", "(!" * (DEFAULT_MAX_NESTING - 1) + "(a=5)" + ")" * (DEFAULT_MAX_NESTING - 1)),
    ("RFC-2254", "(|" * (DEFAULT_MAX_NESTING - 1) + "(b=abc)" + ")" * (
        DEFAULT_MAX_NESTING - 1)),
]


def _corpus() -> tuple[list[Selector], list[dict[str, list[str]]]]:
    rng = random.Random(SEED)
    jms, ldap = JmsGen(rng), LdapGen(rng)
    sels = [selectors.compile("JMS", jms.cond()) for _ in range(N_JMS)]
    sels += [selectors.compile("RFC-2254", ldap.selector()) for _ in range(N_LDAP)]
    sels += [selectors.compile(klass, text) for klass, text in FIXED]
    messages = [selectors.extract_fields(random_message(rng)) for _ in range(N_MESSAGES)]
    # A few fixed messages with the edge cases every selector should meet at least once.
    messages += [
        {},
        {"a": ["5"], "b": ["abc", "5"], "price": ["1e400", "-1e400"]},
        {"a": ["a" * 9_999 + "b", "A" * 10_000], "b": ["abc"], "price": ["1e400"],
         "sym": ["x\ny", "\U0001f600", "X \t\n y"], "flag": ["1", "True"]},
        {"A": ["42.0"], "x": ["10"], "hi": ["5"], "price": ["7"], "a": ["5"]},
        {"A": ["x"], "x": ["3", "9"], "lo": ["abc"], "hi": ["5"], "a": ["1"]},
    ]
    return sels, messages


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_python_and_spark_agree_on_generated_corpus(spark: Any) -> None:
    """Every (selector, message) pair of a >= 5,000-pair corpus gets one answer from both."""
    sels, messages = _corpus()
    assert len(sels) * len(messages) >= 5000
    df = spark.createDataFrame(
        list(enumerate(messages)), schema=f"msg_id int, fields {FIELDS_TYPE_DDL}")
    columns = [sel.to_spark("fields").alias(f"s{i}") for i, sel in enumerate(sels)]
    rows = df.select("msg_id", *columns).collect()  # one pass over all pairs
    assert len(rows) == len(messages)
    mismatches = []
    for row in rows:
        fields = messages[row["msg_id"]]
        for i, sel in enumerate(sels):
            expected = sel.evaluate(fields)
            if row[f"s{i}"] != expected:
                mismatches.append((sel.selector_class.value, sel.text, fields,
                                   expected, row[f"s{i}"]))
    assert not mismatches, "\n".join(map(repr, mismatches[:10]))


@pytest.mark.spark
def test_spark_filter_keeps_only_true_rows(spark: Any) -> None:
    """Filtering on the Spark column drops FALSE and UNKNOWN rows, as the live path does."""
    sel = selectors.compile("JMS", "price > 5")
    rows = [(0, {"price": ["10"]}), (1, {"price": ["1"]}), (2, {}), (3, {"price": ["x"]})]
    df = spark.createDataFrame(rows, schema=f"id int, fields {FIELDS_TYPE_DDL}")
    assert [r.id for r in df.filter(sel.to_spark()).collect()] == [0]


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_spark_gives_the_conformance_answers(spark: Any) -> None:
    """Spark SQL gives the JMS 1.1 answers themselves (not just Python's) on the corpus cases:
    `-A = 0-A`, BETWEEN with a missing bound, and selectors nested to the bound in every shape
    (Spark's own SQL parser must take them: see DEFAULT_MAX_NESTING)."""
    n = DEFAULT_MAX_NESTING
    cases = [(text, {"A": ["42.0"]}, True) for text in MINUS_CASES] + BETWEEN_CASES
    cases += [(SHAPES[shape](n), {"a": ["1"]}, expected_at(shape, n)) for shape in sorted(SHAPES)]
    # NOT over AND: two levels per repetition, one more for the innermost AND
    r = (n - 1) // 2
    cases.append(("NOT (a = 2 AND " * r + "a = 1" + ")" * r, {"a": ["1"]}, True))
    ldap = [("(!" * (n - 1) + "(a=1)" + ")" * (n - 1), {"a": ["1"]}, (n - 1) % 2 == 0),
            ("(&" * (n - 1) + "(a=1)" + ")" * (n - 1), {"a": ["1"]}, True),
            ("(|(a=2)(&(a=1)" * r + "(a=1)" + "))" * r, {"a": ["1"]}, True)]
    sels = [selectors.compile("JMS", text) for text, _, _ in cases]
    sels += [selectors.compile("RFC-2254", text) for text, _, _ in ldap]
    cases += ldap
    df = spark.createDataFrame([(i, fields) for i, (_, fields, _) in enumerate(cases)],
                               schema=f"case int, fields {FIELDS_TYPE_DDL}")
    columns = [sel.to_spark("fields").alias(f"s{i}") for i, sel in enumerate(sels)]
    rows = df.select("case", *columns).collect()
    got = {row["case"]: row[f"s{row['case']}"] for row in rows}
    wrong = [(text[:60], fields, expected, got[i], sels[i].evaluate(fields))
             for i, (text, fields, expected) in enumerate(cases) if got[i] is not expected]
    assert not wrong, "\n".join(map(repr, wrong))
