"""A MSG over `max_message_size` is answered, not fatal (DESIGN invariant 7).

The channel stops keeping such a MSG's payload the moment it would outgrow the cap, checks every
frame as any other, and on the last frame the session answers with ERR 554 (an RFC 3080
§2.3.1.5 `error` element) and reports `MessageRefused`. These tests hold it to: one ERR whatever
the framing, at most the cap held at any moment, the channel usable after, the fast path
(`receive_whole`) deciding as the general one, and replies over the cap still terminating.
"""

from __future__ import annotations

import re
from itertools import pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.beep import (
    BeepConfig,
    BeepConnection,
    ErrorReplyReceived,
    FrameDecoder,
    FrameType,
    MessageReceived,
    MessageRefused,
    ProtocolViolation,
    ReplyReceived,
    SeqFrame,
    SessionState,
)

from .helpers import ECHO, ConnectionPair
from .test_fast_paths import _general_paths

CAP = 1000
#: Every message here (and the one after it) fits the 4096-octet initial window (RFC 3081
#: §3.1.1), so forged frames never wait for the listener's SEQ.
CONFIG = BeepConfig(max_message_size=CAP)


def _opened(config: BeepConfig = CONFIG) -> ConnectionPair:
    pair = ConnectionPair(config=config)
    pair.open()
    assert pair.start(ECHO) == 1
    return pair


def _frames(msgno: int, seqno: int, payload: bytes, cuts: list[int], kind: str = "MSG") -> bytes:
    """`payload` as frames of `kind` on channel 1 cut at `cuts` (sorted offsets)."""
    out = []
    bounds = [0, *cuts, len(payload)]
    for i, (lo, hi) in enumerate(pairwise(bounds)):
        more = "*" if i < len(cuts) else "."
        out.append(f"{kind} 1 {msgno} {more} {seqno + lo} {hi - lo}\r\n".encode()
                   + payload[lo:hi] + b"END\r\n")
    return b"".join(out)


def _data_frames(wire: bytes) -> list[tuple[FrameType, int, int, bytes]]:
    """(type, channel, msgno, payload) of each data frame in `wire`; SEQ frames skipped."""
    decoder = FrameDecoder(1 << 20)
    decoder.feed(wire)
    frames = []
    while (frame := decoder.next_frame()) is not None:
        if not isinstance(frame, SeqFrame):
            frames.append((frame.type, frame.channel, frame.msgno, frame.payload))
    return frames


def _feed(conn: BeepConnection, wire: bytes, chunks: list[int]) -> tuple[list[object], int]:
    """Feed `wire` cut at `chunks`; return the events and the most MSG octets held meanwhile."""
    events: list[object] = []
    peak = 0
    for lo, hi in pairwise([0, *chunks, len(wire)]):
        if hi > lo:
            events += conn.receive_data(wire[lo:hi])
        peak = max(peak, conn.held_msg_bytes)
    return events, peak


_ERROR = re.compile(rb"^Content-Type: application/beep\+xml\r\n\r\n<error code='554'>"
                    rb"message of (\d+) octets exceeds the limit of 1000 octets this peer"
                    rb" accepts \(max_message_size\); send it in smaller messages</error>\r\n$")


def _run(payload: bytes, cuts: list[int], chunks: list[int]) -> tuple[object, ...]:
    """Open a session, feed the listener the oversized MSG 0 then a small MSG 1 and answer it;
    return everything observable."""
    pair = _opened()
    listener = pair.listener
    listener.data_to_send()
    wire = _frames(0, 0, payload, cuts)
    events, peak = _feed(listener, wire, sorted(c % (len(wire) + 1) for c in chunks))
    refused_out = listener.data_to_send()
    follow = listener.receive_data(_frames(1, len(payload), b"\r\nnext", []))
    listener.send_rpy(1, 1, b"fine")
    return events, peak, refused_out, follow, listener.data_to_send(), listener.state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(CAP + 1, 3 * CAP), st.lists(st.integers(0, 3 * CAP), max_size=12),
       st.lists(st.integers(0, 4 * CAP), max_size=8))
def test_any_framing_of_an_oversized_msg_gets_one_err(size: int, cuts: list[int],
                                                       chunks: list[int]) -> None:
    """Any split of an oversized MSG into frames, delivered in any cuts: one `MessageRefused`,
    one ERR 554 naming the limit, never more than the cap held, the session open, the next MSG
    on the channel delivered and answered; the fast paths decide as the general path."""
    payload = b"\r\n" + b"x" * (size - 2)
    cuts = sorted({c for c in cuts if c <= size})
    outcome = _run(payload, cuts, chunks)
    with _general_paths():
        assert _run(payload, cuts, chunks) == outcome
    events, peak, refused_out, follow, answered, state = outcome
    [refused] = events
    assert isinstance(refused, MessageRefused)
    assert (refused.channel, refused.msgno, refused.code, refused.size, refused.limit) == (
        1, 0, 554, size, CAP)
    assert peak <= CAP
    [(ftype, channel, msgno, body)] = _data_frames(refused_out)
    assert (ftype, channel, msgno) == (FrameType.ERR, 1, 0)
    match = _ERROR.match(body)
    assert match is not None and int(match.group(1)) == size, body
    assert follow == [MessageReceived(1, 1, "application/octet-stream", b"next")]
    assert _data_frames(answered) == [(FrameType.RPY, 1, 1, b"\r\nfine")]
    assert state is SessionState.OPEN


def test_the_cap_itself_is_delivered() -> None:
    """A MSG of exactly max_message_size octets is a message, not a refusal."""
    pair = _opened()
    payload = b"\r\n" + b"y" * (CAP - 2)
    events = pair.listener.receive_data(_frames(0, 0, payload, [200, 700]))
    assert events == [MessageReceived(1, 0, "application/octet-stream", payload[2:])]


def test_what_was_kept_is_let_go() -> None:
    """The frame that takes a MSG over the cap frees what was kept of it, and later frames add
    nothing: the memory is not held until the MSG ends."""
    pair = _opened()
    listener = pair.listener
    payload = b"\r\n" + b"w" * 2998
    wire = _frames(0, 0, payload, [800, 1600, 2400])
    ends = [m.end() for m in re.finditer(rb"END\r\n", wire)]
    held = []
    for lo, hi in pairwise([0, *ends]):
        listener.receive_data(wire[lo:hi])
        held.append(listener.held_msg_bytes)
    assert held == [800, 0, 0, 0]


def test_the_sender_gets_the_err_and_goes_on() -> None:
    """Over a real pair (the initiator's own framing, SEQ flow control both ways): the
    initiator's MSG over the listener's cap comes back as an ERR with the `error` element, and
    the same channel then carries a MSG and its reply."""
    pair = _opened()
    big = pair.initiator.send_msg(1, b"z" * (3 * CAP))
    got_i, got_l = pair.pump()
    assert [type(e) for e in got_l] == [MessageRefused]
    [err] = got_i
    assert isinstance(err, ErrorReplyReceived) and err.msgno == big
    assert err.content_type == "application/beep+xml"
    assert err.body.startswith(b"<error code='554'>message of 30") and b"1000" in err.body
    small = pair.initiator.send_msg(1, b"hello")
    _, got_l = pair.pump()
    assert got_l == [MessageReceived(1, small, "application/octet-stream", b"hello")]
    pair.listener.send_rpy(1, small, b"world")
    got_i, _ = pair.pump()
    assert got_i == [ReplyReceived(1, small, "application/octet-stream", b"world")]
    assert pair.initiator.state is pair.listener.state is SessionState.OPEN


def test_the_err_waits_for_earlier_replies() -> None:
    """RFC 3080 §2.6.1: the session's ERR to a refused MSG goes out after the application's
    reply to an earlier MSG, however late that reply comes."""
    pair = _opened()
    listener = pair.listener
    listener.data_to_send()
    first = b"\r\nfirst"
    events = listener.receive_data(_frames(0, 0, first, [])
                                   + _frames(1, len(first), b"\r\n" + b"x" * CAP, [400]))
    assert [type(e) for e in events] == [MessageReceived, MessageRefused]
    assert _data_frames(listener.data_to_send()) == []  # the ERR is staged behind MSG 0
    listener.send_rpy(1, 0, b"one")
    frames = _data_frames(listener.data_to_send())
    assert [(f[0], f[2]) for f in frames] == [(FrameType.RPY, 0), (FrameType.ERR, 1)]


def test_a_refused_msg_is_still_checked_frame_by_frame() -> None:
    """Dropping the payload does not drop the checks: a frame of the refused MSG with the wrong
    seqno, or another message interrupting it, still terminates the session."""
    for tail in (b"MSG 1 0 . 9999 3\r\nabcEND\r\n", b"MSG 1 1 . 1500 3\r\nabcEND\r\n"):
        pair = _opened()
        head = b"MSG 1 0 * 0 1500\r\n" + b"x" * 1500 + b"END\r\n"
        assert pair.listener.receive_data(head) == []
        [violation] = pair.listener.receive_data(tail)
        assert isinstance(violation, ProtocolViolation) and violation.terminate
        assert pair.listener.state is SessionState.TERMINATED


def test_an_oversized_channel_zero_msg_gets_an_error_reply() -> None:
    """On channel zero too the session answers with the `error` element and goes on."""
    pair = _opened()
    pair.listener.data_to_send()
    body = b"Content-Type: application/beep+xml\r\n\r\n" + b" " * 1500
    seqno = pair.listener._channels[0].recv.expected  # to forge the frames in sequence
    first, second = body[:700], body[700:]
    events = pair.listener.receive_data(
        f"MSG 0 7 * {seqno} {len(first)}\r\n".encode() + first + b"END\r\n")
    assert events == []
    events = pair.listener.receive_data(
        f"MSG 0 7 . {seqno + 700} {len(second)}\r\n".encode() + second + b"END\r\n")
    assert [type(e) for e in events] == [MessageRefused]
    [(ftype, channel, msgno, reply)] = _data_frames(pair.listener.data_to_send())
    assert (ftype, channel, msgno) == (FrameType.ERR, 0, 7)
    assert b"<error code='554'>" in reply
    assert pair.listener.state is SessionState.OPEN


def test_a_reply_over_the_cap_still_terminates() -> None:
    """Unchanged: a reply cannot be answered, so an RPY over the cap ends the session."""
    pair = _opened()
    msgno = pair.initiator.send_msg(1, b"q")
    pair.pump()
    payload = b"\r\n" + b"r" * CAP
    [violation] = pair.initiator.receive_data(_frames(msgno, 0, payload, [600], kind="RPY"))
    assert isinstance(violation, ProtocolViolation) and violation.terminate
    assert violation.code == 554 and "exceeds 1000 octets" in violation.text
