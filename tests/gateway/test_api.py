"""The gateway's HTTP vocabulary, pure: request validation names the bad field, broker codes
keep their meaning as HTTP statuses, SSE text is one event per delivery, and the replay rule
owes a reconnecting stream exactly the deliveries after its Last-Event-ID."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.gateway._api import (
    Cancel,
    HttpError,
    ReplayBuffer,
    SelectorClass,
    SubscribeRequest,
    http_status,
    parse_last_event_id,
    parse_subscribe,
    parse_ws,
    sse_comment,
    sse_event,
)
from common.errors import AccessDenied, NotTaken, SelectorError, ServiceNotAvailable


def test_a_full_subscribe_request() -> None:
    """Every field taken as given."""
    got = parse_subscribe({"topic": "q.a", "duration": 60, "selector": "price > 1",
                           "class": "rfc-2254", "cached": True})
    assert got == SubscribeRequest("q.a", 60, "price > 1", SelectorClass.LDAP, True)
    assert parse_subscribe({"topic": "q.a"}) == SubscribeRequest("q.a")


@pytest.mark.parametrize(("body", "field"), [
    ({}, "topic"),
    ({"topic": 5}, "topic"),
    ({"topic": ""}, "topic"),
    ({"topic": "a@b"}, "topic"),
    ({"topic": "a/b"}, "topic"),
    ({"topic": "x" * 1025}, "topic"),
    ({"topic": "q", "duration": "60"}, "duration"),
    ({"topic": "q", "duration": True}, "duration"),
    ({"topic": "q", "duration": 0}, "duration"),
    ({"topic": "q", "duration": 10**9}, "duration"),
    ({"topic": "q", "selector": ""}, "selector"),
    ({"topic": "q", "selector": 3}, "selector"),
    ({"topic": "q", "class": "xpath"}, "class"),
    ({"topic": "q", "cached": "yes"}, "cached"),
    ({"topic": "q", "colour": "red"}, "colour"),
])
def test_bad_fields_are_400_naming_the_field(body: dict[str, object], field: str) -> None:
    """Each bad field is refused with 400 and its name."""
    with pytest.raises(HttpError) as caught:
        parse_subscribe(body)
    assert (caught.value.status, caught.value.field) == (400, field)
    assert caught.value.body()["field"] == field


@pytest.mark.parametrize("body", [[], "topic", None, 3])
def test_a_body_that_is_not_an_object_is_400(body: object) -> None:
    with pytest.raises(HttpError) as caught:
        parse_subscribe(body)
    assert caught.value.status == 400 and caught.value.field is None


@pytest.mark.parametrize(("body", "field"), [
    ({"topic": "q", "events": ["created"]}, "events"),
    ({"topic": "q", "expires": 5}, "expires"),
    ({"resource": "q/IBM", "topic": "q", "events": [1]}, "topic"),
    ({"resource": "q/IBM", "events": [1], "selector": "x"}, "selector"),
    ({"resource": "qIBM", "events": [1]}, "resource"),
    ({"resource": "q/IBM"}, "events"),
    ({"resource": "q/IBM", "events": []}, "events"),
    ({"resource": "q/IBM", "events": ["updated"]}, "events"),
    ({"resource": "q/IBM", "events": [True]}, "events"),
    ({"resource": "q/IBM", "events": [1], "expires": 0}, "expires"),
    ({"resource": "q/IBM", "events": [1], "expires": "soon"}, "expires"),
])
def test_resource_watch_fields_are_checked(body: dict[str, object], field: str) -> None:
    """A resource watch takes resource, events and expires, and nothing of a topic
    subscription; each bad field is a 400 naming it."""
    with pytest.raises(HttpError) as caught:
        parse_subscribe(body)
    assert (caught.value.status, caught.value.field) == (400, field)


def test_resource_watch_request() -> None:
    """Event names or codes, Expires in seconds or permanent."""
    got = parse_subscribe({"resource": "q.a/IBM/x", "events": ["Modified", 32769],
                           "expires": "permanent"})
    assert (got.topic, got.resource, got.events, got.expires) == (
        "q.a", "q.a/IBM/x", {2, 32769}, 0xFFFFFFFF)


def test_websocket_operations() -> None:
    assert parse_ws('{"op":"subscribe","topic":"q"}') == SubscribeRequest("q")
    assert parse_ws('{"op":"cancel","id":"ab"}') == Cancel("ab")
    for text, field in (("nope", None), ('{"op":"x"}', "op"), ('{"op":"cancel"}', "id"),
                        ('{"op":"subscribe"}', "topic")):
        with pytest.raises(HttpError) as caught:
            parse_ws(text)
        assert (caught.value.status, caught.value.field) == (400, field)


def test_last_event_id() -> None:
    assert parse_last_event_id(None) is None and parse_last_event_id("") is None
    assert parse_last_event_id("42") == 42
    for bad in ("-1", "4.2", "x", "1" * 20, " 1"):
        with pytest.raises(HttpError) as caught:
            parse_last_event_id(bad)
        assert caught.value.field == "Last-Event-ID"


def test_broker_codes_as_http_statuses() -> None:
    """550 unknown topic is 404, 537 is 403, 567 is 400, 421 is 503; the code is in the text."""
    assert http_status(NotTaken("no topic q")).status == 404
    assert http_status(AccessDenied("no")).status == 403
    assert http_status(SelectorError("bad")).status == 400
    assert http_status(SelectorError("bad")).field == "selector"
    assert http_status(ServiceNotAvailable("down")).status == 503
    assert http_status(NotTaken("no topic q")).message.startswith("550 ")


def test_sse_event_is_one_event_with_its_seq_as_id() -> None:
    """Content with newlines cannot split the event: data is one line of JSON."""
    raw = sse_event(7, {"content": "a\nb\r\n\nc"}).decode()
    assert raw.startswith("id: 7\ndata: ") and raw.endswith("\n\n")
    assert raw.count("\n") == 3
    assert json.loads(raw.split("data: ", 1)[1]) == {"content": "a\nb\r\n\nc"}
    assert sse_event(1, {}, "reset").startswith(b"event: reset\nid: 1\n")
    assert sse_comment("a\nb") == b": a b\n\n"


def test_replay_buffer_owes_what_came_after() -> None:
    buf = ReplayBuffer(3)
    assert buf.since(None).items == () and buf.since(0).items == ()
    for seq in (1, 2, 4, 5):  # 3 was a heartbeat: link seqs have holes
        buf.add(seq, f"e{seq}".encode())
    assert buf.evicted == 1 and buf.last == 5
    assert buf.since(None).gap is None and buf.since(None).items == ()
    assert buf.since(0).gap == (1, 1)
    assert [s for s, _ in buf.since(0).items] == [2, 4, 5]
    assert buf.since(1).gap is None
    assert [s for s, _ in buf.since(3).items] == [4, 5]
    assert buf.since(5).items == () and buf.since(9).items == ()
    with pytest.raises(ValueError, match="not rising"):
        buf.add(5, b"again")


@given(st.lists(st.integers(1, 5), min_size=1, max_size=60), st.integers(1, 8),
       st.integers(0, 200))
def test_replay_is_exactly_the_seqs_after_last_event_id(steps: list[int], size: int,
                                                       after: int) -> None:
    """Whatever the holes, the buffer size and the Last-Event-ID: the gap range and the
    buffered items together are every delivered seq after it, each once, in order."""
    seqs, seq = [], 0
    for step in steps:
        seq += step
        seqs.append(seq)
    buf = ReplayBuffer(size)
    for s in seqs:
        buf.add(s, b"")
    owed = buf.since(after)
    from_gap = [s for s in seqs if owed.gap is not None and owed.gap[0] <= s <= owed.gap[1]]
    got = from_gap + [s for s, _ in owed.items]
    assert got == [s for s in seqs if s > after]


def test_watch_refusals_keep_their_code_field_and_min_expires() -> None:
    """571 is a 400 naming events; 572 a 400 naming expires and saying min-expires."""
    from common.errors import EventNotUnderstood, ExpiresTooBrief

    assert http_status(EventNotUnderstood("no")).body() == {"error": "571 no",
                                                            "field": "events"}
    brief = http_status(ExpiresTooBrief("too short", min_expires=60))
    assert (brief.status, brief.field) == (400, "expires")
    assert brief.message == "572 too short (min-expires 60)"
