"""Bytes <-> frames: the RFC 3080 §2.2.1 data frames and the RFC 3081 §3.1.3 SEQ frame.

Theory of operation
-------------------
`FrameDecoder` owns the receive buffer. `feed()` appends bytes; `next_frame()` returns one
`Frame` or `SeqFrame`, or None when it needs more bytes (h11's reader convention). It never
returns a partial frame and never copies the buffer per call: it keeps a read position and compacts
only when it runs dry, so a burst of frames is decoded in linear time. When it has run dry, `feed()`
adopts the caller's bytes object instead of copying it, so each payload is one slice of what the
transport read; only a frame left incomplete is copied, into a growing bytearray.

The common frame -- a whole message in one frame: a "." MSG, RPY or ERR, payload and trailer
already buffered -- has a fast path, `next_whole()`, compiled (`scan_whole` in `_speedups.c`): it
reads a header that cannot be anything else (channel, msgno and size of at most nine digits,
so below 2**31 with no range check), checks the seqno, the size limit and the trailer, and
returns a plain tuple (a `Frame` costs more to build than the parse). Anything else, or anything
wrong with such a frame, makes it return None having consumed nothing, and `next_frame()` then
decodes the same octets and raises the error, so every rule below is enforced in exactly one
place. Where the C is not built (no compiler, `APEXPS_PURE_PYTHON=1`) `next_whole()` always
declines and every frame takes `next_frame()`; tests/beep/test_fast_paths.py holds the two to
the same frames, errors and buffering on arbitrary input in any chunking. Writing is the same:
`frame_bytes()` is the definition, `whole_frame_bytes()` its compiled twin for a whole message.

The header grammar is exact (RFC 3080 §2.2.1):

    common  = channel SP msgno SP more SP seqno SP size
    channel, msgno, size, ansno = 0..2147483647     seqno, ackno = 0..4294967295

One space between components, CRLF at the end, decimal digits only (no sign). Numbers with
leading zeros are refused: the RFC writes the ranges as values, and a canonical form keeps the
longest legal header at `MAX_HEADER_LENGTH` octets, which is what bounds the buffer while a
header is incomplete. (RFC 3080's text gives ansno the range 0..4294967295 while its ABNF says
0..2147483647; we follow the ABNF.)

Memory is bounded: a header longer than `MAX_HEADER_LENGTH` or a declared size above
`max_frame_size` is refused as soon as it is seen, before any payload is buffered. After the
caller has drained `next_frame()`, at most one incomplete frame stays buffered, i.e.
`MAX_HEADER_LENGTH + max_frame_size + len(TRAILER)` octets.

Every violation raises `RemoteProtocolError` with `terminate=True`: RFC 3080 §2.2.1.1 ("if a frame
is poorly-formed, then the session is terminated without generating a response") and §2.2.1.3 (bad
trailer), RFC 3081 §3.1.3 (bad SEQ). Semantic checks that need channel state (seqno continuity,
msgno rules) live in `_channel.py`; this module checks only what one frame says about itself,
including the NUL rule ("." and size zero).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from adapters import speedups
from common.errors import ReplyCode

from ._config import DEFAULT_MAX_FRAME_SIZE, MAX_NUMBER
from ._errors import RemoteProtocolError

__all__ = [
    "MAX_HEADER_LENGTH",
    "MAX_SEQNO",
    "TRAILER",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "SeqFrame",
    "Whole",
    "encode_frame",
    "encode_seq",
    "frame_bytes",
    "whole_frame_bytes",
]

#: Largest sequence and acknowledgement number (RFC 3080 §2.2.1.2: arithmetic is modulo 2**32).
MAX_SEQNO = 2**32 - 1
#: RFC 3080 §2.2.1.3: "END" followed by a CRLF pair.
TRAILER = b"END\r\n"
#: "ANS" + six space-separated 10-digit numbers/indicators + CRLF: the longest legal header line.
MAX_HEADER_LENGTH = 3 + 6 * (1 + 10) + 2


class FrameType(StrEnum):
    """The data-frame keywords of RFC 3080 §2.2.1.1."""

    #: A message starting an exchange (client role).
    MSG = "MSG"
    #: A positive reply: the one-to-one exchange succeeded.
    RPY = "RPY"
    #: A negative reply: the server did not perform the task.
    ERR = "ERR"
    #: One answer of a one-to-many exchange; carries an answer number.
    ANS = "ANS"
    #: End of a one-to-many reply; always complete (".") and empty.
    NUL = "NUL"


@dataclass(frozen=True, slots=True)
class Frame:
    """One data frame (RFC 3080 §2.2.1). `more` is True for "*" (intermediate), False for "."."""

    type: FrameType
    channel: int
    msgno: int
    more: bool
    seqno: int
    payload: bytes = b""
    #: Only for ANS frames (None otherwise).
    ansno: int | None = None

    def __post_init__(self) -> None:
        if not (0 <= self.channel <= MAX_NUMBER and 0 <= self.msgno <= MAX_NUMBER):
            raise ValueError("channel and msgno must be in 0..2147483647")
        if not 0 <= self.seqno <= MAX_SEQNO:
            raise ValueError("seqno must be in 0..4294967295")
        if len(self.payload) > MAX_NUMBER:
            raise ValueError("payload longer than 2147483647 octets")
        if (self.type is FrameType.ANS) != (self.ansno is not None):
            raise ValueError("ansno is required on ANS frames and forbidden on the others")
        if self.ansno is not None and not 0 <= self.ansno <= MAX_NUMBER:
            raise ValueError("ansno must be in 0..2147483647")
        if self.type is FrameType.NUL and (self.more or self.payload):
            raise ValueError("a NUL frame is complete and empty (RFC 3080 §2.2.1.1)")

    @property
    def size(self) -> int:
        return len(self.payload)


@dataclass(frozen=True, slots=True)
class SeqFrame:
    """A window update (RFC 3081 §3.1.3): the peer expects `window` octets from `ackno` on."""

    channel: int
    ackno: int
    window: int

    def __post_init__(self) -> None:
        if not 0 <= self.channel <= MAX_NUMBER:
            raise ValueError("channel must be in 0..2147483647")
        if not 0 <= self.ackno <= MAX_SEQNO:
            raise ValueError("ackno must be in 0..4294967295")
        if not 0 <= self.window <= MAX_NUMBER:
            raise ValueError("window must be in 0..2147483647")


#: `(type, channel, msgno, seqno, payload)` of a whole message in one frame: what
#: `FrameDecoder.next_whole()` returns, already checked like a `Frame` (and "." implied).
Whole = tuple[FrameType, int, int, int, bytes]


def encode_frame(frame: Frame) -> bytes:
    """The wire form of a data frame: header, payload, trailer."""
    return frame_bytes(frame.type, frame.channel, frame.msgno, frame.seqno, frame.payload,
                       more=frame.more, ansno=frame.ansno)


def frame_bytes(ftype: FrameType, channel: int, msgno: int, seqno: int, payload: bytes, *,
                more: bool, ansno: int | None) -> bytes:
    """`encode_frame()` without building a `Frame`: for a sender whose values are valid by
    construction (a channel's own numbering and window), which would pay for checks that can't
    fail. The header is one bytes formatting and the frame one join: the payload is copied once."""
    keyword = _KEYWORD_BYTES[ftype]
    if ansno is None:
        header = b"%s %d %d %s %d %d\r\n" % (keyword, channel, msgno, b"*" if more else b".",
                                              seqno, len(payload))
    else:
        header = b"%s %d %d %s %d %d %d\r\n" % (keyword, channel, msgno, b"*" if more else b".",
                                                 seqno, len(payload), ansno)
    return b"".join((header, payload, TRAILER))


def whole_frame_bytes(ftype: FrameType, channel: int, msgno: int, seqno: int,
                      payload: bytes) -> bytes:
    """`frame_bytes()` of a "." frame without an answer number: a whole MSG, RPY, ERR or NUL,
    the frame nearly every message is sent as; compiled where the C is built."""
    if _whole_frame is not None and type(payload) is bytes:
        return _whole_frame(_KEYWORD_BYTES[ftype], channel, msgno, seqno, payload)
    return frame_bytes(ftype, channel, msgno, seqno, payload, more=False, ansno=None)


def encode_seq(seq: SeqFrame) -> bytes:
    """The wire form of a SEQ frame (RFC 3081 §3.1.3); it has no payload and no trailer."""
    return f"SEQ {seq.channel} {seq.ackno} {seq.window}\r\n".encode("ascii")


_NUM = rb"(0|[1-9][0-9]{0,9})"
_DATA_HEADER = re.compile(
    rb"(MSG|RPY|ERR|ANS|NUL) " + _NUM + b" " + _NUM + rb" ([.*]) " + _NUM + b" " + _NUM
    + rb"(?: " + _NUM + rb")?\r\n"
)
_SEQ_HEADER = re.compile(rb"SEQ " + _NUM + b" " + _NUM + b" " + _NUM + rb"\r\n")
_KEYWORDS = (b"MSG ", b"RPY ", b"ERR ", b"ANS ", b"NUL ", b"SEQ ")
_TYPES = {t.value.encode("ascii"): t for t in FrameType}
_KEYWORD_BYTES = {t: k for k, t in _TYPES.items()}
_WHOLE_TYPES = (FrameType.MSG, FrameType.RPY, FrameType.ERR)
# The C twins (None if not built): `whole_frame(keyword, channel, msgno, seqno, payload)` of
# `whole_frame_bytes`, `scan_whole(buf, pos, max_frame_size, types)` of `next_whole`'s parse.
_c = speedups.load("adapters.beep._speedups")
_whole_frame: Callable[[bytes, int, int, int, bytes], bytes] | None = \
    _c.whole_frame if _c is not None else None
_scan_whole: Callable[[bytes | bytearray, int, int, tuple[FrameType, ...]],
                      tuple[FrameType, int, int, int, bytes, int] | None] | None = \
    _c.scan_whole if _c is not None else None


def _poorly_formed(text: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"poorly-formed frame: {text}", code=ReplyCode.SYNTAX_ERROR)


class FrameDecoder:
    """Incremental decoder: `feed(bytes)`, then `next_frame()` until it returns None."""

    __slots__ = ("_buffer", "_pos", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        # bytes while it holds one adopted read; a bytearray once an incomplete frame waits for
        # more (see the module docstring).
        self._buffer: bytes | bytearray = b""
        self._pos = 0

    @property
    def buffered(self) -> int:
        """Octets received and not yet returned as frames."""
        return len(self._buffer) - self._pos

    def feed(self, data: bytes) -> None:
        buf = self._buffer
        if self._pos == len(buf):
            # Nothing pending: adopt the read itself (`bytes()` of a bytes object is that
            # object; anything mutable is copied once, so the caller may reuse it).
            self._buffer = bytes(data)
            self._pos = 0
        elif isinstance(buf, bytes):
            self._buffer = bytearray(buf[self._pos :]) + data
            self._pos = 0
        else:
            buf += data

    def take_buffer(self) -> bytes:
        """Remove and return whatever is buffered (after a tuning reset it is not BEEP any more)."""
        rest = bytes(self._buffer[self._pos :])
        self._buffer = b""
        self._pos = 0
        return rest

    def next_whole(self) -> Whole | None:
        """The next frame if it is a whole message -- a "." MSG, RPY or ERR, completely buffered
        and well formed -- as `(type, channel, msgno, seqno, payload)`; else None, having
        consumed nothing: call `next_frame()`, which decodes it or says what is wrong. Always
        None where the C twin is not built."""
        if _scan_whole is None:
            return None
        got = _scan_whole(self._buffer, self._pos, self.max_frame_size, _WHOLE_TYPES)
        if got is None:
            return None
        self._pos = got[5]
        return got[:5]

    def next_frame(self) -> Frame | SeqFrame | None:
        """The next complete frame, or None if more bytes are needed.

        Raises:
            RemoteProtocolError: the bytes are not a well-formed frame (always `terminate=True`).
        """
        buf, pos = self._buffer, self._pos
        if pos == len(buf):
            self._buffer = b""  # drained: let `feed()` adopt the next read
            self._pos = 0
            return None
        end = buf.find(b"\r\n", pos, pos + MAX_HEADER_LENGTH)
        if end < 0:
            self._check_partial_header()
            self._compact()
            return None
        line_end = end + 2
        if buf.startswith(b"SEQ ", pos):
            match = _SEQ_HEADER.fullmatch(buf, pos, line_end)
            if match is None:
                raise _poorly_formed(f"invalid SEQ header {bytes(buf[pos:end])[:80]!r}")
            channel, ackno, window = (int(g) for g in match.groups())
            if channel > MAX_NUMBER or ackno > MAX_SEQNO or window > MAX_NUMBER:
                raise _poorly_formed("SEQ parameter out of range")
            self._pos = line_end
            return SeqFrame(channel, ackno, window)
        match = _DATA_HEADER.fullmatch(buf, pos, line_end)
        if match is None:
            raise _poorly_formed(f"invalid header {bytes(buf[pos:end])[:80]!r}")
        keyword, channel_s, msgno_s, more_s, seqno_s, size_s, ansno_s = match.groups()
        ftype = _TYPES[keyword]
        channel, msgno, seqno, size = int(channel_s), int(msgno_s), int(seqno_s), int(size_s)
        if channel > MAX_NUMBER or msgno > MAX_NUMBER or size > MAX_NUMBER or seqno > MAX_SEQNO:
            raise _poorly_formed("header parameter out of range")
        ansno: int | None = None
        if ftype is FrameType.ANS:
            if ansno_s is None:
                raise _poorly_formed("ANS frame without an answer number")
            ansno = int(ansno_s)
            if ansno > MAX_NUMBER:
                raise _poorly_formed("answer number out of range")
        elif ansno_s is not None:
            raise _poorly_formed(f"{ftype} frame with an answer number")
        more = more_s == b"*"
        if ftype is FrameType.NUL and (more or size):
            raise _poorly_formed("NUL frame must be complete and empty")
        if size > self.max_frame_size:
            # Refused before a single payload octet is buffered (the "size 100000000" attack).
            raise RemoteProtocolError(
                f"frame of {size} octets exceeds the {self.max_frame_size}-octet limit",
                code=ReplyCode.TRANSACTION_FAILED,
            )
        trailer_at = line_end + size
        if len(buf) < trailer_at + len(TRAILER):
            self._check_partial_trailer(trailer_at)
            self._compact()
            return None
        if not buf.startswith(TRAILER, trailer_at):
            raise _poorly_formed("payload not followed by END CRLF (size mismatch or bad trailer)")
        payload = bytes(buf[line_end:trailer_at])
        self._pos = trailer_at + len(TRAILER)
        return Frame(ftype, channel, msgno, more, seqno, payload, ansno)

    def _check_partial_header(self) -> None:
        # Fail fast on a header that can never become legal, rather than wait for 71 octets.
        available = len(self._buffer) - self._pos
        if available >= MAX_HEADER_LENGTH:
            raise _poorly_formed(f"no CRLF within {MAX_HEADER_LENGTH} octets of a header")
        head = bytes(self._buffer[self._pos : self._pos + 4])
        if head and not any(k.startswith(head) for k in _KEYWORDS):
            raise _poorly_formed(f"header does not start with a frame keyword: {head!r}")

    def _check_partial_trailer(self, trailer_at: int) -> None:
        got = bytes(self._buffer[trailer_at : trailer_at + len(TRAILER)])
        if got and not TRAILER.startswith(got):
            raise _poorly_formed("payload not followed by END CRLF (size mismatch or bad trailer)")

    def _compact(self) -> None:
        # An incomplete frame stays; it moves into a bytearray that later reads extend in place.
        buf = self._buffer
        if isinstance(buf, bytes):
            self._buffer = bytearray(buf[self._pos :])
            self._pos = 0
        elif self._pos:
            del buf[: self._pos]
            self._pos = 0
