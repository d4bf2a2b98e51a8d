"""Test helpers: RFC transcripts to bytes, byte-at-a-time feeding, and a `ConnectionPair`."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable

from adapters.beep import BeepConfig, BeepConnection, Event, Role

TLS = "http://iana.org/beep/TLS"
OTP = "http://iana.org/beep/SASL/OTP"
ANONYMOUS = "http://iana.org/beep/SASL/ANONYMOUS"
PLAIN = "http://iana.org/beep/SASL/PLAIN"
CRAM_MD5 = "http://iana.org/beep/SASL/CRAM-MD5"
APEX = "http://iana.org/beep/APEX"
ECHO = "http://example.org/beep/echo"

_LINE = re.compile(r"^([ILCS]):(?: (.*))?$")


def rfc(transcript: str, who: str) -> bytes:
    """The wire bytes of the lines `who` ("L", "I", "C" or "S") speaks in an RFC transcript.

    Each RFC line is one CRLF-terminated line on the wire; "L:" alone is an empty line.
    """
    out = []
    for raw in textwrap.dedent(transcript).splitlines():
        match = _LINE.match(raw.strip(" ") if raw.startswith(" ") else raw)
        if match and match.group(1) == who:
            out.append((match.group(2) or "") + "\r\n")
    return "".join(out).encode("ascii")


def feed(conn: BeepConnection, data: bytes, bytewise: bool) -> list[Event]:
    """Feed `data` whole or one byte at a time (h11's t_body_reader) and collect the events.

    Nothing is fed for empty `data` (`receive_data(b"")` would mean end-of-file).
    """
    if not data:
        return []
    if not bytewise:
        return conn.receive_data(data)
    events: list[Event] = []
    for i in range(len(data)):
        events += conn.receive_data(data[i : i + 1])
    return events


class ConnectionPair:
    """An initiator and a listener wired back to back: `pump()` shuttles bytes both ways."""

    def __init__(
        self,
        profiles: Iterable[str] = (ECHO, APEX),
        config: BeepConfig | None = None,
        bytewise: bool = False,
    ) -> None:
        self.initiator = BeepConnection(Role.INITIATOR, config)
        self.listener = BeepConnection(Role.LISTENER, config, profiles=profiles)
        self.bytewise = bytewise

    def peer(self, conn: BeepConnection) -> BeepConnection:
        return self.listener if conn is self.initiator else self.initiator

    def send(self, conn: BeepConnection) -> list[Event]:
        """Deliver what `conn` has to send to its peer; return the peer's events."""
        return feed(self.peer(conn), conn.data_to_send(), self.bytewise)

    def pump(self) -> tuple[list[Event], list[Event]]:
        """Shuttle until both are quiet; return (initiator's events, listener's events)."""
        got_i: list[Event] = []
        got_l: list[Event] = []
        for _ in range(10_000):
            to_l, to_i = self.initiator.data_to_send(), self.listener.data_to_send()
            if not to_l and not to_i:
                return got_i, got_l
            got_l += feed(self.listener, to_l, self.bytewise)
            got_i += feed(self.initiator, to_i, self.bytewise)
        raise AssertionError("the pair never went quiet")

    def open(self) -> None:
        """Exchange greetings."""
        self.listener.send_greeting()
        self.initiator.send_greeting()
        self.pump()

    def start(self, profile: str = ECHO) -> int:
        """Open a channel from the initiator, accepted by the listener; return its number."""
        number = self.initiator.start_channel([profile])
        self.pump()
        self.listener.accept_start(number, profile)
        self.pump()
        return number
