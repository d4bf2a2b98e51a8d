"""Topic names: what apexps accepts, whatever the Kafka layout."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.names import MAX_TOPIC_LEN, validate_topic
from common.errors import InvalidTopicName


@pytest.mark.parametrize("name", [
    "music.jazz.milesdavis", "finance.vc.findandflip", "WKT=Topics", "WKT=Subscriptions",
    "equity.quote", "a", "Equity.XMPL", "net-change_pct.v2", "x.2026",
])
def test_accepts_draft_and_well_known_names(name: str) -> None:
    """The drafts' own names and the well-known topics are accepted unchanged."""
    assert validate_topic(name) == name


@pytest.mark.parametrize("name", [
    "", " ", "music jazz", "a/b", "apex=pubsub/x", "a@b", "a..b", ".a", "a.", "1abc", "-a",
    "WKT=Other", "WKT=", "a\x00b", "caf\u00e9", "a" * (MAX_TOPIC_LEN + 1), "a\nb",
])
def test_refuses_unacceptable_names(name: str) -> None:
    """Names that would be ambiguous in an endpoint or break the grammar raise 553."""
    with pytest.raises(InvalidTopicName) as info:
        validate_topic(name)
    assert int(info.value.code) == 553


def test_well_known_can_be_refused_where_reserved() -> None:
    """Callers that must not create a well-known topic can forbid the reserved names."""
    with pytest.raises(InvalidTopicName):
        validate_topic("WKT=Topics", allow_well_known=False)


def test_non_text_is_refused() -> None:
    """A topic name that is not a string raises InvalidTopicName, not TypeError."""
    with pytest.raises(InvalidTopicName):
        validate_topic(42)


@given(st.text(max_size=300))
def test_any_text_is_accepted_or_refused_cleanly(name: str) -> None:
    """Any text is either returned unchanged or refused with InvalidTopicName."""
    try:
        assert validate_topic(name) == name
    except InvalidTopicName:
        return
    assert "/" not in name and "@" not in name and len(name) <= MAX_TOPIC_LEN
