"""A schema-compiled Avro binary writer for the journal's hot path.

Why: fastavro's `schemaless_writer` walks the schema for every record (~17 µs for a journal
record here), which was the largest single cost of an append. This module walks a parsed schema
*once* and returns a chain of small closures that write one record, type-checking as strictly as
fastavro's `strict_allow_default` mode: a missing field without default, an extra field, or a
value of the wrong type raises `_Invalid`.

It supports what `avro/` uses (null, boolean, int, long, float, double, bytes, string, enum,
record, array, map, and unions of null with one other type). Anything else raises
`Unsupported` at compile time and the codec keeps using fastavro for that schema. A value it
cannot take cheaply (e.g. a datetime for timestamp-millis) raises `Fallback` at write time and
the codec writes that record with fastavro. tests/broker/test_avro_writer.py checks, with
hypothesis, that the bytes are identical to fastavro's for every shipped schema.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Fallback", "Invalid", "Unsupported", "compile_writer"]

Writer = Callable[[list[bytes], Any], None]


class Unsupported(Exception):
    """The schema uses a construct this writer does not compile."""


class Fallback(Exception):
    """This value is valid but not handled here; write the record with fastavro."""


class Invalid(ValueError):
    """The record does not match the schema."""


_NO_DEFAULT = object()


def _long(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Small values dominate (lengths, enum indexes, union branches): precompute them.
_SMALL = [_long(i) for i in range(256)]


def _zz(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < 256 else _long(n)


_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


def _w_long(lo: int, hi: int, logical: str | None) -> Writer:
    def w(out: list[bytes], v: Any) -> None:
        if type(v) is not int:
            if logical and not isinstance(v, (str, bytes, bool)) and v is not None:
                raise Fallback
            raise Invalid(f"expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise Invalid(f"integer {v} out of range")
        out.append(_zz(v))

    return w


def _w_string(out: list[bytes], v: Any) -> None:
    if type(v) is not str:
        raise Invalid(f"expected a string, got {type(v).__name__}")
    b = v.encode()
    out.append(_zz(len(b)))
    out.append(b)


def _w_bytes(out: list[bytes], v: Any) -> None:
    if type(v) is not bytes:
        if isinstance(v, (bytearray, memoryview)):
            v = bytes(v)
        else:
            raise Invalid(f"expected bytes, got {type(v).__name__}")
    out.append(_zz(len(v)))
    out.append(v)


def _w_null(out: list[bytes], v: Any) -> None:
    if v is not None:
        raise Invalid("expected null")


def _w_boolean(out: list[bytes], v: Any) -> None:
    if type(v) is not bool:
        raise Invalid("expected a boolean")
    out.append(b"\x01" if v else b"\x00")


def _w_float(fmt: str) -> Writer:
    packer = struct.Struct(fmt).pack

    def w(out: list[bytes], v: Any) -> None:
        if type(v) not in (float, int):
            raise Invalid("expected a number")
        out.append(packer(v))

    return w


def _compile(schema: Any) -> Writer:
    if isinstance(schema, str):
        schema = {"type": schema}
    if isinstance(schema, list):
        return _union(schema)
    t = schema["type"]
    if isinstance(t, (dict, list)):
        return _compile(t)
    logical = schema.get("logicalType")
    simple: dict[str, Writer] = {
        "null": _w_null, "boolean": _w_boolean, "string": _w_string, "bytes": _w_bytes,
        "float": _w_float("<f"), "double": _w_float("<d"),
    }
    if t in simple and logical is None:
        return simple[t]
    if t == "long" and logical in (None, "timestamp-millis"):
        return _w_long(_LONG_MIN, _LONG_MAX, logical)
    if t == "int" and logical is None:
        return _w_long(_INT_MIN, _INT_MAX, None)
    if t == "enum":
        index = {s: _zz(i) for i, s in enumerate(schema["symbols"])}

        def w_enum(out: list[bytes], v: Any) -> None:
            try:
                out.append(index[v])
            except (KeyError, TypeError):
                raise Invalid(f"{v!r} is not one of {list(index)}") from None

        return w_enum
    if t == "array":
        item = _compile(schema["items"])

        def w_array(out: list[bytes], v: Any) -> None:
            if not isinstance(v, (list, tuple)):
                raise Invalid("expected a list")
            if v:
                out.append(_zz(len(v)))
                for x in v:
                    item(out, x)
            out.append(b"\x00")

        return w_array
    if t == "map":
        value = _compile(schema["values"])

        def w_map(out: list[bytes], v: Any) -> None:
            if not isinstance(v, Mapping):
                raise Invalid("expected a mapping")
            if v:
                out.append(_zz(len(v)))
                for k, x in v.items():
                    _w_string(out, k)
                    value(out, x)
            out.append(b"\x00")

        return w_map
    if t == "record":
        return _record(schema)
    raise Unsupported(f"type {t!r} (logicalType {logical!r})")


def _union(branches: list[Any]) -> Writer:
    kinds = [b if isinstance(b, str) else b.get("type") for b in branches]
    if len(branches) != 2 or "null" not in kinds:
        raise Unsupported("unions other than [null, T]")
    null_at = kinds.index("null")
    other_at = 1 - null_at
    other = _compile(branches[other_at])
    tag_null, tag_other = _zz(null_at), _zz(other_at)

    def w(out: list[bytes], v: Any) -> None:
        if v is None:
            out.append(tag_null)
        else:
            out.append(tag_other)
            other(out, v)

    return w


def _record(schema: Mapping[str, Any]) -> Writer:
    fields = [(f["name"], _compile(f["type"]), f.get("default", _NO_DEFAULT))
              for f in schema["fields"]]
    names = frozenset(name for name, _, _ in fields)

    def w(out: list[bytes], rec: Any) -> None:
        if not isinstance(rec, Mapping):
            raise Invalid("expected a record (mapping)")
        if len(rec) > len(names) or not names.issuperset(rec):
            raise Invalid(f"unexpected fields: {sorted(set(rec) - names)}")
        for name, write, default in fields:
            if name in rec:
                write(out, rec[name])
            elif default is _NO_DEFAULT:
                raise Invalid(f"missing field {name!r}")
            else:
                write(out, default)

    return w


def compile_writer(schema: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bytes]:
    """Compile `schema` (a JSON schema dict) into `record -> Avro binary body`."""
    write = _compile(dict(schema))

    def encode(record: Mapping[str, Any]) -> bytes:
        out: list[bytes] = []
        write(out, record)
        return b"".join(out)

    return encode
