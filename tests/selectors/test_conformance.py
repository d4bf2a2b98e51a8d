"""Where a JMS/LDAP conformance corpus caught the engine out: the JMS 1.1 (§3.8) answers.

Each case is stated on the live evaluator here; `test_differential.py` holds the Spark backend
to the same answers (its FIXED list repeats these selectors).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.cli.main import main
from broker import selectors
from broker.selectors import DEFAULT_MAX_NESTING
from common.errors import ReplyCode, SelectorError

# --- unary minus on an identifier inside arithmetic -----------------------------------------


#: Each TRUE with A = 42.0.
MINUS_CASES = [
    "-A = 0 - A", "-A = 0-A", "-A=0-A", "0-A = -A", "1-A = -41", "2-1 = 1", "1e3-A = 958",
    "1.5-A = -40.5", "0 - -A = A", "0--A = A", "A*-1 = -A", "A*2-A = A",
]


@pytest.mark.parametrize("text", MINUS_CASES)
def test_unary_minus_on_identifier_in_arithmetic(text: str) -> None:
    """`-A = 0-A` with A = 42.0 is TRUE: after a numeric literal, '-' is subtraction."""
    assert selectors.compile("JMS", text).evaluate({"A": ["42.0"]}) is True


@pytest.mark.parametrize("text", ["12abc = 1", "1.5.3 = 1", "7e3x > 1", "1_000 = 1"])
def test_number_glued_to_a_name_is_still_567(text: str) -> None:
    """Only '-' may follow a numeric literal directly; '12abc' or '1.5.3' stay errors."""
    with pytest.raises(SelectorError, match="invalid numeric literal"):
        selectors.compile("JMS", text)


def test_identifier_keeps_its_hyphen() -> None:
    """`A-1` is still one identifier (selectors.md: subtraction after an identifier needs
    whitespace), so the fix does not touch identifiers."""
    assert selectors.compile("JMS", "A-1 = 5").fields == frozenset({"A-1"})


# --- NOT BETWEEN with a missing bound -------------------------------------------------------


#: (selector, fields, the JMS 1.1 answer)
BETWEEN_CASES: list[tuple[str, dict[str, list[str]], bool | None]] = [
    # NOT (lo <= x AND x <= hi) = NOT (UNKNOWN AND FALSE) = NOT FALSE = TRUE
    ("x NOT BETWEEN lo AND hi", {"x": ["10"], "hi": ["5"]}, True),
    ("x BETWEEN lo AND hi", {"x": ["10"], "hi": ["5"]}, False),
    ("NOT (x BETWEEN lo AND hi)", {"x": ["10"], "hi": ["5"]}, True),
    # x below lo with hi missing: FALSE AND UNKNOWN
    ("x NOT BETWEEN lo AND hi", {"x": ["1"], "lo": ["5"]}, True),
    ("x BETWEEN lo AND hi", {"x": ["1"], "lo": ["5"]}, False),
    # x inside the one known bound: UNKNOWN either way
    ("x NOT BETWEEN lo AND hi", {"x": ["3"], "hi": ["5"]}, None),
    ("x BETWEEN lo AND hi", {"x": ["3"], "hi": ["5"]}, None),
    # x itself missing: both comparisons UNKNOWN
    ("x NOT BETWEEN lo AND hi", {"lo": ["1"], "hi": ["5"]}, None),
    ("x NOT BETWEEN 1 AND 5", {}, None),
    # a literal value with one identifier bound
    ("10 NOT BETWEEN lo AND 5", {}, True),
    ("10 NOT BETWEEN lo + 1 AND 5", {}, True),
    # any-instance: one instance of x above hi decides
    ("x NOT BETWEEN lo AND hi", {"x": ["3", "9"], "hi": ["5"]}, True),
    # a bound that is present but not a number is UNKNOWN, exactly like a missing one
    ("x NOT BETWEEN lo AND hi", {"x": ["10"], "lo": ["abc"], "hi": ["5"]}, True),
    # one identifier: linear in its instances, never cut off by DEFAULT_MAX_BINDINGS
    ("x NOT BETWEEN 1 AND 5", {"x": ["3"] * 15_000 + ["9"]}, True),
    # several: more bindings than DEFAULT_MAX_BINDINGS is UNKNOWN, as for any atom
    ("x NOT BETWEEN lo AND 5", {"x": ["3"] * 200 + ["9"], "lo": ["1"] * 100}, None),
]


@pytest.mark.parametrize(("text", "fields", "expected"), BETWEEN_CASES)
def test_between_with_a_missing_bound_follows_three_valued_logic(
        text: str, fields: dict[str, list[str]], expected: bool | None) -> None:
    """BETWEEN is `lo <= x AND x <= hi` in 3VL: a FALSE side decides even if a bound is missing."""
    assert selectors.compile("JMS", text).evaluate(fields) is expected


def test_index_finds_not_between_without_its_bound() -> None:
    """The subscription index does not file `x NOT BETWEEN lo AND hi` under `lo`."""
    index: selectors.SubscriptionIndex[str] = selectors.SubscriptionIndex()
    index.add("s", selectors.compile("JMS", "5 NOT BETWEEN lo AND hi"))
    index.add("t", selectors.compile("JMS", "x NOT BETWEEN lo AND hi"))
    index.add("u", selectors.compile("JMS", "5 NOT BETWEEN lo AND hi AND sym = 'X'"))
    assert index.match({"hi": ["1"]}) == {"s"}
    assert index.match({"x": ["9"], "hi": ["1"]}) == {"s", "t"}
    assert index.match({"sym": ["X"], "lo": ["7"]}) == {"s", "u"}


# --- deep nesting ---------------------------------------------------------------------------

#: Shapes of nesting n levels deep, each counting one level per repetition.
SHAPES = {
    "not-paren": lambda n: "NOT (" * (n // 2) + "a = 1" + ")" * (n // 2) + " OR FALSE",
    "paren": lambda n: "(" * n + "a = 1" + ")" * n,
    "not": lambda n: "NOT " * n + "a = 1",
    "minus": lambda n: "-" * n + "a = " + ("-1" if n % 2 else "1"),
    "minus-paren": lambda n: "-(" * (n // 2) + "a" + ")" * (n // 2) + (
        " = -1" if (n // 2) % 2 else " = 1"),
    "chain": lambda n: "a" + " + 0" * n + " = 1",
    "and-paren": lambda n: "a = 1 AND (" * n + "a = 1" + ")" * n,
    "right-chain": lambda n: "a - (" * n + "a" + ")" * n + (" = 1" if n % 2 == 0 else " = 0"),
    # OR over AND: one parenthesis and two levels per repetition, the outermost OR and AND
    # inside the first parenthesis, so 2r + 1 levels for r repetitions
    "or-and": lambda n: "(a = 2 OR a = 1 AND " * ((n - 1) // 2) + "a = 1" + ")" * ((n - 1) // 2),
}
#: Shapes with two levels per repetition: n is rounded up to even.
EVEN = ("minus-paren", "not-paren", "or-and")


def expected_at(shape: str, n: int) -> bool:
    """What each shape evaluates to over a = 1 when it compiles."""
    if shape == "not":
        return n % 2 == 0
    if shape == "not-paren":
        return (n // 2) % 2 == 0
    return True


def test_fifty_nested_not_parse_and_evaluate() -> None:
    """50 nested `NOT ( … )` parse and evaluate (JMS 1.1 puts no limit below that)."""
    text = "NOT (" * 50 + "a = 1" + ")" * 50
    assert selectors.compile("JMS", text).evaluate({"a": ["1"]}) is True
    assert selectors.compile("JMS", text).evaluate({"a": ["2"]}) is False
    assert DEFAULT_MAX_NESTING >= 100  # the 50 NOTs and their 50 parentheses


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_nesting_at_the_bound_compiles_and_beyond_is_567(shape: str) -> None:
    """Every shape compiles at DEFAULT_MAX_NESTING and is a 567 one level beyond it."""
    build = SHAPES[shape]
    n = DEFAULT_MAX_NESTING
    if shape in EVEN:
        n -= n % 2
    assert selectors.compile("JMS", build(n)).evaluate({"a": ["1"]}) is expected_at(shape, n)
    with pytest.raises(SelectorError, match="nested deeper") as info:
        selectors.compile("JMS", build(n + (2 if shape in EVEN else 1)))
    assert info.value.code is ReplyCode.INCORRECT_SELECTOR


def test_ldap_nesting_at_the_bound_compiles_and_beyond_is_567() -> None:
    """RFC-2254 `(!(!(…)))` and `(&(&(…)))`: the same bound, the same 567."""
    n = DEFAULT_MAX_NESTING - 1  # the innermost (a=1) is a level of its own
    assert selectors.compile("RFC-2254", "(!" * n + "(a=1)" + ")" * n).matches_fields(
        {"a": ["1"]}) is (n % 2 == 0)
    assert selectors.compile("RFC-2254", "(&" * n + "(a=1)" + ")" * n).matches_fields(
        {"a": ["1"]}) is True
    for text in ("(!" * (n + 1) + "(a=1)" + ")" * (n + 1),
                 "(|" * (n + 1) + "(a=1)" + ")" * (n + 1)):
        with pytest.raises(SelectorError, match="nested deeper"):
            selectors.compile("RFC-2254", text)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(SHAPES)), st.integers(1, 2000))
def test_jms_depth_parses_within_the_bound_and_raises_567_beyond(shape: str, n: int) -> None:
    """For any n in 1..2000: n <= bound compiles and evaluates, n > bound is 567, and never
    a RecursionError (the parser keeps an explicit stack; the tree it builds is bounded)."""
    if shape in EVEN:
        n += n % 2
    text = SHAPES[shape](n)
    if n <= DEFAULT_MAX_NESTING:
        sel = selectors.compile("JMS", text)
        assert sel.evaluate({"a": ["1"]}) is expected_at(shape, n)
        assert sel.to_spark_sql()  # the Spark compiler walks the same tree
    else:
        with pytest.raises(SelectorError, match="nested deeper") as info:
            selectors.compile("JMS", text)
        assert info.value.position is not None and 0 <= info.value.position < len(text)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from("!&|"), st.integers(1, 2000))
def test_ldap_depth_parses_within_the_bound_and_raises_567_beyond(op: str, n: int) -> None:
    """RFC-2254: n nested filters around (a=1) compile within the bound, 567 beyond."""
    text = f"({op}" * n + "(a=1)" + ")" * n
    if n + 1 <= DEFAULT_MAX_NESTING:
        sel = selectors.compile("RFC-2254", text)
        assert sel.evaluate({"a": ["1"]}) is (op != "!" or n % 2 == 0)
        assert sel.to_spark_sql()
    else:
        with pytest.raises(SelectorError, match="nested deeper"):
            selectors.compile("RFC-2254", text)


def test_cli_reports_too_deep_as_567(capsys: pytest.CaptureFixture[str]) -> None:
    """`apexps selector check` prints the 567 line with the position of the offending level."""
    text = "NOT (" * DEFAULT_MAX_NESTING + "a = 1" + ")" * DEFAULT_MAX_NESTING
    assert main(["selector", "check", "--class", "JMS", text, "-"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error 567: selector nested deeper than {DEFAULT_MAX_NESTING}")
    assert " at position " in err[0]


def _sql_nesting(sql: str) -> int:
    """The deepest parenthesis nesting of Spark SQL text, outside string literals."""
    depth = deepest = 0
    quoted = escaped = False
    for ch in sql:
        if quoted:
            quoted = escaped or ch != "'"
            escaped = not escaped and ch == "\\"
        elif ch == "'":
            quoted = True
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


@pytest.mark.parametrize("shape", ["and-paren", "chain", "not", "not-paren", "minus"])
def test_spark_sql_of_flattenable_shapes_stays_shallow(shape: str) -> None:
    """Nested ANDs, left-deep arithmetic, NOT NOT and - - reach Spark's JVM-stack-bound SQL
    parser as a dozen parentheses or so, not one per level (an atom alone is 3)."""
    n = DEFAULT_MAX_NESTING - DEFAULT_MAX_NESTING % 2
    assert _sql_nesting(selectors.compile("JMS", SHAPES[shape](n)).to_spark_sql()) <= 24
