"""Avro binary encoding of single values, for the hand-written record writers
(`journal_writer.py`, `robust/_link_writer.py`).

Each helper takes only a value whose type is plainly right and raises `Slow` otherwise, so its
writer falls back to the generic path, which writes or refuses the record exactly as before.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LONG_MAX", "LONG_MIN", "NULL", "ONE_BYTE", "PRESENT", "Slow", "avro_long",
           "avro_string", "varint"]

LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
ONE_BYTE = [bytes((i,)) for i in range(128)]
NULL = b"\x00"
PRESENT = b"\x02"  # union branch 1 of [null, T]


class Slow(Exception):
    """This value is not plainly valid: let the generic path write or refuse the record."""


def varint(z: int) -> bytes:
    """Avro's variable-length encoding of an already zig-zagged (non-negative) number."""
    if z < 0x80:
        return ONE_BYTE[z]
    if z < 0x4000:
        return bytes(((z & 0x7F) | 0x80, z >> 7))
    if z < 0x200000:
        return bytes(((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80, z >> 14))
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def avro_long(n: Any) -> bytes:
    if type(n) is not int or not LONG_MIN <= n <= LONG_MAX:
        raise Slow
    return varint((n << 1) ^ (n >> 63))


def avro_string(s: Any) -> bytes:
    if type(s) is not str:
        raise Slow
    b = s.encode()
    return varint(len(b) << 1) + b
