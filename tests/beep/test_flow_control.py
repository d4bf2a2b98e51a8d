"""SEQ flow control (RFC 3081 §3.1): window arithmetic, fragmentation, window updates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.beep import (
    BeepConfig,
    BeepConnection,
    ErrorReplyReceived,
    MessageReceived,
    RemoteProtocolError,
)
from adapters.beep._window import ReceiveWindow, SendWindow

from .helpers import ConnectionPair


def test_send_window_starts_at_4096() -> None:
    """RFC 3081 §3.1.1: a new channel may send 4096 octets before any SEQ."""
    window = SendWindow()
    assert window.take(10_000, 65536) == (0, 4096)
    assert window.take(1, 65536) is None
    assert window.take(0, 65536) == (4096, 0)  # empty frames need no window


def test_send_window_follows_seq_and_wraps() -> None:
    """A SEQ moves the right edge; sequence numbers wrap modulo 2**32."""
    window = SendWindow()
    window.next_seqno = window._acked = 2**32 - 10  # near the wrap
    window._edge = (window.next_seqno + 4096) % 2**32
    assert window.take(20, 65536) == (2**32 - 10, 20)
    assert window.next_seqno == 10
    window.on_seq(10, 100)
    assert window.available == 100
    with pytest.raises(RemoteProtocolError):
        window.on_seq(11, 100)  # acknowledges an octet never sent


def test_shrunk_window_is_honoured() -> None:
    """A window shrunk behind what was sent allows nothing, instead of wrapping to 4 GB."""
    window = SendWindow()
    window.take(4000, 65536)
    window.on_seq(0, 100)
    assert window.available == 0


def test_receive_window_checks_sequence_and_overrun() -> None:
    """Frames must continue the sequence and fit in the advertised window."""
    window = ReceiveWindow(4096)
    window.receive(0, 1000)
    with pytest.raises(RemoteProtocolError, match="expected"):
        window.receive(999, 1)
    with pytest.raises(RemoteProtocolError, match="overruns"):
        window.receive(1000, 3097)


def test_receive_window_update_after_half() -> None:
    """A SEQ is due once half the buffer is consumed, advertising the whole buffer again."""
    window = ReceiveWindow(4096)
    window.receive(0, 2047)
    assert window.update_due() is None
    window.receive(2047, 1)
    assert window.update_due() == (2048, 4096)
    assert window.remaining == 4096


@given(st.lists(st.integers(0, 3000), max_size=40))
def test_receive_then_acknowledge_never_overruns(sizes: list[int]) -> None:
    """A sender that honours our SEQs never overruns the receive window."""
    send, recv = SendWindow(), ReceiveWindow(4096)
    for size in sizes:
        left = size
        while left:
            grant = send.take(left, 1500)
            if grant is None:
                due = recv.update_due()
                assert due is not None, "a blocked sender must be owed a SEQ"
                send.on_seq(*due)
                continue
            recv.receive(*grant)
            left -= grant[1]


def test_large_message_fragments_and_waits_for_seq() -> None:
    """RFC 3081 §3.1.2: a 10000-octet MSG goes out as 4096 octets, then more after each SEQ."""
    pair = ConnectionPair()
    pair.open()
    pair.start()
    body = bytes(range(256)) * 39  # 9984 octets + 2 of empty headers
    pair.initiator.send_msg(1, body)
    first = pair.initiator.data_to_send()
    assert first.startswith(b"MSG 1 0 * 0 4096\r\n\r\n")
    assert pair.initiator.data_to_send() == b""  # window closed
    assert pair.listener.receive_data(first) == []
    seq = pair.listener.data_to_send()
    assert seq == b"SEQ 1 4096 4096\r\n"  # the window update RFC 3081 §3.1.4 asks for
    pair.initiator.receive_data(seq)
    second = pair.initiator.data_to_send()
    assert second.startswith(b"MSG 1 0 * 4096 4096\r\n")
    events = pair.listener.receive_data(second)
    _, more = pair.pump()
    events += more
    assert events == [MessageReceived(1, 0, "application/octet-stream", body)]


def test_max_frame_size_caps_fragments() -> None:
    """Outgoing frames never exceed max_frame_size, whatever the window."""
    pair = ConnectionPair(config=BeepConfig(max_frame_size=1000))
    pair.open()
    pair.start()
    pair.initiator.send_msg(1, b"x" * 2500)
    assert pair.initiator.data_to_send().count(b"END\r\n") == 3


def test_bigger_window_is_advertised_at_once() -> None:
    """A window above 4096 is announced by a SEQ right after the greeting (RFC 3081 §3.1.1)."""
    pair = ConnectionPair(config=BeepConfig(window_size=65536))
    pair.listener.send_greeting()
    out = pair.listener.data_to_send()
    assert out.endswith(b"END\r\nSEQ 0 0 65536\r\n")


def test_big_windows_carry_a_megabyte() -> None:
    """With 64K windows on both sides a 1 MB message crosses intact."""
    pair = ConnectionPair(config=BeepConfig(window_size=65536, max_frame_size=16384))
    pair.open()
    number = pair.start()
    body = bytes(1_000_000)
    pair.initiator.send_msg(number, body)
    _, events = pair.pump()
    assert events == [MessageReceived(number, 0, "application/octet-stream", body)]


def test_preemptive_error_finishes_our_msg_with_empty_frame() -> None:
    """RFC 3080 §2.6.3: an ERR before our last MSG frame makes us send an empty "." frame."""
    pair = ConnectionPair()
    pair.open()
    pair.start()
    pair.initiator.send_msg(1, b"x" * 6000)
    pair.initiator.data_to_send()  # the first 4096 octets left; the rest waits for a SEQ
    events = pair.initiator.receive_data(b"ERR 1 0 . 0 6\r\n\r\nnopeEND\r\nSEQ 1 4096 4096\r\n")
    assert events == [ErrorReplyReceived(1, 0, "application/octet-stream", b"nope")]
    assert pair.initiator.data_to_send() == b"MSG 1 0 . 4096 0\r\nEND\r\n"


def _queued(conn: BeepConnection) -> int:
    return sum(len(o.payload) - o.offset for c in conn._channels.values() for o in c.queue)


_STEPS = st.lists(st.one_of(
    st.tuples(st.just("msg"), st.integers(0, 12_000)),
    st.tuples(st.just("rpy"), st.integers(0, 12_000)),
    st.tuples(st.just("to_listener"), st.just(0)),
    st.tuples(st.just("to_initiator"), st.just(0)),
), max_size=30)


@given(_STEPS)
def test_backlog_is_what_the_windows_hold_back(steps: list[tuple[str, int]]) -> None:
    """`backlog` -- what a server bounds for a peer that never opens its windows -- is always
    the octets queued and not yet framed, on both sides, whatever is sent and whichever SEQs
    and replies are withheld; once everything flows it is zero."""
    pair = ConnectionPair()
    pair.open()
    number = pair.start()
    unanswered: list[int] = []
    for step, size in steps:
        if step == "msg":
            pair.initiator.send_msg(number, b"m" * size)
        elif step == "rpy" and unanswered:  # to any of them: later ones wait (are staged)
            pair.listener.send_rpy(number, unanswered.pop(size % len(unanswered)), b"r" * size)
        elif step == "to_listener":
            unanswered += [e.msgno for e in pair.send(pair.initiator)
                           if isinstance(e, MessageReceived)]
        elif step == "to_initiator":
            pair.send(pair.listener)
        for conn in (pair.initiator, pair.listener):
            assert conn.backlog == _queued(conn)
    _, events = pair.pump()
    for msgno in unanswered + [e.msgno for e in events if isinstance(e, MessageReceived)]:
        pair.listener.send_rpy(number, msgno, b"")
    pair.pump()
    assert pair.initiator.backlog == pair.listener.backlog == 0
