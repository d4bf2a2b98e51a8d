"""The frame codec: exact grammar, limits, byte-at-a-time decoding, and fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.beep import Frame, FrameDecoder, FrameType, RemoteProtocolError, SeqFrame
from adapters.beep._frames import MAX_HEADER_LENGTH, TRAILER, encode_frame, encode_seq


def decode_all(data: bytes, bytewise: bool = False, max_frame_size: int = 65536) -> list[object]:
    """Decode every frame in `data`, fed whole or one byte at a time."""
    decoder = FrameDecoder(max_frame_size)
    frames: list[object] = []
    chunks = [data[i : i + 1] for i in range(len(data))] if bytewise else [data]
    for chunk in chunks:
        decoder.feed(chunk)
        while (frame := decoder.next_frame()) is not None:
            frames.append(frame)
    assert decoder.buffered == 0
    return frames


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
class TestDecoder:
    def test_rfc_empty_payload_frames(self, bytewise: bool) -> None:
        """RFC 3080 §2.2.1.1's "RPY 0 1 * 287 20" then "RPY 0 1 . 307 0" decode exactly."""
        data = b"RPY 0 1 * 287 20\r\n" + b"x" * 20 + b"END\r\nRPY 0 1 . 307 0\r\nEND\r\n"
        assert decode_all(data, bytewise) == [
            Frame(FrameType.RPY, 0, 1, True, 287, b"x" * 20),
            Frame(FrameType.RPY, 0, 1, False, 307, b""),
        ]

    def test_rfc_interleaved_answers(self, bytewise: bool) -> None:
        """RFC 3080 §2.2.1.1's three interleaved ANS frames carry their answer numbers."""
        data = (b"ANS 1 0 * 0 20 0\r\n" + b"a" * 20 + b"END\r\n"
                b"ANS 1 0 * 20 20 1\r\n" + b"b" * 20 + b"END\r\n"
                b"ANS 1 0 . 40 10 0\r\n" + b"c" * 10 + b"END\r\n")
        frames = decode_all(data, bytewise)
        assert [(f.ansno, f.seqno, f.more) for f in frames] == [  # type: ignore[attr-defined]
            (0, 0, True), (1, 20, True), (0, 40, False)]

    def test_seq_and_extremes(self, bytewise: bool) -> None:
        """SEQ frames and the largest legal numbers of every field decode."""
        data = (b"SEQ 2147483647 4294967295 2147483647\r\n"
                b"MSG 2147483647 2147483647 . 4294967295 0\r\nEND\r\n")
        assert decode_all(data, bytewise) == [
            SeqFrame(2**31 - 1, 2**32 - 1, 2**31 - 1),
            Frame(FrameType.MSG, 2**31 - 1, 2**31 - 1, False, 2**32 - 1, b""),
        ]


@pytest.mark.parametrize(
    "data",
    [
        b"MSG 0 1 . 0 3\r\nabcEND\n",  # bad trailer
        b"MSG 0 1 . 0 3\r\nabcdEND\r\n",  # size smaller than the payload
        b"MSG 0 1 . 0 5\r\nabcEND\r\nXX",  # size larger than the payload
        b"MSG  0 1 . 0 0\r\nEND\r\n",  # two spaces
        b"MSG 0 1 . 0 0 \r\nEND\r\n",  # trailing space
        b"MSG 0 1 . 0 0\nEND\r\n",  # LF only
        b"MSG +0 1 . 0 0\r\nEND\r\n",  # sign
        b"MSG 00 1 . 0 0\r\nEND\r\n",  # leading zero
        b"MSG 2147483648 1 . 0 0\r\nEND\r\n",  # channel out of range
        b"MSG 0 2147483648 . 0 0\r\nEND\r\n",  # msgno out of range
        b"MSG 0 1 . 4294967296 0\r\nEND\r\n",  # seqno out of range
        b"MSG 0 1 - 0 0\r\nEND\r\n",  # bad continuation indicator
        b"MSG 0 1 . 0 0 7\r\nEND\r\n",  # ansno on a MSG
        b"ANS 1 0 . 0 0\r\nEND\r\n",  # ANS without ansno
        b"ANS 1 0 . 0 0 2147483648\r\nEND\r\n",  # ansno out of range
        b"NUL 1 0 * 0 0\r\nEND\r\n",  # intermediate NUL
        b"NUL 1 0 . 0 1\r\nxEND\r\n",  # NUL with payload
        b"msg 0 1 . 0 0\r\nEND\r\n",  # lower-case keyword
        b"FOO 0 1 . 0 0\r\nEND\r\n",  # unknown keyword
        b"SEQ 0 0\r\n",  # SEQ missing the window
        b"SEQ 0 4294967296 0\r\n",  # ackno out of range
        b"SEQ 0 0 2147483648\r\n",  # window out of range
        b"MSG 0 1 . 0 0" + b"0" * MAX_HEADER_LENGTH,  # endless header
    ],
)
def test_poorly_formed_frames_terminate(data: bytes) -> None:
    """Each poorly-formed frame raises a RemoteProtocolError that terminates the session."""
    decoder = FrameDecoder()
    decoder.feed(data)
    with pytest.raises(RemoteProtocolError) as info:
        while decoder.next_frame() is not None:
            pass
    assert info.value.terminate


def test_huge_declared_size_refused_before_buffering() -> None:
    """A header declaring 100 MB is refused at once, with nothing of the payload awaited."""
    decoder = FrameDecoder(max_frame_size=65536)
    decoder.feed(b"MSG 1 0 . 0 100000000\r\n")
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.terminate and int(info.value.code) == 554


def test_garbage_keyword_fails_fast() -> None:
    """Four bytes that cannot start any frame are refused without waiting for a CRLF."""
    decoder = FrameDecoder()
    decoder.feed(b"GET ")
    with pytest.raises(RemoteProtocolError):
        decoder.next_frame()


@pytest.mark.parametrize(
    ("frame", "wire"),
    [
        (Frame(FrameType.MSG, 0, 1, False, 52, b"hi"), b"MSG 0 1 . 52 2\r\nhiEND\r\n"),
        (Frame(FrameType.ANS, 1, 0, True, 20, b"", 1), b"ANS 1 0 * 20 0 1\r\nEND\r\n"),
        (Frame(FrameType.NUL, 1, 0, False, 50), b"NUL 1 0 . 50 0\r\nEND\r\n"),
        (SeqFrame(1, 4096, 4096), b"SEQ 1 4096 4096\r\n"),
    ],
)
def test_encoding_table(frame: Frame | SeqFrame, wire: bytes) -> None:
    """Encoding gives the exact RFC 3080 §2.2.1 / RFC 3081 §3.1.3 bytes, and decodes back."""
    encoded = encode_seq(frame) if isinstance(frame, SeqFrame) else encode_frame(frame)
    assert encoded == wire
    assert decode_all(wire) == [frame]


def test_frame_constructor_validates() -> None:
    """Frames that could not be encoded legally cannot be built."""
    with pytest.raises(ValueError, match="ansno"):
        Frame(FrameType.ANS, 1, 0, False, 0)
    with pytest.raises(ValueError, match="NUL"):
        Frame(FrameType.NUL, 1, 0, True, 0)
    with pytest.raises(ValueError, match="seqno"):
        Frame(FrameType.MSG, 1, 0, False, 2**32)


frames_strategy = st.builds(
    Frame,
    type=st.sampled_from([FrameType.MSG, FrameType.RPY, FrameType.ERR]),
    channel=st.integers(0, 2**31 - 1),
    msgno=st.integers(0, 2**31 - 1),
    more=st.booleans(),
    seqno=st.integers(0, 2**32 - 1),
    payload=st.binary(max_size=64),
)


@given(st.lists(frames_strategy, max_size=5), st.integers(1, 50))
def test_roundtrip_any_chunking(frames: list[Frame], chunk: int) -> None:
    """Any frames, encoded and fed in any chunk size, decode to themselves."""
    data = b"".join(encode_frame(f) for f in frames)
    decoder = FrameDecoder()
    out = []
    for i in range(0, len(data), chunk):
        decoder.feed(data[i : i + chunk])
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    assert out == frames


_PIECES = st.sampled_from([
    b"MSG ", b"RPY ", b"ANS ", b"NUL ", b"SEQ ", b"ERR ", b"0 ", b"1 ", b". ", b"* ", b"7",
    b"4294967295", b"\r\n", b"END\r\n", b"END", b"\r", b" ", b"x", b"99999999999",
])


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_PIECES, st.binary(max_size=8)), max_size=30), st.integers(1, 16))
def test_fuzz_any_bytes_parse_or_fail_cleanly(pieces: list[bytes], chunk: int) -> None:
    """Any byte stream yields frames or a RemoteProtocolError, never another exception, and the
    buffer never holds more than one frame's worth."""
    max_frame = 32
    data = b"".join(pieces)
    decoder = FrameDecoder(max_frame_size=max_frame)
    try:
        for i in range(0, len(data), chunk):
            decoder.feed(data[i : i + chunk])
            while decoder.next_frame() is not None:
                pass
            assert decoder.buffered <= MAX_HEADER_LENGTH + max_frame + len(TRAILER)
    except RemoteProtocolError as exc:
        assert exc.terminate
