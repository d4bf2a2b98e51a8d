"""The values of event notification (broker/events/_model.py): which events a message causes,
resources, event lists, and the Expires policy (never longer than asked, min-expires)."""

from __future__ import annotations

import dataclasses

import pytest

from broker.events import (
    APP_EVENT_OPTION,
    PERMANENT,
    ExpiresPolicy,
    Resource,
    check_events,
    events_of,
)
from common.errors import EventNotUnderstood, ExpiresTooBrief, InvalidParameter
from tests.events.test_watches_machine import _entry


def test_events_follow_the_item_transition() -> None:
    """No state → state is created, state → other state modified, state → none deleted; a
    message that changes nothing causes nothing, not even its application code."""
    plain = _entry("q.a", "IBM")
    coded = dataclasses.replace(plain, options={APP_EVENT_OPTION: "32769"})
    assert events_of(plain, False, True, True) == {1}
    assert events_of(plain, True, True, True) == {2}
    assert events_of(plain, True, False, True) == {3}
    assert events_of(coded, True, True, True) == {2, 0x8001}
    assert events_of(coded, True, True, False) == frozenset()
    assert events_of(coded, False, False, True) == frozenset()


def test_resources_and_event_lists() -> None:
    """TOPIC/MESSAGE-ID, the message-id may hold '/'; events 1-3 and ≥ 0x8000 only."""
    assert Resource.parse("q.a/IBM/x") == Resource("q.a", "IBM/x")
    for bad in ("q.a", "/IBM", "q.a/"):
        with pytest.raises(InvalidParameter):
            Resource.parse(bad)
    assert check_events({1, 3, 0x8000}) == {1, 3, 0x8000}
    for bad in (set(), {4}, {0}, {0x7FFF}, {2**32}):
        with pytest.raises(EventNotUnderstood):
            check_events(bad)


def test_expires_is_never_lengthened() -> None:
    """Shortened to the maximum, permanent as asked or the maximum, 572 with min-expires."""
    pol = ExpiresPolicy(min_s=10, max_s=100)
    assert (pol.grant(50), pol.grant(500), pol.grant(PERMANENT)) == (50, 100, PERMANENT)
    assert ExpiresPolicy(10, 100, permanent=False).grant(PERMANENT) == 100
    with pytest.raises(ExpiresTooBrief) as caught:
        pol.grant(9)
    assert caught.value.min_expires == 10 and int(caught.value.code) == 572
