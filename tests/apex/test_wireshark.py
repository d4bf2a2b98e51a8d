"""What apexps puts on the wire is standard BEEP as Wireshark's dissector reads it.

A real exchange over loopback TCP, recorded octet for octet by `TcpProxy` between the peers and
the `ApexServer` (both directions):

* session A, `ApexClient` as fred@example.com: greeting, start of an APEX channel, attach, a data
  of 5,000 octets addressed to fred himself (multipart/related; larger than the 4,096-octet
  window, so it travels as a `*` frame and a `.` frame each way and both peers send SEQ), a data
  to an unknown endpoint (ERR 550), a data to barney, channel-zero close;
* session B, barney@example.com attached by a piggybacked `<attach>` inside `<start>` (RFC 3340
  §4.2), who answers the data delivered to him with an application ERR, then closes.

Both sessions are written as a pcap (`tests/apex/pcap.py`: Ethernet/IPv4/TCP with handshake,
FIN, consistent seq/ack and checksums), one BEEP frame per TCP segment, cut by this test's own
reading of each header's size field (not by apexps's decoder), and read back by
`tshark -r FILE -d tcp.port==PORT,beep -T json`. What tshark has to confirm:

* every segment that carries data is dissected as BEEP;
* no malformed packet, no expert info at warning level or above from any layer (so TCP analysis
  found no gap, retransmission or bad checksum either), and no expert info at all from the BEEP
  dissector: its checks are "Expected More Flag (* or .)", "Invalid Terminator" (the header
  must end in CRLF; strict mode, the default) and "Nonstandard Terminator: CR/LF";
* per frame, the fields it parsed -- command, channel, msgno, more flag, seqno, size, ansno, and
  for SEQ the channel, ackno and window -- equal what this test expects and recomputes: the
  non-SEQ frames of each direction are exactly the expected script; each seqno is the sum of
  the sizes sent before on that channel and direction (RFC 3080 §2.2.1.2); each size is the
  octets between the header's CRLF and the `END` trailer; each SEQ acknowledges no more than the
  peer had sent, with the default window 4096 (RFC 3081 §3.1);
* the MIME header line tshark shows: `Content-Type: application/beep+xml`, or
  `multipart/related` for data, on the first frame of every message, none on continuation
  frames (the dissector tracks the more flag per direction to know which is which).

Why one frame per segment: Wireshark's BEEP dissector does not reassemble, and after a MIME
header line it counts the payload from the wrong place (it does not subtract the header line's
length), so a second frame in the same segment disappears into the first one's payload, its more
flag is never seen, and a later continuation frame is then read as if it started with MIME
headers (which can end in an exception, "Malformed Packet"). That befalls any BEEP traffic in
which a frame with MIME headers shares its segment with the next frame; it says nothing about
the octets, which are the same either way: only where TCP cuts them differs.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.apex import Relay
from adapters.apex.endpoint import Endpoint
from adapters.apex.server import ApexServer
from adapters.beep import BeepConfig
from adapters.client.client import ApexClient
from common.errors import NotTaken
from tests.apex.pcap import PcapWriter
from tests.apex.slow_app import SlowApp
from tests.apex.tcp_proxy import TcpProxy

TIMEOUT = 30.0
#: Wireshark's expert severities (epan/proto.h): PI_WARN and PI_ERROR are failures.
PI_WARN = 0x00600000
#: a loopback segment: large enough that no BEEP frame of this exchange is cut
LOOPBACK_SEGMENT = 65_495

_HEADER = re.compile(rb"(MSG|RPY|ERR|ANS|NUL) (\d+) (\d+) ([.*]) (\d+) (\d+)(?: (\d+))?\r\n")
_SEQ = re.compile(rb"SEQ (\d+) (\d+) (\d+)\r\n")
_TRAILER = b"END\r\n"


@dataclass(frozen=True)
class Frame:
    """One BEEP frame as this test reads it from the recorded octets."""

    from_client: bool
    raw: bytes
    command: str
    channel: int
    msgno: int = 0  # SEQ: the ackno
    more: str = ""
    seqno: int = 0
    size: int = 0  # SEQ: the window
    ansno: int | None = None

    @property
    def payload(self) -> bytes:
        return self.raw[self.raw.index(b"\r\n") + 2:len(self.raw) - len(_TRAILER)]


def _frames(chunks: list[tuple[bool, bytes]]) -> Iterator[Frame]:
    """Cut each direction's octets into frames by the header's size, in capture order."""
    buffers = {True: b"", False: b""}
    for from_client, octets in chunks:
        buffers[from_client] += octets
        while buffers[from_client]:
            data = buffers[from_client]
            if seq := _SEQ.match(data):
                channel, ackno, window = map(int, seq.groups())
                yield Frame(from_client, data[:seq.end()], "SEQ", channel, ackno, "", 0, window)
                buffers[from_client] = data[seq.end():]
                continue
            head = _HEADER.match(data)
            assert head is not None or b"\r\n" not in data, f"not a BEEP header: {data[:60]!r}"
            if head is None:
                break
            end = head.end() + int(head[6]) + len(_TRAILER)
            if len(data) < end:
                break
            assert data[end - len(_TRAILER):end] == _TRAILER, f"no trailer after {head[0]!r}"
            yield Frame(from_client, data[:end], head[1].decode(), int(head[2]), int(head[3]),
                        head[4].decode(), int(head[5]), int(head[6]),
                        None if head[7] is None else int(head[7]))
            buffers[from_client] = data[end:]
    assert buffers == {True: b"", False: b""}, "a frame was cut short"


# --- the exchange -----------------------------------------------------------------------------

@dataclass
class Recording:
    port: int
    fred: list[tuple[bool, bytes]]
    barney: list[tuple[bool, bytes]]


async def _exchange() -> Recording:
    # RFC 3081's initial 4096-octet windows on both sides, so the 5,000-octet data is split
    # into "*" and "." frames and SEQ frames move the windows.
    async with ApexServer(Relay("example.com"), config=BeepConfig()) as server:
        fred_proxy = await TcpProxy(server.port).start()
        barney_proxy = await TcpProxy(server.port).start()
        fred = await ApexClient.connect("127.0.0.1", fred_proxy.port, TIMEOUT,
                                        config=BeepConfig())
        await fred.attach("fred@example.com")
        barney = await SlowApp.attach(barney_proxy.port, Endpoint.parse("barney@example.com"))
        await fred.send("fred@example.com", ["fred@example.com"], b"y" * 5000, "text/plain")
        assert (await asyncio.wait_for(anext(fred.receive()), TIMEOUT)).content == b"y" * 5000
        with pytest.raises(NotTaken):
            await fred.send("fred@example.com", ["wilma@example.com"], b"x")
        sent = asyncio.create_task(fred.send("fred@example.com", ["barney@example.com"],
                                             b"z" * 100))
        delivered, _ = await barney.next()
        barney.error(delivered)
        await sent
        await fred.close()
        await barney.close()
        await fred_proxy.close()
        await barney_proxy.close()
        return Recording(server.port, fred_proxy.pipes[0].chunks, barney_proxy.pipes[0].chunks)


@pytest.fixture(scope="module", name="recording")
def _recording() -> Recording:
    return asyncio.run(asyncio.wait_for(_exchange(), 60))


# --- tshark -----------------------------------------------------------------------------------

def _tshark() -> str:
    found = shutil.which("tshark")
    if found is None:
        pytest.fail("tshark (Wireshark's command-line dissector) is not installed; this test"
                    " needs it. Install it with `ops/bootstrap` as root, or `sudo apt-get install"
                    " tshark` (Debian/Ubuntu), `sudo dnf install wireshark-cli` (Fedora),"
                    " `brew install wireshark` (macOS).")
    return found


def _dissect(pcap: Path, port: int) -> list[dict[str, Any]]:
    done = subprocess.run([_tshark(), "-r", str(pcap), "-d", f"tcp.port=={port},beep",
                           "-T", "json", "--no-duplicate-keys"],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return [p["_source"]["layers"] for p in json.loads(done.stdout)]


def _write(recording: Recording, path: Path) -> Path:
    """Both sessions, one BEEP frame per TCP segment."""
    writer = PcapWriter()
    for number, recorded in enumerate((recording.fred, recording.barney)):
        writer.conversation([(f.from_client, f.raw) for f in _frames(recorded)],
                            client_port=50_000 + number, server_port=recording.port,
                            max_segment=LOOPBACK_SEGMENT)
    writer.save(path)
    return path


def _experts(node: Any, path: str = "") -> Iterator[tuple[str, int, str]]:
    """(where, severity, message) of every expert info and malformed mark in a packet."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_ws.malformed":
                yield path, 1 << 30, "malformed packet"
            elif key == "_ws.expert" and isinstance(value, dict):
                yield (path, int(value.get("_ws.expert.severity", 0)),
                       str(value.get("_ws.expert.message", value)))
            yield from _experts(value, f"{path}/{key}")
    elif isinstance(node, list):
        for item in node:
            yield from _experts(item, path)


def _one(value: Any) -> str:
    """tshark lists a field once visible and once hidden; both carry the same value."""
    if isinstance(value, list):
        assert len(set(value)) == 1, value
        return str(value[0])
    return str(value)


# --- one frame per segment: every header checked ---------------------------------------------

#: (command, channel, msgno, more) of the non-SEQ frames, per session and direction.
FRED_OUT = [("RPY", 0, 0, "."), ("MSG", 0, 1, "."), ("MSG", 1, 0, "."), ("MSG", 1, 1, "*"),
            ("MSG", 1, 1, "."), ("RPY", 1, 0, "."), ("MSG", 1, 2, "."), ("MSG", 1, 3, "."),
            ("MSG", 0, 2, ".")]
FRED_IN = [("RPY", 0, 0, "."), ("RPY", 0, 1, "."), ("RPY", 1, 0, "."), ("RPY", 1, 1, "."),
           ("MSG", 1, 0, "*"), ("MSG", 1, 0, "."), ("ERR", 1, 2, "."), ("RPY", 1, 3, "."),
           ("RPY", 0, 2, ".")]
BARNEY_OUT = [("RPY", 0, 0, "."), ("MSG", 0, 1, "."), ("ERR", 1, 0, "."), ("MSG", 0, 2, ".")]
BARNEY_IN = [("RPY", 0, 0, "."), ("RPY", 0, 1, "."), ("MSG", 1, 0, "."), ("RPY", 0, 2, ".")]
#: the MSGs carrying APEX data, by (session, from_client, channel, msgno): multipart/related
DATA = {(0, True, 1, 1), (0, True, 1, 2), (0, True, 1, 3), (0, False, 1, 0), (1, False, 1, 0)}


def _as_dissected(layer: dict[str, Any]) -> tuple[Any, ...]:
    """tshark's reading of a one-frame segment, in the shape of `_expected`."""
    if "beep.seq.channel" in layer:
        return ("SEQ", int(_one(layer["beep.seq.channel"])), int(_one(layer["beep.seq.ackno"])),
                int(_one(layer["beep.seq.window"])))
    header = layer["Header"]
    return (_one(header["beep.command"]), int(_one(header["beep.channel"])),
            int(_one(header["beep.msgno"])), _one(header["beep.more"]).strip("'"),
            int(_one(header["beep.seqno"])), int(_one(header["beep.size"])),
            int(_one(header["beep.ansno"])) if "beep.ansno" in header else None,
            _one(header.get("beep.mime_header", "")))


def _expected(frame: Frame, first_of_message: bool) -> tuple[Any, ...]:
    if frame.command == "SEQ":
        return ("SEQ", frame.channel, frame.msgno, frame.size)
    payload = frame.payload
    mime = payload[:payload.index(b"\r\n")].decode() if first_of_message else ""
    return (frame.command, frame.channel, frame.msgno, frame.more, frame.seqno, len(payload),
            frame.ansno, mime)


def test_every_frame_header_as_tshark_reads_it(recording: Recording, tmp_path: Path) -> None:
    """One frame per segment: tshark's command/channel/msgno/more/seqno/size/SEQ fields match
    the script and the arithmetic of RFC 3080 and 3081 (see the module docstring)."""
    packets = _dissect(_write(recording, tmp_path / "frames.pcap"), recording.port)
    beep = [p for p in packets if int(_one(p["tcp"]["tcp.len"])) > 0]
    frames = [*_frames(recording.fred), *_frames(recording.barney)]
    assert len(beep) == len(frames)

    sent: dict[tuple[int, bool, int], int] = {}  # (session, from_client, channel) -> octets
    continuing: set[tuple[int, bool, int, int]] = set()
    for session, chunks in enumerate((recording.fred, recording.barney)):
        for frame in _frames(chunks):
            packet = beep.pop(0)
            assert "beep" in packet, packet["frame"]["frame.number"]
            problems = [e for e in _experts(packet) if e[1] >= PI_WARN or "beep" in e[0]]
            assert problems == [], (packet["frame"]["frame.number"], problems)
            key = (session, frame.from_client, frame.channel, frame.msgno)
            expected = _expected(frame, first_of_message=key not in continuing)
            assert _as_dissected(packet["beep"]) == expected, packet["frame"]["frame.number"]
            if frame.command == "SEQ":
                peer = sent.get((session, not frame.from_client, frame.channel), 0)
                assert frame.msgno <= peer and frame.size == 4096
                continue
            mine = (session, frame.from_client, frame.channel)
            assert frame.seqno == sent.get(mine, 0)
            sent[mine] = sent.get(mine, 0) + frame.size
            (continuing.add if frame.more == "*" else continuing.discard)(key)
            if expected[-1]:
                wanted = ("Content-Type: multipart/related;" if frame.command == "MSG"
                          and key in DATA else "Content-Type: application/beep+xml")
                assert expected[-1].startswith(wanted), expected

    def script(chunks: list[tuple[bool, bytes]], from_client: bool) -> list[tuple[Any, ...]]:
        return [(f.command, f.channel, f.msgno, f.more) for f in _frames(chunks)
                if f.from_client == from_client and f.command != "SEQ"]

    assert script(recording.fred, True) == FRED_OUT
    assert script(recording.fred, False) == FRED_IN
    assert script(recording.barney, True) == BARNEY_OUT
    assert script(recording.barney, False) == BARNEY_IN
    assert {f.from_client for f in _frames(recording.fred) if f.command == "SEQ"} == {True, False}
    piggyback = next(f for f in _frames(recording.barney) if f.command == "MSG" and not f.channel)
    assert b"<![CDATA[<attach endpoint='barney@example.com'" in piggyback.payload


def test_missing_tshark_fails_and_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tshark the Wireshark check fails (never skips) and names the install command."""
    monkeypatch.setattr(shutil, "which", lambda _: None)
    with pytest.raises(pytest.fail.Exception, match="apt-get install tshark"):
        _tshark()
