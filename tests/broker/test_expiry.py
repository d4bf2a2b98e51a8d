"""broker/expiry.py: the expiration and revision rules of draft §5.2.1, without a clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.expiry import (
    MAX_REVISION,
    expired,
    expires_at,
    parse_revision,
    supersedes,
)
from broker.pubsub.ingest import ingest, parse_date
from common.errors import InvalidParameter

#: 2030-03-15T20:15:00Z in epoch milliseconds
AT = 1_899_836_100_000
DATE = "2030-03-15T12:15:00-08:00"


def test_a_date_expires_at_its_instant_and_not_before() -> None:
    """A dated message is valid before its instant and expired at and after it."""
    assert expires_at(DATE) == AT
    assert not expired(DATE, AT - 1)
    assert expired(DATE, AT)
    assert expired(DATE, AT + 1)


def test_z_and_offsets_name_the_same_instant() -> None:
    """`Z` and a numeric offset are read as the instants they name."""
    assert expires_at("2030-03-15T20:15:00Z") == AT
    assert expires_at("2030-03-15T20:15:00+00:00") == AT


def test_star_and_absent_never_expire() -> None:
    """`*` and no header never expire, live or not."""
    for text in ("*", None):
        assert not expired(text, 1 << 60)
        assert not expired(text, 1 << 60, live=True)


def test_zero_goes_live_once_and_nowhere_else() -> None:
    """`0`: the live fan-out still forwards it; every later reader finds it expired."""
    assert not expired("0", 0, live=True)
    assert expired("0", 0)


@pytest.mark.parametrize("text", [DATE, "2030-03-15T20:15:00Z", "2030-03-15T20:15:00",
                                  "2030-03-15", " 2030-03-15T12:15:00-08:00\n", "0", "*"])
def test_the_ingest_and_the_expiry_rule_read_a_date_alike(text: str) -> None:
    """What the ingest accepts, `expires_at` reads as the same instant (naive: UTC)."""
    got = ingest(_doc(text), "application/xml", topic="q", publisher="p@example.com", now=0)
    assert got.expiration_date is not None
    if got.expiration_date in ("0", "*"):
        assert expires_at(got.expiration_date) is None
    else:
        assert expires_at(got.expiration_date) == parse_date(got.expiration_date.strip(),
                                                             "expiration-date")


def _doc(exp: str) -> bytes:
    return (f"<ps:message-content xmlns:ps='http://www.example.com/pubsub'>"
            f"<ps:expiration-date>{exp}</ps:expiration-date>"
            "<ps:content><q /></ps:content></ps:message-content>").encode()


def test_an_unreadable_header_in_the_journal_never_expires() -> None:
    """A header that slipped past the ingest is not a reason to lose the message."""
    assert not expired("garbage", 1 << 60)


@pytest.mark.parametrize("bad", ["-1", "1.5", "x", str(MAX_REVISION + 1), "99999999999"])
def test_revisions_outside_the_range_are_refused(bad: str) -> None:
    """553 for a revision-id that is not an integer in 0..2,147,483,647."""
    with pytest.raises(InvalidParameter):
        parse_revision(bad)


@given(st.integers(0, MAX_REVISION), st.integers(0, MAX_REVISION))
def test_only_a_strictly_higher_revision_supersedes(new: int, old: int) -> None:
    """A revision replaces a cached one only if it is higher; equal or lower does not."""
    assert supersedes(new, old) is (new > old)
    assert supersedes(new, None)
    assert not supersedes(None, old)
