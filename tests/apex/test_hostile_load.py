"""Hostile load on a real ApexServer process: thousands of silent connections, one huge message.

The server runs in a subprocess so that its memory (VmHWM, the peak resident set, read from
/proc/<pid>/status) is its own and not the test's thousands of client sockets. Nothing sleeps:
each test awaits the end-of-file that the server's close produces.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.beep import (
    DEFAULT_MAX_MESSAGE_SIZE,
    BeepConnection,
    ChannelStarted,
    FrameDecoder,
    FrameType,
    GreetingReceived,
    Role,
    SeqFrame,
)
from adapters.client.client import ApexClient

#: The server's peak resident set may not pass this, whatever the peers do.
RSS_BOUND_KB = 300 * 1024
#: Silent connections wanted (fewer if the hard fd limit does not allow them).
IDLE_WANTED = 10_000
GREETING_TIMEOUT = 1.0

_SERVER = """
import asyncio, sys
from adapters.apex import Relay
from adapters.apex.server import ApexServer
from adapters.cli import logs

logs.configure("warning", json=True)

async def main() -> None:
    async with ApexServer(Relay("example.com"), greeting_timeout=float(sys.argv[1])) as server:
        print(server.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


def _raise_fd_limit() -> int:
    """Raise the soft fd limit to the hard one; return how many idle peers fit (both ends
    of each connection live on this machine: the test's socket here, the server's there)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, IDLE_WANTED + 1000)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return min(IDLE_WANTED, hard - 200)


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


@pytest.fixture(name="server")
def _server() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """An ApexServer process (greeting timeout 1 s); the fd limit is raised first so that the
    child inherits it."""
    _raise_fd_limit()
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(GREETING_TIMEOUT)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout is not None and proc.stdin is not None
    port = int(proc.stdout.readline())
    yield proc, port
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0


async def _silent_peer(port: int, gate: asyncio.Semaphore) -> float:
    """Connect, never greet, read until the server hangs up; return how long that took."""
    # The gate bounds concurrent connects (under the listen backlog of 100: a full accept queue
    # drops handshakes, and their retries take seconds), not the connections held open.
    async with gate:
        opened = time.monotonic()  # before the server's accept, so never after its timer starts
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        received = await asyncio.wait_for(reader.read(), 60)  # reads to end-of-file
    finally:
        writer.close()
    assert received.startswith(b"RPY 0 0 . 0 ")  # the server's greeting, then nothing
    return time.monotonic() - opened


async def _exchange(port: int) -> bytes:
    fred = await ApexClient.connect("127.0.0.1", port, timeout=20)
    await fred.attach("fred@example.com")
    await fred.send("fred@example.com", ["fred@example.com"], b"still serving")
    got = await asyncio.wait_for(anext(fred.receive()), 20)
    await fred.close()
    return got.content


async def _idle_flood(port: int, count: int) -> tuple[list[float], bytes]:
    gate = asyncio.Semaphore(64)
    peers = [asyncio.create_task(_silent_peer(port, gate)) for _ in range(count)]
    # While the flood is under way, an honest client still gets served.
    served = await _exchange(port)
    return await asyncio.gather(*peers), served


@pytest.mark.slow
def test_silent_connections_are_closed_by_the_greeting_timeout(
        server: tuple[subprocess.Popen[bytes], int]) -> None:
    """10,000 connections (or as many as the hard fd limit allows) that never greet are each
    closed by the 1 s greeting timeout; an honest client is served meanwhile; the server's
    peak RSS stays under 300 MB."""
    proc, port = server
    count = _raise_fd_limit()
    lifetimes, served = asyncio.run(_idle_flood(port, count))
    assert served == b"still serving"
    assert len(lifetimes) == count >= 1000
    # Closed by the timeout: not before it, and (for the typical peer) soon after it. Every one
    # was closed within _silent_peer's 60 s read, or gather raised; the bound on the median,
    # not the slowest, because this process's own loop, busy with 10,000 sockets on a loaded
    # host, adds its lag to whichever peers it reads last (a bound of 1 + 30 s on the slowest
    # failed once on a loaded host).
    assert min(lifetimes) >= GREETING_TIMEOUT
    assert statistics.median(lifetimes) < GREETING_TIMEOUT + 5
    assert _peak_rss_kb(proc.pid) < RSS_BOUND_KB


async def _huge_message(port: int) -> tuple[int, bytes]:
    """Start an APEX channel, then send one MSG of frames making 100 MB in all, obeying the
    server's flow control; return the octets sent and the payload of the server's ERR to it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = BeepConnection(Role.INITIATOR)
    conn.send_greeting()
    writer.write(conn.data_to_send())
    channel = 0
    while not channel:
        data = await asyncio.wait_for(reader.read(65536), 20)
        assert data, "server hung up during the handshake"
        for event in conn.receive_data(data):
            if isinstance(event, GreetingReceived):
                conn.start_channel(["http://iana.org/beep/APEX"])
            elif isinstance(event, ChannelStarted):
                channel = event.channel
        writer.write(conn.data_to_send())
    # From here on we write raw frames: MSG 1 on `channel`, "*" (more to come), 100 MB in all.
    declared, chunk = 100 * 1024 * 1024, b"x" * 60 * 1024
    decoder, seqno, limit, sent = FrameDecoder(), 0, 4096, 0
    try:
        while True:
            room = min(limit - seqno, len(chunk), declared - sent)
            if room > 0:
                more = "*" if sent + room < declared else "."
                writer.write(f"MSG {channel} 1 {more} {seqno} {room}\r\n".encode()
                             + chunk[:room] + b"END\r\n")
                seqno += room
                sent += room
                continue
            await writer.drain()
            data = await asyncio.wait_for(reader.read(65536), 20)
            assert data, f"the server hung up after {sent} octets"
            decoder.feed(data)
            while (frame := decoder.next_frame()) is not None:
                if isinstance(frame, SeqFrame) and frame.channel == channel:
                    limit = frame.ackno + frame.window
                elif not isinstance(frame, SeqFrame) and frame.channel == channel:
                    assert (frame.type, frame.msgno, frame.more) == (FrameType.ERR, 1, False)
                    return sent, frame.payload
    finally:
        writer.close()


async def _oversized_frame(port: int) -> bytes:
    """A frame header declaring 100 MB in one frame: refused before any payload is read, with a
    hang-up. Returns what the server sent before it (its greeting)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = BeepConnection(Role.INITIATOR)
    conn.send_greeting()
    writer.write(conn.data_to_send())
    # The greeting first: a server that hangs up with our payload unread in its buffer sends a
    # reset, and a reset may overtake what was sent before it (seen once in CI).
    greeting, greeted = b"", False
    while not greeted:
        chunk = await asyncio.wait_for(reader.read(65536), 20)
        assert chunk, "hung up before its greeting"
        greeting += chunk
        greeted = any(isinstance(e, GreetingReceived) for e in conn.receive_data(chunk))
    writer.write(b"MSG 0 1 . 0 104857600\r\n" + b"x" * 65536)
    try:
        await asyncio.wait_for(reader.read(), 20)  # to end-of-file: the hang-up
    except ConnectionResetError:
        pass  # the hang-up, as a reset
    finally:
        writer.close()
    return greeting


@pytest.mark.slow
def test_a_100_megabyte_message_is_refused_in_bounded_memory(
        server: tuple[subprocess.Popen[bytes], int]) -> None:
    """Frames summing to 100 MB: the server keeps none of it past its 4 MB limit and answers
    the whole message with ERR 554 (DESIGN invariant 7); a single frame declaring 100 MB is
    refused at its header (a poorly-formed frame: hang-up); the server keeps serving and its
    peak RSS stays bounded."""
    proc, port = server
    sent, refusal = asyncio.run(_huge_message(port))
    # All of it went through flow control, dropped as it came; the answer names the limit.
    assert sent == 100 * 1024 * 1024
    assert refusal.endswith(b"<error code='554'>message of 104857600 octets exceeds the limit"
                            b" of %d octets this peer accepts (max_message_size); send it in"
                            b" smaller messages</error>\r\n" % DEFAULT_MAX_MESSAGE_SIZE)
    assert asyncio.run(_oversized_frame(port)).startswith(b"RPY 0 0 . 0 ")
    assert asyncio.run(_exchange(port)) == b"still serving"
    assert _peak_rss_kb(proc.pid) < 100 * 1024
