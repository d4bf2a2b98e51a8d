"""Class "JMS": grammar, literals, precedence, typing, three-valued logic, errors."""

from __future__ import annotations

import pytest

from broker import selectors
from common.errors import ReplyCode, SelectorError, UnsupportedSelectorClass

Fields = dict[str, list[str]]

QUOTE: Fields = {
    "symbol": ["XMPL"], "net-change-pct": ["10.0"], "last-trade": ["11.0"],
    "issue-name": ["Example, Inc."], "flag": ["TRUE"], "note": ["it's"],
}


def ev(text: str, fields: Fields | None = None) -> bool | None:
    return selectors.compile("JMS", text).evaluate(QUOTE if fields is None else fields)


# --- literals and operators ---------------------------------------------------------------

LITERALS = [
    ("last-trade = 11", True), ("last-trade = 11.0", True), ("last-trade = 1.1E1", True),
    ("last-trade = 110e-1", True), ("last-trade = +11", True), ("last-trade > -957", True),
    ("last-trade < 7E3", True), ("last-trade > -57.9E2", True), ("last-trade > 7.", True),
    ("last-trade > .5", True), ("note = 'it''s'", True), ("symbol = 'xmpl'", False),
    ("flag = TRUE", True), ("flag = true", True), ("flag <> FALSE", True), ("TRUE", True),
    ("FALSE", False), ("NOT FALSE", True),
]


@pytest.mark.parametrize(("text", "expected"), LITERALS)
def test_literal_forms(text: str, expected: bool) -> None:
    """Exact, approximate, signed, quoted and boolean literals read as JMS 1.1 says."""
    assert ev(text) is expected


OPERATORS = [
    ("last-trade = 11", True), ("last-trade <> 11", False), ("last-trade < 12", True),
    ("last-trade <= 11", True), ("last-trade > 11", False), ("last-trade >= 11", True),
    ("last-trade + 1 = 12", True), ("last-trade - 1 = 10", True), ("last-trade * 2 = 22", True),
    ("last-trade / 2 = 5.5", True), ("-last-trade = -11", True), ("7 / 2 = 3.5", True),
    ("last-trade BETWEEN 10 AND 12", True), ("last-trade NOT BETWEEN 10 AND 12", False),
    ("last-trade BETWEEN 12 AND 10", False), ("symbol IN ('A', 'XMPL')", True),
    ("symbol NOT IN ('A', 'XMPL')", False), ("issue-name LIKE 'Ex%'", True),
    ("issue-name LIKE 'Ex_mple, Inc.'", True), ("issue-name NOT LIKE '%Inc_'", False),
    ("issue-name LIKE 'ex%'", False), ("absent IS NULL", True), ("symbol IS NOT NULL", True),
    ("symbol IS NULL", False), ("flag", True), ("symbol = 'XMPL'", True),
]


@pytest.mark.parametrize(("text", "expected"), OPERATORS)
def test_every_operator(text: str, expected: bool) -> None:
    """Each comparison, arithmetic, BETWEEN, IN, LIKE and IS NULL operator evaluates right."""
    assert ev(text) is expected


PRECEDENCE = [
    ("1 + 2 * 3 = 7", True), ("(1 + 2) * 3 = 9", True), ("- 2 * 3 = -6", True),
    ("10 - 4 - 3 = 3", True), ("8 / 4 / 2 = 1", True),
    ("TRUE OR TRUE AND FALSE", True), ("(TRUE OR TRUE) AND FALSE", False),
    ("NOT TRUE AND FALSE", False), ("NOT (TRUE AND FALSE)", True),
    ("NOT 1 = 2", True), ("1 + 1 BETWEEN 1 + 0 AND 3 - 1", True),
    ("FALSE AND FALSE OR TRUE", True),
]


@pytest.mark.parametrize(("text", "expected"), PRECEDENCE)
def test_precedence_levels(text: str, expected: bool) -> None:
    """Unary > * / > + - > comparison > NOT > AND > OR, left-associative."""
    assert ev(text, {}) is expected


def test_keywords_are_case_insensitive_and_identifiers_are_not() -> None:
    """`and`, `Between`, `is not null` are keywords; `Symbol` is not `symbol`."""
    assert ev("symbol is not null and last-trade between 10 and 12") is True
    assert ev("Symbol IS NULL") is True


def test_identifiers_follow_ncname_rules() -> None:
    """`net-change-pct` is one identifier; `a - b` subtracts; dots and underscores allowed."""
    fields = {"a-b": ["1"], "a": ["5"], "b": ["2"], "x.y_z": ["q"]}
    assert ev("a-b = 1", fields) is True
    assert ev("a - b = 3", fields) is True
    assert ev("x.y_z = 'q'", fields) is True


# --- escapes in LIKE ----------------------------------------------------------------------

LIKES = [
    ("'100%'", "'100\\%' ESCAPE '\\'", True), ("'100x'", "'100\\%' ESCAPE '\\'", False),
    ("'a_b'", "'a!_b' ESCAPE '!'", True), ("'axb'", "'a!_b' ESCAPE '!'", False),
    ("'a!b'", "'a!!b' ESCAPE '!'", True), ("'line\nbreak'", "'line_break'", True),
    ("'line\nbreak'", "'line%'", True), ("'\U0001f600'", "'_'", True),
    ("'é'", "'_'", True), ("''", "'%'", True), ("''", "'_'", False), ("'abc'", "'%%%'", True),
    ("'aXbXc'", "'a%b%c'", True), ("'abcab'", "'%ab'", True), ("'ab'", "'a%b%b'", False),
    ("'it''s'", "'it''_'", True),
]


@pytest.mark.parametrize(("value", "pattern", "expected"), LIKES)
def test_like_wildcards_and_escapes(value: str, pattern: str, expected: bool) -> None:
    """`_` is one code point, `%` any run (newlines too); ESCAPE makes `_`/`%` literal."""
    text = value[1:-1].replace("''", "'")
    assert ev(f"v LIKE {pattern}", {"v": [text]}) is expected


# --- typing --------------------------------------------------------------------------------

TYPING = [
    ({"v": ["5"]}, "v = 5.0", True), ({"v": ["-5.25"]}, "v < 0", True),
    ({"v": ["1e3"]}, "v = 1000", True), ({"v": ["1_000"]}, "v = 1000", None),
    ({"v": ["NaN"]}, "v <> 1", None), ({"v": ["Infinity"]}, "v > 1", None),
    ({"v": ["12abc"]}, "v > 1", None), ({"v": [""]}, "v = 0", None),
    ({"v": [" 5"]}, "v = 5", None), ({"v": ["5"]}, "v = '5'", True),
    ({"v": ["5.0"]}, "v = '5'", False), ({"v": ["True"]}, "v = TRUE", True),
    ({"v": ["yes"]}, "v = TRUE", False), ({"v": ["yes"]}, "v <> TRUE", True),
    ({"a": ["5"], "b": ["5.0"]}, "a = b", True), ({"a": ["x"], "b": ["x"]}, "a = b", True),
    ({"a": ["x"], "b": ["y"]}, "a < b", None), ({"a": ["1"], "b": ["2"]}, "a < b", True),
    ({"v": ["abc"]}, "v + 1 > 0", None), ({"v": ["1"]}, "v / 0 = 1", None),
    ({"v": ["1"]}, "NOT (v / 0 = 1)", None), ({"v": ["1e400"]}, "v - v = 0", None),
    ({"v": ["yes"]}, "v", None), ({"v": ["false"]}, "NOT v", True),
]


@pytest.mark.parametrize(("fields", "text", "expected"), TYPING)
def test_values_take_their_type_from_context(fields: Fields, text: str, expected: object) -> None:
    """Numeric, string and boolean contexts, numbers per selectors.md's regex, UNKNOWN results."""
    assert ev(text, fields) is expected


# --- instances and three-valued logic ------------------------------------------------------


def test_any_instance_rule_per_predicate() -> None:
    """`x <> 'a'` over instances a, b is TRUE while `NOT (x = 'a')` is FALSE."""
    fields = {"x": ["a", "b"]}
    assert ev("x <> 'a'", fields) is True
    assert ev("NOT (x = 'a')", fields) is False
    assert ev("x BETWEEN 1 AND 5", {"x": ["0", "10"]}) is False
    assert ev("x > 5", {"x": ["oops", "1"]}) is None
    assert ev("x > 5", {"x": ["oops", "9"]}) is True


def test_missing_identifier_is_unknown_except_is_null() -> None:
    """A missing identifier makes predicates UNKNOWN; IS NULL is TRUE; nothing matches."""
    sel = selectors.compile("JMS", "absent = 'x'")
    assert sel.evaluate({}) is None
    assert sel.matches_fields({}) is False
    assert ev("absent IS NULL", {}) is True
    assert ev("NOT absent = 'x'", {}) is None


TRUTH = [("TRUE", True), ("FALSE", False), ("u", None)]


@pytest.mark.parametrize(("a", "va"), TRUTH)
@pytest.mark.parametrize(("b", "vb"), TRUTH)
def test_jms_truth_tables(a: str, va: bool | None, b: str, vb: bool | None) -> None:
    """AND, OR and NOT follow the JMS (SQL) three-valued truth tables."""
    fields = {"u": ["neither"]}
    want_and = False if False in (va, vb) else (None if None in (va, vb) else True)
    want_or = True if True in (va, vb) else (None if None in (va, vb) else False)
    assert ev(f"{a} AND {b}", fields) is want_and
    assert ev(f"{a} OR {b}", fields) is want_or
    assert ev(f"NOT {a}", fields) is (None if va is None else not va)


def test_empty_selector_matches_everything() -> None:
    """An empty or blank selector selects every message."""
    assert selectors.compile("JMS", "").matches_fields({}) is True
    assert selectors.compile("JMS", "  \n ").matches_fields({}) is True


# --- errors --------------------------------------------------------------------------------

ERRORS = [
    ("(a = 1", 0, "never closed"), ("a = 1)", 5, "unexpected ')'"), ("a = ", 4, "operand"),
    ("a AND", 5, "operand"), ("= 1", 0, "operand"), ("a = 'x", 4, "unterminated"),
    ("a IN (1, 2)", 6, "string literals only"), ("a LIKE b", 7, "string literal pattern"),
    ("a LIKE 'x' ESCAPE 'ab'", 18, "exactly one character"),
    ("a LIKE 'x' ESCAPE ''", 18, "exactly one character"), ("NULL = 1", 0, "IS [NOT] NULL"),
    ("a = NULL", 4, "IS [NOT] NULL"), ("AND = 1", 0, "keyword AND"), ("a = between", 4, "keyword"),
    ("'a' < 'b'", 4, "strings compare only"), ("a < 'b'", 2, "strings compare only"),
    ("a > TRUE", 2, "booleans compare only"), ("a IN ()", 6, "empty IN list"),
    ("a IN ('x',)", 10, "trailing comma"), ("5 = 'a'", 2, "cannot compare"),
    ("TRUE = 1", 5, "cannot compare"), ("'a' + 1 = 2", 0, "needs numbers"), ("5", 0, "condition"),
    ("'x'", 0, "condition"), ("a = 1 = 2", 6, "do not chain"), ("a != 1", 2, "<>"),
    ("12abc = 1", 0, "numeric literal"), ("a # 1", 2, "unexpected character"),
    ("a LIKE 'x!' ESCAPE '!'", 9, "escape character"), ("(a = 1) + 1 = 2", 3, "needs numbers"),
    ("a NOT = 1", 2, "NOT here"), ("x IS 5", 5, "expected NULL"),
    ("a BETWEEN 1 OR 2", 12, "expected AND"), ("(a = 1) = TRUE", 8, "condition cannot"),
]


@pytest.mark.parametrize(("text", "position", "reason"), ERRORS)
def test_compile_errors_carry_position_and_reason(text: str, position: int, reason: str) -> None:
    """Every incorrect selector raises SelectorError (567) pointing at the problem."""
    with pytest.raises(SelectorError) as info:
        selectors.compile("JMS", text)
    assert info.value.code is ReplyCode.INCORRECT_SELECTOR
    assert reason in info.value.reason
    assert info.value.position == position


def test_unknown_class_is_566() -> None:
    """A selector class other than JMS and RFC-2254 raises UnsupportedSelectorClass (566)."""
    with pytest.raises(UnsupportedSelectorClass) as info:
        selectors.compile("XPath", "/a")
    assert info.value.code is ReplyCode.UNSUPPORTED_SELECTOR_CLASS


def test_fields_lists_identifiers_read() -> None:
    """`Selector.fields` is every identifier the selector reads, IS NULL included."""
    sel = selectors.compile("JMS", "a = 1 OR (b LIKE 'x%' AND c IS NULL) OR d + e > 2 OR TRUE")
    assert sel.fields == {"a", "b", "c", "d", "e"}
