"""The facade between two peers (ConnectionPair): exchanges, ordering, closing, local errors."""

from __future__ import annotations

import pytest

from adapters.beep import (
    AnswerReceived,
    AnswersComplete,
    BeepConnection,
    ChannelClosed,
    ChannelStartRefused,
    CloseRequested,
    ErrorReplyReceived,
    LocalProtocolError,
    MessageReceived,
    Profile,
    ProfileEncoding,
    ReplyReceived,
    Role,
    SessionState,
)

from .helpers import APEX, ECHO, ConnectionPair

OCTETS = "application/octet-stream"


@pytest.fixture(name="pair", params=[False, True], ids=["whole", "bytewise"])
def _pair(request: pytest.FixtureRequest) -> ConnectionPair:
    """An opened session with the echo channel 1 started, bytes shuttled whole or bytewise."""
    pair = ConnectionPair(bytewise=bool(request.param))
    pair.open()
    pair.start(ECHO)
    return pair


def test_msg_rpy_round_trip(pair: ConnectionPair) -> None:
    """A MSG with a content type arrives whole; its RPY comes back to the right msgno."""
    msgno = pair.initiator.send_msg(1, b"<x/>", content_type="text/xml")
    _, got = pair.pump()
    assert got == [MessageReceived(1, msgno, "text/xml", b"<x/>")]
    pair.listener.send_rpy(1, msgno, b"ok")
    got_i, _ = pair.pump()
    assert got_i == [ReplyReceived(1, msgno, OCTETS, b"ok")]


def test_one_to_many(pair: ConnectionPair) -> None:
    """ANS messages then NUL arrive as answers and the end of the reply."""
    msgno = pair.initiator.send_msg(1, b"list")
    pair.pump()
    assert [pair.listener.send_ans(1, msgno, b"a%d" % i) for i in range(3)] == [0, 1, 2]
    pair.listener.send_nul(1, msgno)
    got, _ = pair.pump()
    assert got == [AnswerReceived(1, msgno, i, OCTETS, b"a%d" % i) for i in range(3)] + [
        AnswersComplete(1, msgno)]


def test_replies_released_in_msg_order(pair: ConnectionPair) -> None:
    """RFC 3080 §2.6.1: replies answered out of order still go out in MSG order."""
    first, second = pair.initiator.send_msg(1, b"1"), pair.initiator.send_msg(1, b"2")
    pair.pump()
    pair.listener.send_err(1, second, b"second")
    assert pair.listener.data_to_send() == b""  # held behind the first
    pair.listener.send_rpy(1, first, b"first")
    got, _ = pair.pump()
    assert got == [ReplyReceived(1, first, OCTETS, b"first"),
                   ErrorReplyReceived(1, second, OCTETS, b"second")]


def test_illegal_commands_change_nothing(pair: ConnectionPair) -> None:
    """Commands the protocol forbids raise LocalProtocolError and send nothing."""
    conn = pair.listener
    msgno = pair.initiator.send_msg(1, b"x")
    pair.pump()
    attempts = [
        lambda: conn.send_rpy(1, msgno + 1, b""),  # no such MSG
        lambda: conn.send_msg(0, b""),  # channel zero is not for data
        lambda: conn.send_msg(7, b""),  # not open
        lambda: conn.start_channel([ECHO], number=3),  # odd numbers are the initiator's
        lambda: conn.accept_start(9, ECHO),  # nobody asked
        lambda: conn.accept_close(1),  # nobody asked
        conn.send_greeting,  # already sent
        lambda: conn.send_msg(1, b"", content_type="a\r\nb"),  # header injection
    ]
    for attempt in attempts:
        with pytest.raises(LocalProtocolError):
            attempt()
        assert conn.data_to_send() == b""
    conn.send_ans(1, msgno, b"a")
    with pytest.raises(LocalProtocolError):
        conn.send_rpy(1, msgno, b"")  # an ANS already started a one-to-many reply
    assert conn.state is SessionState.OPEN


def test_close_requires_acknowledged_msgs(pair: ConnectionPair) -> None:
    """RFC 3080 §2.3.1.3: no close while one of our MSGs has no reply yet."""
    pair.initiator.send_msg(1, b"x")
    with pytest.raises(LocalProtocolError):
        pair.initiator.close_channel(1)


def test_close_and_reuse_channel(pair: ConnectionPair) -> None:
    """After ok the channel is gone on both sides; a new start may use the number again."""
    pair.initiator.close_channel(1)
    pair.pump()
    pair.listener.accept_close(1)
    got, _ = pair.pump()
    assert got == [ChannelClosed(1)]
    assert pair.initiator.start_channel([ECHO], number=1) == 1


def test_refused_start_frees_the_number(pair: ConnectionPair) -> None:
    """A start the application rejects reports the code and frees the number."""
    number = pair.initiator.start_channel([APEX])
    pair.pump()
    pair.listener.reject_start(number, 421, "busy")
    got, _ = pair.pump()
    assert got == [ChannelStartRefused(number, 421, "busy")]
    assert number not in pair.initiator.channels


def test_unsupported_profile_refused_automatically(pair: ConnectionPair) -> None:
    """A start naming no profile the listener serves is refused with 550 without asking."""
    number = pair.initiator.start_channel(["http://example.org/none"])
    got_i, got_l = pair.pump()
    assert got_l == []
    assert got_i == [ChannelStartRefused(number, 550, "all requested profiles are\nunsupported")]


def test_piggybacked_base64_and_server_name(pair: ConnectionPair) -> None:
    """Initialization content (base64) and serverName reach the listener intact."""
    offer = Profile(APEX, "aGVsbG8=", ProfileEncoding.BASE64)
    number = pair.initiator.start_channel([offer], server_name="apex.example.org")
    _, got = pair.pump()
    assert got[0].profiles == (offer,)  # type: ignore[attr-defined]
    pair.listener.accept_start(number, APEX)
    assert pair.listener.server_name == "apex.example.org"


def test_start_limit(pair: ConnectionPair) -> None:
    """No more channels than max_channels may be open or starting."""
    conn = BeepConnection(Role.INITIATOR, pair.initiator.config.__class__(max_channels=1))
    conn.receive_data(b"RPY 0 0 . 0 52\r\nContent-Type: application/beep+xml\r\n\r\n"
                      b"<greeting />\r\nEND\r\n")
    conn.send_greeting()
    conn.start_channel([ECHO])
    with pytest.raises(LocalProtocolError):
        conn.start_channel([ECHO])


def test_simultaneous_close_of_one_channel(pair: ConnectionPair) -> None:
    """Both peers close channel 1 at once: each accepts the other's, neither crashes."""
    pair.initiator.close_channel(1)
    pair.listener.close_channel(1)
    got_i, got_l = pair.pump()
    assert CloseRequested(1, 200, "") in got_i and CloseRequested(1, 200, "") in got_l
    pair.initiator.accept_close(1)
    pair.listener.accept_close(1)
    more_i, more_l = pair.pump()
    assert ChannelClosed(1) in more_i and ChannelClosed(1) in more_l
    assert pair.initiator.channels == pair.listener.channels == {0: ""}
    assert pair.initiator.state is pair.listener.state is SessionState.OPEN


@pytest.mark.parametrize("explicit", [False, True], ids=["implied", "explicit"])
def test_session_release_names_channel_zero_on_request(pair: ConnectionPair,
                                                       explicit: bool) -> None:
    """`close_session(explicit_number=True)` writes `number='0'` (beepcore-java wants it); the
    default keeps RFC 3080 §2.4's implied form, and the peer reads both as the same release."""
    pair.initiator.close_session(explicit_number=explicit)
    sent = pair.initiator.data_to_send()
    assert (b"<close number='0' code='200' />" in sent) is explicit
    assert (b"<close code='200' />" in sent) is not explicit
    assert pair.listener.receive_data(sent) == [CloseRequested(0, 200, "")]
    pair.listener.accept_close(0)
    pair.pump()
    assert pair.initiator.state is pair.listener.state is SessionState.CLOSED
