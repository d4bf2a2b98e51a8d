"""Avro binary encoding of single values, for the hand-written record writers
(`_journal_writer.py`, `robust/_link_writer.py`).

Each helper takes only a value whose type is plainly right and raises `_Slow` otherwise, so its
writer falls back to the generic path, which writes or refuses the record exactly as before.
"""

from __future__ import annotations

from typing import Any

__all__ = ["_LONG_MAX", "_LONG_MIN", "_NULL", "_ONE_BYTE", "_PRESENT", "_Slow", "_long",
           "_string", "_varint"]

_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_ONE_BYTE = [bytes((i,)) for i in range(128)]
_NULL = b"\x00"
_PRESENT = b"\x02"  # union branch 1 of [null, T]


class _Slow(Exception):
    """This value is not plainly valid: let the generic path write or refuse the record."""


def _varint(z: int) -> bytes:
    """Avro's variable-length encoding of an already zig-zagged (non-negative) number."""
    if z < 0x80:
        return _ONE_BYTE[z]
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


def _long(n: Any) -> bytes:
    if type(n) is not int or not _LONG_MIN <= n <= _LONG_MAX:
        raise _Slow
    return _varint((n << 1) ^ (n >> 63))


def _string(s: Any) -> bytes:
    if type(s) is not str:
        raise _Slow
    b = s.encode()
    return _varint(len(b) << 1) + b
