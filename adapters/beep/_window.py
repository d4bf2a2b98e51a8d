"""SEQ flow control arithmetic alone (RFC 3081 §3.1), one pair of windows per channel.

Theory of operation
-------------------
Every payload octet on a channel has a sequence number, counted from 0 when the channel is created
and wrapping modulo 2**32 (RFC 3080 §2.2.1.2). Each direction has a window: the peer may send
octets up to, but not including, `ackno + window` from its latest SEQ frame; before any SEQ the
window is 4096 (RFC 3081 §3.1.1). This module is the h2 `WindowManager` analogue: integers in,
integers out, no frames, no I/O.

`ReceiveWindow` checks each incoming frame -- its seqno must be exactly the next expected one
(RFC 3080 §2.2.1.2: otherwise "the BEEP peers have lost synchronization" and the session is
terminated) and its payload must fit in what we advertised (a window overrun is a poorly formed
frame) -- and decides when a SEQ is due. RFC 3081 §3.1.4 asks for a SEQ "whenever the window size
that will be sent is at least one half of the buffer space available to this channel"; read
literally that is every frame, so like the other implementations we send one when at least half
of the buffer has been consumed since the last advertisement, which also consolidates the SEQs
of a burst of small frames.

`SendWindow` honours the peer's advertisements: `take()` hands out the seqno and the size of the
next fragment so that a frame never exceeds the remaining window nor the maximum frame size
(RFC 3081 §3.1.2, first choice: "segment the message"). SEQ frames are validated: acknowledging
an octet we never sent, or moving the acknowledgement backwards, is "invalid" and terminates the
session (RFC 3081 §3.1.3). A shrinking window (RFC 1122 §4.2.2.16 says a receiver SHOULD NOT) is
honoured, never trusted to be wider than it is.
"""

from __future__ import annotations

from common.errors import ReplyCode

from ._config import DEFAULT_WINDOW_SIZE
from ._errors import RemoteProtocolError

__all__ = ["INITIAL_WINDOW", "SEQNO_MODULUS", "ReceiveWindow", "SendWindow", "serial_distance"]

#: RFC 3080 §2.2.1.2: "all arithmetic dealing with sequence numbers is performed modulo 2**32".
SEQNO_MODULUS = 2**32
#: RFC 3081 §3.1.1: the window of every new channel, before any SEQ frame.
INITIAL_WINDOW = DEFAULT_WINDOW_SIZE
_HALF = SEQNO_MODULUS // 2


def serial_distance(start: int, end: int) -> int:
    """How far `end` is ahead of `start`, modulo 2**32 (RFC 1982 serial arithmetic)."""
    return (end - start) % SEQNO_MODULUS


class ReceiveWindow:
    """Our side of one channel's inbound flow: what we expect and what we have advertised."""

    __slots__ = ("_half", "expected", "remaining", "size")

    def __init__(self, size: int = DEFAULT_WINDOW_SIZE) -> None:
        #: The buffer space we allot to the channel; what each SEQ advertises.
        self.size = size
        self._half = size // 2
        #: Sequence number of the next octet we expect (the ackno of our next SEQ).
        self.expected = 0
        #: Octets the peer may still send before our next SEQ. Kept as a count rather than as
        #: the right edge because every frame reads it: no modular arithmetic per frame. It never
        #: goes negative (an overrun is refused), so it is the serial distance to the edge.
        self.remaining = INITIAL_WINDOW

    def receive(self, seqno: int, size: int) -> None:
        """Account for an incoming frame of `size` payload octets starting at `seqno`.

        Raises:
            RemoteProtocolError: out-of-sequence frame or window overrun (terminate).
        """
        if seqno != self.expected:
            raise RemoteProtocolError(
                f"sequence number {seqno} where {self.expected} was expected (RFC 3080 §2.2.1.2)",
                code=ReplyCode.SYNTAX_ERROR,
            )
        if size > self.remaining:
            raise RemoteProtocolError(
                f"frame of {size} octets overruns the window ({self.remaining} left,"
                " RFC 3081 §3.1)",
                code=ReplyCode.TRANSACTION_FAILED,
            )
        self.expected = (seqno + size) % SEQNO_MODULUS
        self.remaining -= size

    def update_due(self) -> tuple[int, int] | None:
        """`(ackno, window)` for a SEQ frame if one is due now (and record it as sent).

        With a buffer larger than the initial 4096 this is due at once, which is how a bigger
        window is announced after channel creation (RFC 3081 §3.1.1).
        """
        if self.remaining > self._half:
            return None
        self.remaining = self.size
        return self.expected, self.size


class SendWindow:
    """Our side of one channel's outbound flow: what we sent and what the peer allows."""

    __slots__ = ("_acked", "_edge", "next_seqno")

    def __init__(self) -> None:
        #: Sequence number of the next octet we send.
        self.next_seqno = 0
        self._acked = 0
        self._edge = INITIAL_WINDOW

    @property
    def available(self) -> int:
        """Octets we may send now; 0 if the peer shrank its window behind what we sent."""
        ahead = serial_distance(self.next_seqno, self._edge)
        return 0 if ahead >= _HALF else ahead

    def on_seq(self, ackno: int, window: int) -> None:
        """Apply a SEQ frame from the peer.

        Raises:
            RemoteProtocolError: the acknowledgement is behind the previous one or ahead of
                what we sent (RFC 3081 §3.1.3: "invalid", terminate).
        """
        sent = serial_distance(self._acked, self.next_seqno)
        acked = serial_distance(self._acked, ackno)
        if acked > sent:
            raise RemoteProtocolError(
                f"SEQ acknowledges {ackno}, outside {self._acked}..{self.next_seqno}"
                " (RFC 3081 §3.1.3)",
                code=ReplyCode.PARAMETER_SYNTAX_ERROR,
            )
        self._acked = ackno
        self._edge = (ackno + window) % SEQNO_MODULUS

    def take_whole(self, size: int, max_frame_size: int) -> int | None:
        """`take(size, max_frame_size)` if it would grant all of `size`: the seqno. Else None,
        reserving nothing (a message that does not fit whole is queued and cut by `take()`)."""
        if size > max_frame_size:
            return None
        seqno = self.next_seqno
        if size:  # an empty fragment needs no window
            available = (self._edge - seqno) % SEQNO_MODULUS
            if available >= _HALF or size > available:
                return None
        self.next_seqno = (seqno + size) % SEQNO_MODULUS
        return seqno

    def take(self, wanted: int, max_frame_size: int) -> tuple[int, int] | None:
        """Reserve the next fragment: `(seqno, size)`, or None if the window is closed.

        `size` is `min(wanted, available, max_frame_size)`; an empty fragment (a NUL, or the
        empty final "." frame of RFC 3080 §2.6.3) needs no window and is always granted.
        """
        # `available`, inlined: this runs for every frame we send.
        size = (self._edge - self.next_seqno) % SEQNO_MODULUS
        if size >= _HALF:
            size = 0
        # min(wanted, available, max_frame_size), without the call
        size = wanted if wanted < size else size
        size = max_frame_size if max_frame_size < size else size
        if size == 0 and wanted > 0:
            return None
        seqno = self.next_seqno
        self.next_seqno = (seqno + size) % SEQNO_MODULUS
        return seqno, size
