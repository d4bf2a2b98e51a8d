"""Hypothesis against the facade: no input makes receive_data raise or hoard memory."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.beep import BeepConfig, ProtocolViolation, SessionState
from adapters.beep._frames import MAX_HEADER_LENGTH, TRAILER

from .helpers import ECHO, ConnectionPair

_CONFIG = BeepConfig(max_frame_size=256, max_message_size=1024)

_FRAGMENTS = st.sampled_from([
    b"MSG 1 0 . 0 3\r\n\r\nxEND\r\n", b"MSG 1 0 * 0 3\r\n\r\nxEND\r\n",
    b"RPY 1 0 . 0 2\r\n\r\nEND\r\n",
    b"ANS 1 0 * 0 2 0\r\n\r\nEND\r\n", b"NUL 1 0 . 0 0\r\nEND\r\n", b"SEQ 1 0 4096\r\n",
    b"MSG 0 2 . 171 60\r\nContent-Type: application/beep+xml\r\n\r\n<close code='200' />\r\n"
    b"END\r\n", b"MSG 0 2 . 171 10\r\n", b"END\r\n", b"\r\n", b"MSG 3 0 . 0 0\r\nEND\r\n",
])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_FRAGMENTS, st.binary(max_size=12)), max_size=12), st.integers(1, 40))
def test_any_bytes_after_opening(pieces: list[bytes], chunk: int) -> None:
    """Whatever arrives on an open session: events or one terminating violation, no exception,
    and never more buffered than one frame."""
    pair = ConnectionPair(config=_CONFIG)
    pair.open()
    pair.start(ECHO)
    conn = pair.listener
    data = b"".join(pieces)
    violations = []
    for i in range(0, len(data), chunk):
        events = conn.receive_data(data[i : i + chunk])
        violations += [e for e in events if isinstance(e, ProtocolViolation) and e.terminate]
        assert conn.buffered_bytes <= MAX_HEADER_LENGTH + 256 + len(TRAILER)
    assert len(violations) <= 1
    if violations:
        assert conn.state is SessionState.TERMINATED
        assert conn.data_to_send() == b""


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_before_greeting(data: bytes) -> None:
    """Random bytes instead of a greeting never raise."""
    pair = ConnectionPair(config=_CONFIG)
    pair.listener.receive_data(data)
    assert pair.listener.state in SessionState
