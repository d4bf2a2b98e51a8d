"""Write TCP conversations as a classic pcap file (libpcap format, Ethernet link type), by hand:
the global header, then per segment a record header, Ethernet II, IPv4 and TCP headers with
consistent sequence and acknowledgement numbers, so Wireshark reassembles and dissects the
stream as if it had captured it.

Each conversation opens with a three-way handshake and ends with FIN/ACK from both sides;
every data segment acknowledges everything the other side sent before it. Checksums are
computed (IPv4 header, TCP with its pseudo-header) so no checksum complaint can hide a real one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: libpcap's classic magic number (microsecond timestamps), version 2.4.
_PCAP_MAGIC = 0xA1B2C3D4
_LINKTYPE_ETHERNET = 1
_ETHERTYPE_IPV4 = 0x0800
_IPPROTO_TCP = 6
#: Ethernet's TCP maximum segment size (1500 MTU less 40 octets of IPv4 and TCP headers).
MAX_SEGMENT = 1460

_FIN, _SYN, _PSH, _ACK = 0x01, 0x02, 0x08, 0x10


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@dataclass
class _Side:
    ip: bytes
    port: int
    mac: bytes
    seq: int


class PcapWriter:
    """`conversation(...)` adds one TCP connection's segments; `save(path)` writes the file."""

    def __init__(self) -> None:
        self._records: list[bytes] = []
        self._clock = 1_700_000_000.0
        self._ip_id = 0

    def conversation(self, chunks: Iterable[tuple[bool, bytes]], *, client_port: int,
                     server_port: int, client_ip: str = "10.0.0.1",
                     server_ip: str = "10.0.0.2", max_segment: int = MAX_SEGMENT) -> None:
        """`chunks`: (from_client, octets) in the order they were sent; each becomes one or
        more segments of at most `max_segment` octets."""
        client = _Side(bytes(map(int, client_ip.split("."))), client_port,
                       b"\x02\0\0\0\0\x01", 1000)
        server = _Side(bytes(map(int, server_ip.split("."))), server_port,
                       b"\x02\0\0\0\0\x02", 5000)
        self._segment(client, server, _SYN, b"", ack=0)
        client.seq += 1
        self._segment(server, client, _SYN | _ACK, b"", ack=client.seq)
        server.seq += 1
        self._segment(client, server, _ACK, b"", ack=server.seq)
        for from_client, octets in chunks:
            src, dst = (client, server) if from_client else (server, client)
            for at in range(0, len(octets), max_segment):
                piece = octets[at:at + max_segment]
                self._segment(src, dst, _PSH | _ACK, piece, ack=dst.seq)
                src.seq += len(piece)
        self._segment(client, server, _FIN | _ACK, b"", ack=server.seq)
        client.seq += 1
        self._segment(server, client, _FIN | _ACK, b"", ack=client.seq)
        server.seq += 1
        self._segment(client, server, _ACK, b"", ack=server.seq)

    def _segment(self, src: _Side, dst: _Side, flags: int, payload: bytes, *, ack: int) -> None:
        tcp = struct.pack("!HHIIBBHHH", src.port, dst.port, src.seq & 0xFFFFFFFF,
                          ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0)
        pseudo = src.ip + dst.ip + struct.pack("!BBH", 0, _IPPROTO_TCP, len(tcp) + len(payload))
        tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo + tcp + payload)) + tcp[18:]
        self._ip_id += 1
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + len(payload), self._ip_id,
                         0x4000, 64, _IPPROTO_TCP, 0, src.ip, dst.ip)
        ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
        frame = dst.mac + src.mac + struct.pack("!H", _ETHERTYPE_IPV4) + ip + tcp + payload
        self._clock += 0.001
        seconds, micros = int(self._clock), round((self._clock % 1) * 1e6) % 1_000_000
        self._records.append(struct.pack("!IIII", seconds, micros, len(frame), len(frame))
                             + frame)

    def save(self, path: Path) -> None:
        header = struct.pack("!IHHiIII", _PCAP_MAGIC, 2, 4, 0, 0, 65535, _LINKTYPE_ETHERNET)
        path.write_bytes(header + b"".join(self._records))
