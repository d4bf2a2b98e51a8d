"""Endpoint syntax and comparison (RFC 3340 §2.2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.apex import Endpoint
from common.errors import ApexpsError, InvalidParameter, ReplyCode


@pytest.mark.parametrize(
    ("text", "address", "subaddress", "domain"),
    [
        ("fred@example.com", "fred", None, "example.com"),
        ("apex=pubsub/equity.quote@example.com", "apex=pubsub", "equity.quote", "example.com"),
        ("fred/appl=wb@example.com", "fred", "appl=wb", "example.com"),
        ("fred@[10.0.0.1]", "fred", None, "[10.0.0.1]"),
        ("J\u00fcrgen Smith@example.com", "J\u00fcrgen Smith", None, "example.com"),
    ],
)
def test_parse_examples(text: str, address: str, subaddress: str | None, domain: str) -> None:
    """The RFC's own examples split into address, subaddress and domain and print back."""
    endpoint = Endpoint.parse(text)
    assert (endpoint.address, endpoint.subaddress, endpoint.domain) == (address, subaddress, domain)
    assert str(endpoint) == text


@pytest.mark.parametrize(
    "text",
    ["fred", "@example.com", "fred@", "a/b/c@example.com", "fred/@example.com",
     "fr\x01ed@example.com", "fred@exa mple.com", "fred@-example.com", "fred@[]",
     "apex:%ff@example.com", "x" * 2000 + "@example.com"],
)
def test_parse_rejects(text: str) -> None:
    """Malformed endpoints raise InvalidParameter, code 553."""
    with pytest.raises(InvalidParameter) as info:
        Endpoint.parse(text)
    assert info.value.code is ReplyCode.PARAMETER_INVALID


def test_comparison_rules() -> None:
    """Local parts compare exactly, domains case-insensitively, apex: URLs after decoding."""
    assert Endpoint.parse("fred@example.com") != Endpoint.parse("Fred@example.com")
    assert Endpoint.parse("fred@example.com") == Endpoint.parse("fred@EXAMPLE.Com")
    assert Endpoint.parse("apex:f%72ed@example.com") == Endpoint.parse("fred@example.com")
    assert hash(Endpoint.parse("a@B.c")) == hash(Endpoint.parse("a@b.C"))


def test_subaddress_and_well_known() -> None:
    """A subaddress belongs to its base endpoint; 'apex=' names are well-known endpoints."""
    wke = Endpoint.parse("apex=pubsub/equity.quote@example.com")
    assert wke.base == Endpoint.parse("apex=pubsub@example.com")
    assert wke.is_well_known and not Endpoint.parse("fred@example.com").is_well_known


@given(st.text(max_size=80))
def test_any_text_parses_or_raises_coded_error(text: str) -> None:
    """Any text either parses (and round-trips) or raises an ApexpsError with code 553."""
    try:
        endpoint = Endpoint.parse(text)
    except ApexpsError as exc:
        assert exc.code is ReplyCode.PARAMETER_INVALID
    else:
        assert Endpoint.parse(str(endpoint)) == endpoint


@given(st.from_regex(r"[a-z=.]{1,10}(/[a-z.]{1,8})?@[a-z]{1,8}(\.[a-z]{2,5}){0,2}",
                     fullmatch=True))
def test_valid_endpoints_round_trip(text: str) -> None:
    """Generated well-formed endpoints parse and print back unchanged."""
    assert str(Endpoint.parse(text)) == text
