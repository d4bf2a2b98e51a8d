"""The fast paths change nothing: each against the general path it shortcuts.

Every fast path of the BEEP core declines what it does not take, and the general path then
decides; so the general path is the definition. Each property here drives the two with the same
input -- valid traffic, traffic with a broken rule, random bytes, in random chunkings -- and
asserts the same frames, events, errors and output bytes at every step:

* frames: `FrameDecoder.next_whole()` (compiled) then `next_frame()`, against `next_frame()`
  alone; and `next_frame()` in any chunking (down to byte by byte) against the stream fed whole;
  `whole_frame_bytes()` (compiled) against `frame_bytes()`, and both against the RFC 3080
  §2.2.1 header spelled by hand;
* MIME: `decode_fields()` (its compiled one-header case) against the general header loop;
  `encode_entity()` (its header cache and one-line shortcut) against `_header_block()`;
* connections: a client and a server with every fast path on, against a pair with all of them
  off (`_general_paths()`: the decoder's and the channel's whole-frame paths, the channel's
  write-at-once path, the compiled header split), for any session of valid, refused, forged and
  random traffic; and each guard of those fast paths, broken alone.

These replaced a frozen copy of the core from before the fast paths (tests/beep/reference),
which had drifted from adapters/beep; the RFC transcripts (test_rfc_examples.py), the
Hypothesis tests of the tables (test_session_machine.py) and the fuzz tests
(test_fuzz_connection.py) hold the general path to the RFCs themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.beep import (
    BeepConfig,
    BeepConnection,
    LocalProtocolError,
    MessageReceived,
    RemoteProtocolError,
    ReplyReceived,
    Role,
    _events,
    _mime,
)
from adapters.beep._channel import Channel
from adapters.beep._config import MAX_NUMBER
from adapters.beep._events import _message_received, _reply_received
from adapters.beep._frames import (
    MAX_SEQNO,
    Frame,
    FrameDecoder,
    FrameType,
    SeqFrame,
    encode_frame,
    frame_bytes,
    whole_frame_bytes,
)
from adapters.beep._mime import (
    _decode_general,
    _header_block,
    decode_entity,
    decode_fields,
    encode_entity,
)

from .helpers import APEX, ECHO

_SETTINGS = settings(max_examples=300, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --- frames ------------------------------------------------------------------------------

# Numbers at the edges the fast header takes (nine digits) and the general one (ten, ranges).
_NUMBER = st.one_of(st.integers(0, 20), st.sampled_from(
    [10**9 - 1, 10**9, 2**31 - 1, 2**31, 10**10 - 1]))
_SEQNO = st.one_of(st.integers(0, 5000), st.sampled_from([2**32 - 1, 2**32, 10**10 - 1]))


def _legal(ftype: str, channel: int, msgno: int, more: bool, seqno: int, size: int,
           ansno: int | None) -> bool:
    """RFC 3080 §2.2.1's ranges and the NUL rule, spelled out apart from `Frame`."""
    numbers = [channel, msgno, size] + ([] if ansno is None else [ansno])
    return (all(0 <= n <= MAX_NUMBER for n in numbers) and 0 <= seqno <= MAX_SEQNO
            and (ftype == "ANS") == (ansno is not None)
            and not (ftype == "NUL" and (more or size)))


@st.composite
def _frame_bytes(draw: st.DrawFn) -> bytes:
    """One frame's wire form, spelled by hand from the RFC 3080 §2.2.1 grammar: mostly well
    formed (and then what `encode_frame` writes too), sometimes with numbers out of range or a
    NUL/ANS rule broken."""
    if draw(st.integers(0, 9)) == 0:
        channel, ackno, window = draw(_NUMBER), draw(_SEQNO), draw(_NUMBER)
        return f"SEQ {channel} {ackno} {window}\r\n".encode()
    ftype = draw(st.sampled_from(["MSG", "RPY", "ERR", "ANS", "NUL"]))
    channel, msgno, seqno = draw(_NUMBER), draw(_NUMBER), draw(_SEQNO)
    more = draw(st.booleans())
    payload = draw(st.binary(max_size=40))
    ansno = draw(_NUMBER) if ftype == "ANS" else None
    if ftype == "NUL" and draw(st.integers(0, 3)):  # mostly keep NUL's rule, to get past it
        more, payload = False, b""
    tail = f" {ansno}" if ansno is not None else ""
    header = f"{ftype} {channel} {msgno} {'*' if more else '.'} {seqno} {len(payload)}{tail}"
    wire = header.encode() + b"\r\n" + payload + b"END\r\n"
    if _legal(ftype, channel, msgno, more, seqno, len(payload), ansno):
        assert wire == encode_frame(Frame(FrameType(ftype), channel, msgno, more, seqno,
                                          payload, ansno))
    return wire


@st.composite
def _stream(draw: st.DrawFn) -> bytes:
    """Frames, then perhaps one corruption: a changed, inserted or deleted octet, or junk."""
    data = bytearray(b"".join(draw(st.lists(_frame_bytes(), max_size=8))))
    mutation = draw(st.sampled_from(["none", "none", "change", "insert", "delete", "junk"]))
    if mutation != "none" and data:
        at = draw(st.integers(0, len(data) - 1))
        if mutation == "change":
            data[at] = draw(st.integers(0, 255))
        elif mutation == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=3))
        elif mutation == "delete":
            del data[at]
    if mutation == "junk":
        data += draw(st.binary(max_size=20))
    return bytes(data)


def _chunks(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _frame_key(frame: Frame | SeqFrame) -> tuple[object, ...]:
    if isinstance(frame, SeqFrame):
        return ("SEQ", frame.channel, frame.ackno, frame.window)
    return (str(frame.type), frame.channel, frame.msgno, frame.more, frame.seqno,
            frame.payload, frame.ansno)


def _decode(decoder: FrameDecoder, chunks: list[bytes], fast: bool, mutable: bool,
            buffered: bool = True) -> list[object]:
    """What a decoder makes of `chunks`, as `receive_data` drives it, the buffered count after
    each chunk and the error's message (if `buffered`), and the error that stopped it (if
    any). `fast`: try
    `next_whole()` first, as the connection does; else `next_frame()` alone."""
    got: list[object] = []
    for chunk in chunks:
        fed: bytes | bytearray = bytearray(chunk) if mutable else chunk
        decoder.feed(fed)  # type: ignore[arg-type]
        if mutable:
            fed[:] = b"#" * len(fed)  # the caller reuses its buffer: nothing may change
        try:
            while True:
                whole = decoder.next_whole() if fast else None
                if whole is not None:
                    ftype, channel, msgno, seqno, payload = whole
                    got.append((str(ftype), channel, msgno, False, seqno, payload, None))
                    continue
                frame = decoder.next_frame()
                if frame is None:
                    break
                got.append(_frame_key(frame))
        except RemoteProtocolError as exc:
            # Fed in pieces, an error may be seen sooner and quote fewer octets: the message
            # is compared where the chunks are the same.
            got.append(("error", exc.message if buffered else "", int(exc.code)))
            return got
        if buffered:
            got.append(("buffered", decoder.buffered))
    return got


@_SETTINGS
@given(st.data(), _stream(), st.sampled_from([1, 8, 40, 65536]), st.booleans())
def test_decoder_fast_path_decodes_as_the_general_path(data: st.DataObject, stream: bytes,
                                                       max_frame_size: int,
                                                       mutable: bool) -> None:
    """`next_whole()` then `next_frame()` give the frames, errors and buffering `next_frame()`
    alone gives, for any frames, corrupted or not, in any chunking."""
    chunks = _chunks(data.draw, stream)
    fast = _decode(FrameDecoder(max_frame_size), chunks, fast=True, mutable=mutable)
    general = _decode(FrameDecoder(max_frame_size), chunks, fast=False, mutable=False)
    assert fast == general


@_SETTINGS
@given(st.data(), _stream(), st.sampled_from([8, 65536]), st.booleans())
def test_any_chunking_decodes_as_the_whole_stream(data: st.DataObject, stream: bytes,
                                                  max_frame_size: int, fast: bool) -> None:
    """The frames and the error (its code) are the same fed byte by byte, in random cuts, or
    whole: decoding depends on the octets alone, never on how the transport cut them."""
    whole = _decode(FrameDecoder(max_frame_size), [stream], fast=fast, mutable=False,
                    buffered=False)
    bytewise = [stream[i : i + 1] for i in range(len(stream))]
    for chunks in (bytewise, _chunks(data.draw, stream)):
        assert _decode(FrameDecoder(max_frame_size), chunks, fast=fast, mutable=False,
                       buffered=False) == whole


# --- MIME ---------------------------------------------------------------------------------

_CONTENT_TYPES = st.one_of(
    st.sampled_from([
        "application/octet-stream", "Application/Octet-Stream", "application/beep+xml",
        'multipart/related; boundary="b1"; type="application/beep+xml"',
        "text/plain; charset=utf-8", "text/plain\tx", " text/plain ", "", "bad\r\nvalue",
        "caf\u00e9", "a" * 24, "application/octet-streaM",
    ]),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x85), max_size=30),
)
_ENCODINGS = st.sampled_from(["binary", "BINARY", "base64", "", "8bit\r\n", "bin\u00e4ry"])


def _outcome(call: Callable[[], object]) -> object:
    try:
        return ("ok", call())
    except (LocalProtocolError, RemoteProtocolError) as exc:
        return ("error", type(exc).__name__, exc.message, int(exc.code), exc.terminate)


@_SETTINGS
@given(st.binary(max_size=50), _CONTENT_TYPES, _ENCODINGS)
def test_encode_entity_as_the_general_path(body: bytes, content_type: str,
                                           encoding: str) -> None:
    """Cached or freshly written, the header block is the general loop's, and bad values fail
    alike; twice in a row (the second from the cache)."""
    for _ in range(2):
        assert _outcome(lambda: encode_entity(body, content_type, encoding)) == \
            _outcome(lambda: _header_block(content_type, encoding) + body)


_HEADER_PIECES = st.sampled_from([
    b"Content-Type:", b"Content-Type: ", b"content-type: ", b"Content-Transfer-Encoding: ",
    b"X-Other: ", b"application/beep+xml", b"multipart/related; boundary=\"b\"", b"\t", b" ",
    b"\r\n", b"\r\n\r\n", b"\r", b"\n", b":", b"\xc3\xa9", b"\x7f", b"body", b"BASE64",
])


@_SETTINGS
@given(st.lists(_HEADER_PIECES, max_size=10), st.binary(max_size=20))
def test_decode_entity_as_the_general_path(pieces: list[bytes], tail: bytes) -> None:
    """Any header block, well formed or not, decodes (or fails) as the general loop says."""
    payload = b"".join(pieces) + tail
    general = _outcome(lambda: _decode_general(payload))
    assert _outcome(lambda: dataclasses.astuple(decode_entity(payload))) == general
    assert _outcome(lambda: decode_fields(payload)) == general


@_SETTINGS
@given(st.text(alphabet=" \t", max_size=3), st.text(alphabet=st.characters(
    min_codepoint=0x1f, max_codepoint=0x80) | st.sampled_from("\t\r\n"), max_size=12),
    st.text(alphabet=" \t", max_size=3), st.sampled_from([b"\r\n\r\n", b"\r\n", b"\n\n"]),
    st.binary(max_size=8))
def test_one_header_entities_decode_as_the_general_path(before: str, value: str, after: str,
                                                        end: bytes, body: bytes) -> None:
    """The one-header case the C takes: blanks around the value, octets just outside the
    allowed range, a block ended wrongly."""
    payload = b"Content-Type:" + (before + value + after).encode("latin-1") + end + body
    assert _outcome(lambda: decode_fields(payload)) == _outcome(lambda: _decode_general(payload))


def test_decode_entity_header_block_limit() -> None:
    """The one-line fast path keeps the 8 KiB header-block bound: the blank line must end
    within it (a block of 8188 octets then CRLF CRLF is the longest)."""
    outcomes = []
    for block in (8187, 8188, 8189, 8190):
        payload = b"Content-Type: " + b"a" * (block - 14) + b"\r\n\r\nbody"
        outcome = _outcome(lambda p=payload: dataclasses.astuple(decode_entity(p)))
        assert outcome == _outcome(lambda p=payload: _decode_general(p))
        assert _outcome(lambda p=payload: decode_fields(p)) == outcome
        outcomes.append(outcome[0])
    assert outcomes == ["ok", "ok", "error", "error"]


# --- events -------------------------------------------------------------------------------


@given(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.text(max_size=20),
       st.binary(max_size=20), st.text(max_size=10))
def test_events_built_from_slots_are_the_constructed_ones(
        channel: int, msgno: int, content_type: str, body: bytes, encoding: str) -> None:
    """The per-message events, put together slot by slot, equal (and hash, print and refuse
    changes like) the ones their constructors make."""
    pairs = [(_message_received(channel, msgno, content_type, body, encoding),
              MessageReceived(channel, msgno, content_type, body, encoding)),
             (_reply_received(channel, msgno, content_type, body),
              ReplyReceived(channel, msgno, content_type, body))]
    for built, made in pairs:
        assert type(built) is type(made)
        assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
        with pytest.raises(dataclasses.FrozenInstanceError):
            built.body = b""  # type: ignore[misc]


# --- connections --------------------------------------------------------------------------

_CONFIGS = st.sampled_from([
    BeepConfig(),
    BeepConfig(window_size=256 * 1024),
    BeepConfig(max_frame_size=100, max_message_size=2000, max_pending_messages=2),
    BeepConfig(window_size=8192, max_frame_size=1500, max_answers_in_progress=2),
    BeepConfig(max_message_size=3000, max_pending_messages=2),
])


def _event_key(event: object) -> tuple[object, ...]:
    return (type(event).__name__, dataclasses.astuple(event))  # type: ignore[call-overload]


def _whole_frame_general(ftype: FrameType, channel: int, msgno: int, seqno: int,
                         payload: bytes) -> bytes:
    return frame_bytes(ftype, channel, msgno, seqno, payload, more=False, ansno=None)


@contextlib.contextmanager
def _general_paths() -> Iterator[None]:
    """Every fast path of the core switched off while the block runs (all of it synchronous):
    each one declines, so the general path does everything. The decoder's `next_whole()` and
    the channel's `receive_whole()` (the received whole frame), the channel's `_frame_now()`
    (a message written at once rather than queued and flushed), and the compiled header split
    and framing."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FrameDecoder, "next_whole", lambda self: None)
        patch.setattr(Channel, "receive_whole", lambda self, *args: False)
        patch.setattr(Channel, "_frame_now", lambda self, *args: False)
        patch.setattr(_events, "decode_fields", _decode_general)
        patch.setattr(_mime, "_content_type_only", None)
        patch.setattr("adapters.beep._channel.whole_frame_bytes", _whole_frame_general)
        yield


class _Side:
    """A client and a server with their fast paths on or off (`general`), and what they
    received and may answer."""

    def __init__(self, config: BeepConfig, *, general: bool) -> None:
        self.general = general
        self.conns = {"client": BeepConnection(Role.INITIATOR, config),
                      "server": BeepConnection(Role.LISTENER, config, [ECHO, APEX])}
        #: Bytes written by one side and not yet delivered to the other.
        self.pipes = {"client": b"", "server": b""}

    def do(self, action: tuple[Any, ...]) -> object:
        """Apply one action; return everything observable about it."""
        with _general_paths() if self.general else contextlib.nullcontext():
            return self._do(action)

    def _do(self, action: tuple[Any, ...]) -> object:
        kind, who, *args = action
        conn = self.conns[who]
        peer = "server" if who == "client" else "client"
        if kind == "deliver":  # move `who`'s output to the peer, in the given cuts
            self.pipes[who] += conn.data_to_send()
            wire, self.pipes[who] = self.pipes[who], b""
            events: list[object] = []
            bounds = [0, *sorted(c % (len(wire) + 1) for c in args[0]), len(wire)]
            for a, b in itertools.pairwise(bounds):
                if b > a:
                    events += [_event_key(e) for e in self.conns[peer].receive_data(wire[a:b])]
            return wire, events, self._state()
        if kind == "inject":  # bytes from nowhere, into `who`
            events = [_event_key(e) for e in conn.receive_data(args[0])]
            return events, self._state()
        if kind == "forge":  # a frame with the seqno `who` expects on a channel, rules varied
            ftype, channel, msgno, more, size, ansno, shift = args
            expected = conn._channels[channel].recv.expected if channel in conn._channels else 0
            header = f"{ftype} {channel} {msgno} {more} {(expected + shift) % 2**32} {size}"
            wire = f"{header}{'' if ansno is None else f' {ansno}'}\r\n".encode() + \
                b"\r\n".ljust(size, b"y")[:size] + b"END\r\n"
            events = [_event_key(e) for e in conn.receive_data(wire)]
            return events, self._state()
        try:
            if kind == "greet":
                result: object = conn.send_greeting()
            elif kind == "send_msg":
                result = conn.send_msg(*args)
            elif kind == "reply":
                method, channel, msgno, body = args
                extra = [] if method == "send_nul" else [body or b""]
                result = getattr(conn, method)(channel, msgno, *extra)
            elif kind == "start":
                result = conn.start_channel([ECHO])
            elif kind == "accept":
                result = conn.accept_start(args[0], ECHO)
            elif kind == "close":
                result = conn.close_channel(args[0])
            else:
                assert kind == "accept_close"
                result = conn.accept_close(args[0])
        except LocalProtocolError as exc:
            result = ("refused", exc.message)
        return result, self._state()

    def _state(self) -> tuple[object, ...]:
        return tuple((c.state.value, c.buffered_bytes, dict(c.channels))
                     for c in self.conns.values())


_WHO = st.sampled_from(["client", "server"])
_BODY = st.one_of(st.binary(max_size=60), st.binary(min_size=1000, max_size=5000))
_USUAL_TYPES = st.sampled_from(["application/beep+xml", "application/octet-stream",
                                'multipart/related; boundary="b1"; type="application/beep+xml"'])
_CUTS = st.lists(st.integers(0, 10**6), max_size=4)


def _action(draw: st.DrawFn, pending: list[tuple[str, int, int]]) -> tuple[Any, ...]:
    """One step. Mostly deliveries and valid commands, so that sessions live long enough for
    pipelining, windows and fragmentation; then commands the protocol refuses, frames forged
    to continue a channel's sequence with one rule broken (or none), and random bytes."""
    roll = draw(st.integers(0, 99))
    who = draw(_WHO)
    if roll < 35:
        return ("deliver", who, draw(_CUTS))
    if roll < 55:
        return ("send_msg", who, draw(st.sampled_from([1, 1, 1, 3])), draw(_BODY),
                draw(_USUAL_TYPES), "binary")
    if roll < 72 and pending:
        target = draw(st.sampled_from(pending))
        method = draw(st.sampled_from(["send_rpy", "send_rpy", "send_err", "send_ans",
                                       "send_nul"]))
        return ("reply", target[0], method, target[1], target[2],
                None if method == "send_nul" else draw(_BODY))
    if roll < 82:
        return draw(st.one_of(
            st.tuples(st.just("send_msg"), _WHO, st.sampled_from([0, 1, 3, 9]), _BODY,
                      _CONTENT_TYPES, _ENCODINGS),
            st.tuples(st.just("reply"), _WHO, st.sampled_from(["send_rpy", "send_nul"]),
                      st.sampled_from([0, 1, 3]), st.integers(0, 5), st.just(None)),
            st.tuples(st.just("start"), st.just("client")),
            st.tuples(st.just("accept"), st.just("server"), st.sampled_from([3, 5])),
            st.tuples(st.just("close"), _WHO, st.sampled_from([1, 3])),
            st.tuples(st.just("accept_close"), _WHO, st.sampled_from([1, 3])),
        ))
    if roll < 97:
        ftype = draw(st.sampled_from(["MSG", "MSG", "MSG", "RPY", "ERR", "ANS", "NUL"]))
        ansno = draw(st.sampled_from([0, 1])) if ftype == "ANS" else \
            draw(st.sampled_from([None] * 9 + [0]))
        return ("forge", who, ftype, draw(st.sampled_from([1, 1, 1, 3, 0])),
                draw(st.integers(0, 8)), draw(st.sampled_from([".", ".", ".", "*"])),
                draw(st.sampled_from([2, 2, 2, 10, 0, 3000, 5000])), ansno,
                draw(st.sampled_from([0] * 9 + [1])))
    return ("inject", who, draw(st.binary(max_size=30)))


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data(), _CONFIGS)
def test_connections_behave_as_the_general_path(data: st.DataObject,
                                                config: BeepConfig) -> None:
    """A client and a server with their fast paths, and a pair without, get the same commands,
    deliveries in the same random cuts, and the same forged or random frames: every result,
    event, output octet and state is the same at every step."""
    new, old = _Side(config, general=False), _Side(config, general=True)
    setup: list[tuple[Any, ...]] = [
        ("greet", "server"), ("greet", "client"),
        ("deliver", "server", []), ("deliver", "client", []),
        ("start", "client"), ("deliver", "client", []), ("accept", "server", 1),
        ("deliver", "server", []),
    ]
    for action in setup:
        assert new.do(action) == old.do(action)
    pending: list[tuple[str, int, int]] = []
    for _ in range(data.draw(st.integers(1, 40))):
        action = _action(data.draw, pending)
        outcome = new.do(action)
        assert outcome == old.do(action), action
        if action[0] == "deliver":  # the peer's MSGs now await its replies
            receiver = "server" if action[1] == "client" else "client"
            pending += [(receiver, fields[0], fields[1]) for name, fields in outcome[1]
                        if name == "MessageReceived"]
        if action[0] == "reply":
            pending = [p for p in pending if p[1:] != (action[3], action[4])]


# Each guard of the fast paths, broken alone (the property above finds these too, by chance;
# here every one is certain). Channel 1 is open and the greetings exchanged unless the case
# says "no greeting"; the server's window is 4096 octets unless the config says otherwise.
def _msg(msgno: int | str, seqno: int, body: bytes, more: str = ".", channel: int = 1) -> bytes:
    payload = b"\r\n" + body
    return f"MSG {channel} {msgno} {more} {seqno} {len(payload)}\r\n".encode() + payload + \
        b"END\r\n"


def _rpy(msgno: int, seqno: int, body: bytes, more: str = ".") -> bytes:
    payload = b"\r\n" + body
    return f"RPY 1 {msgno} {more} {seqno} {len(payload)}\r\n".encode() + payload + b"END\r\n"


_GUARD_CASES: dict[str, tuple[BeepConfig, list[tuple[Any, ...]], str]] = {
    # case: (config, steps after the setup, what the outcome must show)
    "seqno": (BeepConfig(), [("inject", "server", _msg(0, 5, b"a"))],
              "sequence number 5 where 0"),
    "window overrun": (BeepConfig(), [("inject", "server", _msg(0, 0, b"x" * 4200))],
                       "overruns the window"),
    "message size": (BeepConfig(max_message_size=3000),
                     [("inject", "server", _msg(0, 0, b"x" * 3500))],
                     "exceeds the limit of 3000 octets"),
    "msgno reused": (BeepConfig(), [("inject", "server", _msg(0, 0, b"a") + _msg(0, 3, b"b"))],
                     "reuses a message number"),
    "too many pending": (BeepConfig(max_pending_messages=2), [
        ("inject", "server", _msg(0, 0, b"a") + _msg(1, 3, b"b") + _msg(2, 6, b"c"))],
        "more than 2 MSGs pending"),
    "interrupts a message": (BeepConfig(), [
        ("inject", "server", _msg(0, 0, b"a", more="*") + _msg(1, 3, b"b"))],
        "interrupts the unfinished"),
    "continues a message": (BeepConfig(), [
        ("inject", "server", _msg(0, 0, b"a", more="*") + b"MSG 1 0 . 3 1\r\nbEND\r\n")],
        "b'ab'"),
    "channel not open": (BeepConfig(), [("inject", "server", _msg(0, 0, b"a", channel=3))],
                         "channel 3, which is not open"),
    "channel zero": (BeepConfig(), [("forge", "server", "MSG", 0, 5, ".", 10, None, 0)],
                     "channel zero carries application/beep+xml"),
    "no greeting": (BeepConfig(), [("inject", "server", _msg(0, 0, b"a"))],
                    "before the greeting"),
    "ten digits": (BeepConfig(), [("inject", "server", _msg(10**9, 0, b"a"))],
                   "(1, 1000000000, 'application/octet-stream'"),
    "leading zero": (BeepConfig(), [("inject", "server", _msg("01", 0, b"a"))],
                     "invalid header"),
    "frame size": (BeepConfig(max_frame_size=100),
                   [("inject", "server", _msg(0, 0, b"x" * 200))], "exceeds the 100-octet"),
    "bad trailer": (BeepConfig(), [("inject", "server", _msg(0, 0, b"a")[:-2] + b"\n\n")],
                    "END CRLF"),
    "MIME": (BeepConfig(), [("inject", "server", b"MSG 1 0 . 0 3\r\nabcEND\r\n")],
             "no empty line ends"),
    "pipelined, answered out of order": (BeepConfig(), [
        ("inject", "server", b"".join(_msg(i, 3 * i, b"a") for i in range(5))),
        ("reply", "server", "send_rpy", 1, 3, b"3"), ("reply", "server", "send_err", 1, 1, b"1"),
        ("reply", "server", "send_rpy", 1, 0, b"0"), ("reply", "server", "send_nul", 1, 2, None),
        ("reply", "server", "send_rpy", 1, 4, b"4"), ("inject", "client", b"")],
        "0END\\r\\nERR 1 1 . 3 3"),
    "reply never asked": (BeepConfig(), [("inject", "client", _rpy(0, 0, b"a"))],
                          "never sent or is already answered"),
    "reply overtakes": (BeepConfig(), [
        ("send_msg", "client", 1, b"a", "text/plain", "binary"),
        ("send_msg", "client", 1, b"b", "text/plain", "binary"),
        ("inject", "client", _rpy(1, 0, b"a"))], "overtakes"),
    "reply continues": (BeepConfig(), [
        ("send_msg", "client", 1, b"a", "text/plain", "binary"),
        ("inject", "client", _rpy(0, 0, b"a", more="*") + _rpy(0, 3, b"b"))],
        "'ReplyReceived', (1, 0, 'application/octet-stream', b'a\\r\\nb')"),
    "reply to a message half sent": (BeepConfig(), [
        ("send_msg", "client", 1, b"x" * 5000, "text/plain", "binary"),
        ("inject", "client", _rpy(0, 0, b"early")), ("deliver", "client", [])],
        "MSG 1 0 . 4096 0"),  # RFC 3080 §2.6.3: the empty "." frame that ends it
    "reply to a message never sent": (BeepConfig(), [
        # 28 header octets + 4068: the window exactly, so none of the next MSG goes out
        ("send_msg", "client", 1, b"x" * 4068, "text/plain", "binary"),
        ("send_msg", "client", 1, b"y", "text/plain", "binary"),
        ("inject", "client", _rpy(0, 0, b"a") + _rpy(1, 3, b"b"))],
        "reply to message 1, which was never sent"),
    "reply interrupts a message": (BeepConfig(), [
        ("send_msg", "client", 1, b"a", "text/plain", "binary"),
        ("inject", "client", _msg(0, 0, b"a", more="*") + _rpy(0, 3, b"b"))],
        "RPY 0 interrupts the unfinished MSG 0"),
    "NUL behind a reply the window holds back": (BeepConfig(), [
        ("inject", "server", _msg(0, 0, b"a") + _msg(1, 3, b"b")),
        ("reply", "server", "send_rpy", 1, 0, b"x" * 5000),
        ("reply", "server", "send_nul", 1, 1, None)], "RPY 1 0 * 0 4096"),
    "reply window": (BeepConfig(), [
        ("send_msg", "client", 1, b"a", "text/plain", "binary"),
        ("inject", "client", _rpy(0, 0, b"x" * 4200))], "overruns the window"),
}


@pytest.mark.parametrize("case", sorted(_GUARD_CASES))
def test_each_fast_path_guard_as_the_general_path(case: str) -> None:
    """Every check the fast paths make, failing alone, gives the general path's events and
    bytes."""
    config, steps, expected = _GUARD_CASES[case]
    new, old = _Side(config, general=False), _Side(config, general=True)
    setup: list[tuple[Any, ...]] = [("greet", "server"), ("greet", "client"),
                                    ("deliver", "server", [])]
    if case != "no greeting":
        setup += [("deliver", "client", []), ("start", "client"), ("deliver", "client", []),
                  ("accept", "server", 1), ("deliver", "server", [])]
    for action in setup:
        assert new.do(action) == old.do(action)
    outcomes = []
    for action in [*steps, ("deliver", "server", []), ("deliver", "client", [])]:
        outcome = new.do(action)
        assert outcome == old.do(action), (case, action)
        outcomes.append(outcome)
    assert expected in repr(outcomes)  # the case tests what it says


@_SETTINGS
@given(st.sampled_from([FrameType.MSG, FrameType.RPY, FrameType.ERR, FrameType.NUL]),
       _NUMBER, _NUMBER, _SEQNO, st.binary(max_size=300))
def test_whole_frames_are_written_as_the_general_path(ftype: FrameType, channel: int,
                                                      msgno: int, seqno: int,
                                                      payload: bytes) -> None:
    """The compiled framing of a whole message writes the octets the general `frame_bytes`
    writes, which are RFC 3080 §2.2.1's header spelled by hand, the payload and the trailer."""
    wire = whole_frame_bytes(ftype, channel, msgno, seqno, payload)
    assert wire == frame_bytes(ftype, channel, msgno, seqno, payload, more=False, ansno=None)
    assert wire == f"{ftype} {channel} {msgno} . {seqno} {len(payload)}\r\n".encode() + \
        payload + b"END\r\n"
