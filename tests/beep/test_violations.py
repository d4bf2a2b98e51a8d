"""What the peer must not do, and the RFC's response to each: terminate silently, or answer."""

from __future__ import annotations

import pytest

from adapters.beep import (
    BeepConfig,
    BeepConnection,
    MessageReceived,
    MessageRefused,
    ProtocolViolation,
    Role,
    SessionClosed,
    SessionState,
)

from .helpers import ECHO, ConnectionPair


@pytest.fixture(name="pair")
def _pair() -> ConnectionPair:
    """An opened session with channel 1 (echo) started by the initiator."""
    pair = ConnectionPair()
    pair.open()
    assert pair.start(ECHO) == 1
    return pair


def assert_terminated(conn: BeepConnection, events: list[object], code: int | None = None
                      ) -> ProtocolViolation:
    """The session ended with one terminating violation and no response bytes."""
    violations = [e for e in events if isinstance(e, ProtocolViolation)]
    assert len(violations) == 1 and violations[0].terminate, events
    assert code is None or violations[0].code == code
    assert conn.state is SessionState.TERMINATED
    assert conn.data_to_send() == b""  # "without generating a response" (RFC 3080 §2.2.1.1)
    return violations[0]


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"MSG 1 0 . 0 5000\r\n" + b"x" * 5000 + b"END\r\n", 554),  # window overrun
        (b"MSG 1 0 . 0 4\r\n\r\nabcEND\r\n", 500),  # declared size disagrees with payload
        (b"MSG 1 0 . 0 3\r\n\r\naEND \r\n", 500),  # bad trailer
        (b"MSG 1 0 . 7 3\r\n\r\naEND\r\n", 500),  # seqno out of sequence
        (b"RPY 1 5 . 0 3\r\n\r\naEND\r\n", 500),  # reply to a msgno never sent
        (b"MSG 3 0 . 0 3\r\n\r\naEND\r\n", 500),  # channel never started
        (b"MSG 1 0 . 0 100000000\r\n", 554),  # 100 MB declared
        (b"SEQ 1 10 4096\r\n", 501),  # acknowledges octets never sent
        (b"SEQ 9 0 4096\r\n", 500),  # SEQ for a channel that is not open
        (b"ANS 0 1 . 0 3 0\r\n\r\naEND\r\n", 500),  # reply to unsent channel-zero msgno
        (b"MSG 1 0 * 0 3\r\n\r\naEND\r\nMSG 1 1 . 3 3\r\n\r\nbEND\r\n", 500),  # interleaving
        (b"NUL 1 0 . 0 0\r\nEND\r\n", 500),  # NUL to nothing
        (b"HELO\r\n", 500),  # not BEEP at all
    ],
    ids=["window-overrun", "wrong-size", "bad-trailer", "seqno", "unknown-msgno",
         "unstarted-channel", "100MB", "bad-ackno", "seq-unknown-channel", "ans-channel-zero",
         "interleaved", "nul-unknown", "garbage"],
)
def test_poorly_formed_frames_terminate_silently(pair: ConnectionPair, wire: bytes, code: int
                                                 ) -> None:
    """RFC 3080 §2.2.1.1 / RFC 3081 §3.1.3: each violation ends the session without a reply."""
    events = pair.listener.receive_data(wire)
    assert_terminated(pair.listener, events, code)
    assert pair.listener.receive_data(b"MSG 1 0 . 0 0\r\nEND\r\n") == []  # ignored from now on


def test_msgno_reuse_terminates(pair: ConnectionPair) -> None:
    """A MSG reusing the number of a MSG still awaiting our reply is poorly formed."""
    events = pair.listener.receive_data(b"MSG 1 0 . 0 3\r\n\r\naEND\r\n")
    assert events == [MessageReceived(1, 0, "application/octet-stream", b"a")]
    assert_terminated(pair.listener, pair.listener.receive_data(b"MSG 1 0 . 3 3\r\n\r\nbEND\r\n"))


def test_reply_to_answered_msgno_terminates(pair: ConnectionPair) -> None:
    """A second reply to a MSG whose reply was completely received is poorly formed."""
    pair.initiator.send_msg(1, b"ping")
    pair.send(pair.initiator)
    pair.listener.send_rpy(1, 0, b"pong")
    pair.send(pair.listener)
    events = pair.initiator.receive_data(b"RPY 1 0 . 6 3\r\n\r\naEND\r\n")
    assert_terminated(pair.initiator, events)


def test_frame_before_greeting_terminates() -> None:
    """A data frame before the peer's greeting ends the session (RFC 3080 §2.3.1.1)."""
    conn = BeepConnection(Role.INITIATOR)
    conn.send_greeting()
    conn.data_to_send()
    events = conn.receive_data(b"MSG 0 1 . 0 3\r\n\r\naEND\r\n")
    assert_terminated(conn, events)


def test_greeting_of_wrong_kind_terminates() -> None:
    """An `ok` where the greeting belongs is a poorly-formed channel-zero reply."""
    conn = BeepConnection(Role.INITIATOR)
    payload = b"Content-Type: application/beep+xml\r\n\r\n<ok />\r\n"
    events = conn.receive_data(b"RPY 0 0 . 0 %d\r\n%bEND\r\n" % (len(payload), payload))
    assert_terminated(conn, events)


#: The initiator's channel-zero seqno in `pair`: its greeting (52) plus its start of echo (119).
ZERO_SEQNO = 52 + 119


def _management_msg(xml: bytes, seqno: int = 52, msgno: int = 1) -> bytes:
    payload = b"Content-Type: application/beep+xml\r\n\r\n" + xml
    return b"MSG 0 %d . %d %d\r\n%bEND\r\n" % (msgno, seqno, len(payload), payload)


@pytest.mark.parametrize(
    ("xml", "code"),
    [
        (b"<start number='1'><profile uri='x'>", 500),  # not well formed
        (b"<!DOCTYPE start [<!ENTITY a 'aaaa'>]><start number='1'><profile uri='&a;'/></start>",
         500),  # DTD refused outright
        (b"<?xml version='1.0'?><!DOCTYPE x SYSTEM 'http://example.org/x.dtd'><x/>", 500),
        (b"<start number='1'><profile uri='&xxe;'/></start>", 500),  # undefined entity
        (b"<greeting />", 501),  # unexpected element in a MSG
        (b"<start number='0'><profile uri='x'/></start>", 501),  # channel 0 cannot be started
        (b"<start number='1' evil='1'><profile uri='x'/></start>", 501),  # unknown attribute
        (b"<start number='1'></start>", 501),  # no profile
        (b"<close number='1' code='2000' />", 501),  # code is not three digits
        (b"<close number='5' code='200' />", 550),  # channel not open
    ],
    ids=["malformed", "doctype", "external-dtd", "entity", "greeting", "zero", "attr",
         "no-profile", "code", "no-channel"],
)
def test_bad_channel_zero_msg_gets_error_reply(pair: ConnectionPair, xml: bytes, code: int
                                               ) -> None:
    """RFC 3080 §2.3.1.5: a poorly-formed or unexpected element is answered with `error`."""
    events = pair.listener.receive_data(_management_msg(xml, seqno=ZERO_SEQNO, msgno=2))
    out = pair.listener.data_to_send()
    assert out.startswith(b"ERR 0 2 . ")
    assert f"<error code='{code}'>".encode() in out
    assert pair.listener.state is SessionState.OPEN
    assert all(not getattr(e, "terminate", False) for e in events)


def test_billion_laughs_is_refused_cheaply(pair: ConnectionPair) -> None:
    """An XML bomb never reaches the parser's entity expansion."""
    bomb = b"<!DOCTYPE lolz [<!ENTITY lol 'lol'>" + b"".join(
        b"<!ENTITY lol%d '%s'>" % (i, b"&lol%d;" % (i - 1) * 10 if i > 1 else b"&lol;" * 10)
        for i in range(1, 10)) + b"]><start number='1'><profile uri='&lol9;'/></start>"
    pair.listener.receive_data(_management_msg(bomb, seqno=ZERO_SEQNO, msgno=2))
    assert b"<error code='500'>" in pair.listener.data_to_send()


def test_oversized_management_message_is_refused(pair: ConnectionPair) -> None:
    """Channel-zero XML beyond max_management_message_size is refused with 500."""
    config = BeepConfig(max_management_message_size=1024)
    small = ConnectionPair(config=config)
    small.open()
    xml = b"<start number='1'>" + b"<profile uri='x'/>" * 100 + b"</start>"
    small.listener.receive_data(_management_msg(xml))
    assert b"<error code='500'>" in small.listener.data_to_send()


def test_too_many_pending_msgs_terminates() -> None:
    """More pipelined MSGs than max_pending_messages ends the session."""
    pair = ConnectionPair(config=BeepConfig(max_pending_messages=2))
    pair.open()
    pair.start()
    for _ in range(3):
        pair.initiator.send_msg(1, b"x")
    assert_terminated(pair.listener, pair.send(pair.initiator), 554)


def test_oversized_message_is_refused_not_fatal() -> None:
    """A message growing beyond max_message_size over several frames is answered with ERR 554
    by the session; the session stays open (tests/beep/test_message_cap.py has the rest)."""
    pair = ConnectionPair(config=BeepConfig(max_message_size=5000))
    pair.open()
    pair.start()
    events = pair.listener.receive_data(b"MSG 1 0 * 0 3000\r\n" + b"x" * 3000 + b"END\r\n")
    assert events == []
    pair.listener.data_to_send()
    wire = b"MSG 1 0 . 3000 3000\r\n" + b"x" * 3000 + b"END\r\n"
    [refused] = pair.listener.receive_data(wire)
    assert isinstance(refused, MessageRefused)
    assert (refused.code, refused.size, refused.limit) == (554, 6000, 5000)
    assert pair.listener.state is SessionState.OPEN
    assert b"ERR 1 0 . 0 " in pair.listener.data_to_send()


def test_poorly_formed_mime_in_msg_is_reported_not_fatal(pair: ConnectionPair) -> None:
    """A MSG with broken entity headers on a profile channel is the profile's to answer."""
    events = pair.listener.receive_data(b"MSG 1 0 . 0 5\r\nhelloEND\r\n")
    [violation] = events
    assert isinstance(violation, ProtocolViolation)
    assert (violation.code, violation.terminate, violation.channel, violation.msgno) == (
        500, False, 1, 0)
    pair.listener.send_err(1, 0, b"bad headers")
    assert pair.listener.data_to_send() == b"ERR 1 0 . 0 13\r\n\r\nbad headersEND\r\n"


def test_end_of_file_ends_the_session(pair: ConnectionPair) -> None:
    """b"" means the transport closed: an unclean SessionClosed, then silence."""
    assert pair.listener.receive_data(b"") == [SessionClosed(clean=False)]
    assert pair.listener.state is SessionState.TERMINATED
    assert pair.listener.receive_data(b"") == []
