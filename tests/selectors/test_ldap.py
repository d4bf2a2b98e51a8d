"""Class "RFC-2254": RFC 4515 filters, the project's extensions, matching rules, errors."""

from __future__ import annotations

import pytest

from broker import selectors
from common.errors import ReplyCode, SelectorError

Fields = dict[str, list[str]]

QUOTE: Fields = {
    "symbol": ["XMPL"], "net-change-pct": ["10.0"], "issue-name": ["Example,   Inc."],
    "name": ["Lučić"], "paren": ["a(b)c*d\\e"], "code": ["abc"],
}


def ev(text: str, fields: Fields | None = None) -> bool | None:
    return selectors.compile("RFC-2254", text).evaluate(QUOTE if fields is None else fields)


ITEMS = [
    ("(symbol=XMPL)", True), ("(symbol=xmpl)", True), ("(symbol=XMP)", False),
    ("(symbol=*)", True), ("(absent=*)", False), ("(symbol=X*)", True), ("(symbol=*mpl)", True),
    ("(symbol=x*p*l)", True), ("(symbol=*Q*)", False), ("(symbol=X*M*P*L)", True),
    ("(issue-name~=example, inc.)", True), ("(issue-name~=  EXAMPLE,  INC.  )", True),
    ("(issue-name=example, inc.)", False), ("(net-change-pct>=10)", True),
    ("(net-change-pct<=9.5)", False), ("(net-change-pct>5.0)", True),
    ("(net-change-pct<-5.0)", False), ("(code>=ABB)", True), ("(code<=abb)", False),
    ("(code>ab)", True), ("(code<B)", True),
]


@pytest.mark.parametrize(("text", "expected"), ITEMS)
def test_item_kinds(text: str, expected: bool) -> None:
    """Equality, presence, substrings, approx and (strict) ordering match as selectors.md says."""
    assert ev(text) is expected


COMBINATIONS = [
    ("(&(symbol=XMPL)(net-change-pct>=5))", True), ("(&(symbol=XMPL)(code=x))", False),
    ("(|(symbol=nope)(code=ABC))", True), ("(|(symbol=nope)(code=x))", False),
    ("(!(symbol=nope))", True), ("(!(absent=x))", True), ("(!(absent=*))", True),
    ("(&(symbol=XMPL))", True), ("(|(!(&(code=abc)(symbol=*))))", False),
]


@pytest.mark.parametrize(("text", "expected"), COMBINATIONS)
def test_and_or_not_are_two_valued(text: str, expected: bool) -> None:
    """`&`, `|`, `!` combine; a missing attribute is FALSE, so `(!…)` of it is TRUE."""
    assert ev(text) is expected


EXTENSIONS = [
    "&(symbol='XMPL') (|(net-change-pct > 5.0)(net-change-pct < -5.0))",
    "(& (symbol = XMPL )\n\t(net-change-pct>5))",
    "symbol=XMPL",
    "( symbol='XMPL' )",
    "(paren='a(b)c\\2ad\\5ce')",
]


@pytest.mark.parametrize("text", EXTENSIONS)
def test_project_extensions(text: str) -> None:
    """Strict > <, no outer parentheses, quoted values, whitespace between components."""
    assert ev(text) is True


ESCAPES = [
    ("(paren=a\\28b\\29c\\2ad\\5ce)", True), ("(paren=*\\2a*)", True),
    ("(name=Lu\\c4\\8di\\c4\\87)", True), ("(name=LU\\C4\\8CI\\C4\\86)", True),
    ("(name=lučić)", True), ("(code=\\61bc)", True), ("(code=a\\00c)", False),
]


@pytest.mark.parametrize(("text", "expected"), ESCAPES)
def test_rfc4515_escapes(text: str, expected: bool) -> None:
    """`\\XX` escapes denote UTF-8 bytes; escaped `*` is literal; case folds after decoding."""
    assert ev(text) is expected


def test_repeated_attribute_any_instance() -> None:
    """Any instance suffices, and ordering is numeric only when both sides are numbers."""
    fields = {"x": ["abc", "7"], "y": ["10", "9"]}
    assert ev("(x=ABC)", fields) is True
    assert ev("(x>=5)", fields) is True
    assert ev("(y<=9)", fields) is True
    assert ev("(y>=10)", {"y": ["9"]}) is False  # numeric, not "9" > "10" as text


ERRORS = [
    ("(a=b", 3, "never closed"), ("(a=b))", 5, "unexpected ')'"), ("(&)", 1, "empty (&)"),
    ("(|)", 1, "empty (|)"), ("(a:=b)", 2, "extensible"), ("(a:dn:=b)", 2, "extensible"),
    ("(a=\\zz)", 3, "bad escape"), ("(a=\\4)", 3, "bad escape"), ("(a=\\c4)", 3, "not UTF-8"),
    ("(=b)", 1, "empty attribute name"), ("(a#b)", 2, "unknown filter operator"),
    ("(a>=x*)", 4, "only allowed with '='"), ("(!)", 2, "expected '('"),
    ("(a=b)(c=d)", 5, "after the filter"), ("(a=(b)", 3, "unescaped '('"),
    ("(a='b)", 3, "unterminated"), ("(1a=b)", 1, "not an XML name"),
]


@pytest.mark.parametrize(("text", "position", "reason"), ERRORS)
def test_compile_errors_carry_position_and_reason(text: str, position: int, reason: str) -> None:
    """Every incorrect filter raises SelectorError (567) pointing at the problem."""
    with pytest.raises(SelectorError) as info:
        selectors.compile("RFC-2254", text)
    assert info.value.code is ReplyCode.INCORRECT_SELECTOR
    assert reason in info.value.reason
    assert info.value.position == position


def test_empty_filter_matches_everything() -> None:
    """A blank RFC-2254 selector selects every message, like an absent one."""
    assert selectors.compile("RFC-2254", " ").matches_fields({}) is True
