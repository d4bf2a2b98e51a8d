"""Wire defects that third-party peers found, each held down over real loopback TCP.

beepcore-java and a raw-socket probe against the server showed three: the server kept the
connection open after accepting a session release (RFC 3081 §2: the peer sending the `ok`
"immediately issues the TCP CLOSE call"); a well-formed MSG followed, in the same read, by a
poorly-formed frame made the server log a traceback from the transport ("Fatal error ...
can't reply when the session is terminated") instead of its protocol-violation line; and our
client released a session with `<close code='200' />`, which beepcore-java answers with `501 bad
channel number` (the DTD defaults `number` to 0, but nothing is lost by saying it).
"""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from structlog.testing import capture_logs

from adapters.apex.relay import Relay
from adapters.apex.server import ApexServer
from adapters.beep import BeepConnection, ChannelStarted, GreetingReceived, Role
from adapters.client.client import ApexClient
from tests.apex.tcp_proxy import TcpProxy

#: Seconds a test waits for what the server must do at once; never slept, only awaited.
PROMPT = 10.0


def _frame(header: str, payload: bytes) -> bytes:
    return f"{header} {len(payload)}\r\n".encode() + payload + b"END\r\n"


def _management(body: bytes) -> bytes:
    return b"Content-Type: application/beep+xml\r\n\r\n" + body


async def _read_greeting(reader: asyncio.StreamReader) -> bytes:
    """The server's greeting frame, read whole (it ends with the first trailer)."""
    return await asyncio.wait_for(reader.readuntil(b"END\r\n"), PROMPT)


async def _release(close: bytes) -> bytes:
    """Greet the server, ask it to release the session with `close`, and return everything
    it sends after its greeting, up to its end-of-file."""
    async with ApexServer(Relay("example.com")) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            await _read_greeting(reader)
            greeting = _management(b"<greeting />\r\n")
            release = _management(close)
            writer.write(_frame("RPY 0 0 . 0", greeting)
                         + _frame(f"MSG 0 1 . {len(greeting)}", release))
            # read() returns only at end-of-file: the FIN the server owes us after its ok.
            return await asyncio.wait_for(reader.read(), PROMPT)
        finally:
            writer.close()


@pytest.mark.parametrize("close", [b"<close code='200' />\r\n",
                                   b"<close number='0' code='200' />\r\n"],
                         ids=["implied-number", "explicit-number"])
def test_the_server_hangs_up_once_it_has_accepted_a_session_release(close: bytes) -> None:
    """After answering a release with `ok`, the server closes the TCP connection at once
    (RFC 3081 §2) rather than waiting for the peer to (a raw probe saw no FIN for 12 s)."""
    after = asyncio.run(_release(close))
    assert re.search(rb"RPY 0 1 \. \d+ \d+\r\nContent-Type: application/beep\+xml\r\n\r\n"
                     rb"<ok />\r\nEND\r\n", after)


async def _apex_channel(port: int) -> tuple[BeepConnection, asyncio.StreamReader,
                                             asyncio.StreamWriter, int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = BeepConnection(Role.INITIATOR)
    conn.send_greeting()
    for kind in (GreetingReceived, ChannelStarted):
        writer.write(conn.data_to_send())
        while not any(isinstance(e, kind)
                      for e in conn.receive_data(await asyncio.wait_for(reader.read(65536),
                                                                        PROMPT))):
            pass
        if kind is GreetingReceived:
            conn.start_channel(["http://iana.org/beep/APEX"])
    return conn, reader, writer, max(conn.channels)


#: Each poorly-formed frame, given the channel and msgno of the well-formed MSG before it and
#: the seqno that follows it on that channel.
BAD_FRAMES = {
    "bad header": lambda ch, msgno, next_seqno: b"MSG 1 two . 0 5\r\nhello\r\nEND\r\n",
    "wrong size": lambda ch, msgno, next_seqno:
        f"MSG {ch} {msgno + 1} . {next_seqno} 9\r\nhello\r\nEND\r\n".encode(),
    "reused msgno": lambda ch, msgno, next_seqno:
        f"MSG {ch} {msgno} . {next_seqno} 5\r\nhello\r\nEND\r\n".encode(),
    "channel never started": lambda ch, msgno, next_seqno: b"MSG 9 0 . 0 5\r\nhello\r\nEND\r\n",
}


def _well_formed(conn: BeepConnection, channel: int, first: str) -> bytes:
    if first == "apex msg":
        conn.send_msg(channel, b"<attach endpoint='fred@example.com' transID='1' />",
                      "application/beep+xml")
    else:  # a `start` on channel zero, which the ended session can no longer accept
        conn.start_channel(["http://iana.org/beep/APEX"])
    return conn.data_to_send()


async def _msg_then_bad_frame(first: str, kind: str) -> tuple[bytes, list[dict[str, object]]]:
    """One write (so one read at the server): a well-formed MSG, then a poorly-formed frame.
    Returns what the server sent after that, up to its end-of-file, and its log."""
    with capture_logs() as logs:
        async with ApexServer(Relay("example.com")) as server:
            conn, reader, writer, channel = await _apex_channel(server.port)
            good = _well_formed(conn, channel, first)
            header = re.match(rb"MSG (\d+) (\d+) \. (\d+) (\d+)\r\n", good)
            assert header is not None
            ch, msgno, seqno, size = map(int, header.groups())
            writer.write(good + BAD_FRAMES[kind](ch, msgno, seqno + size))
            after = await asyncio.wait_for(reader.read(), PROMPT)
            writer.close()
    return after, logs


@pytest.mark.parametrize("kind", list(BAD_FRAMES))
@pytest.mark.parametrize("first", ["apex msg", "start"])
def test_a_bad_frame_after_a_msg_in_one_read_is_logged_as_a_violation_not_a_traceback(
        first: str, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """A well-formed MSG and a poorly-formed frame in one read: the session ends without a
    reply (RFC 3080 §2.2.1.1), the server logs its one protocol-violation line, and nothing
    reaches the event loop's exception handler (which logs "Fatal error on transport" and a
    traceback: a remote peer could fill the log with them on demand)."""
    caplog.set_level(logging.DEBUG, logger="asyncio")
    after, logs = asyncio.run(_msg_then_bad_frame(first, kind))
    assert not re.search(rb"(RPY|ERR) ", after)  # no reply to the MSG
    violations = [e for e in logs if e["event"] == "protocol violation"]
    assert len(violations) == 1 and violations[0]["terminate"] is True
    assert not [e for e in logs if "exc_info" in e or e["log_level"] in ("error", "critical")]
    loop_errors = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert loop_errors == []
    assert "Fatal error" not in caplog.text and "Traceback" not in caplog.text


async def _client_release() -> list[bytes]:
    async with ApexServer(Relay("example.com")) as server:
        proxy = await TcpProxy(server.port).start()
        try:
            client = await ApexClient.connect("127.0.0.1", proxy.port)
            await client.attach("fred@example.com")
            await client.close()
            return [chunk for from_client, chunk in proxy.pipes[0].chunks if from_client]
        finally:
            await proxy.close()


def test_our_client_names_channel_zero_when_it_releases_a_session() -> None:
    """apexps as the initiator sends `<close number='0' ...>`: the DTD defaults the number, but
    beepcore-java answers the implied form with 501 "bad channel number"."""
    sent = b"".join(asyncio.run(_client_release()))
    assert b"<close number='0' code='200' />" in sent
    assert b"<close code=" not in sent
