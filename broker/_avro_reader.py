"""A schema-compiled Avro binary reader for the broker's read paths.

Theory of operation
-------------------
fastavro's `schemaless_reader` walks the schema for every record (11-16 µs for a journal
record on the project's machine), and gap fills, the journal follower, repair catch-up and
recovery scans decode records by the ten thousand. This module walks a (writer, reader) schema
pair *once* and generates the source of one straight-line Python function per record, array and
map, with every field's read inlined: a one-byte varint, a null union branch or an empty map
costs a subscript and a comparison, and the record is built by a single dict display in the
writer's field order.

Results must be indistinguishable from fastavro's, so the generated code mirrors what fastavro's
C reader (fastavro/_read.pyx, 1.13) actually does, quirks included:

- timestamp-millis becomes an aware UTC `datetime`, computed exactly from the integer;
- a boolean is any non-zero byte;
- union branches and enum symbols are indexed Python-style, so -1 names the last one;
- "int" is read as a 64-bit long with no range check;
- a varint of 10 bytes wraps around 64 bits like fastavro's unsigned arithmetic.

Where fastavro's behaviour rests on C undefined behaviour (a varint longer than 10 bytes, an
array block count of -2**63) the reader raises `UseFastavro` and the codec decodes that record
with fastavro, so even those bytes get fastavro's own answer. A schema pair it does not compile
(a construct the shipped schemas do not use, or schema resolution beyond "the reader adds fields
with defaults") raises `CannotCompile`, and the codec keeps fastavro for that pair.

Bad bytes raise `Corrupt` with a reason. A length or block count is checked against the bytes
that remain before anything is sliced or looped over, so a hostile prefix can neither allocate
memory nor spin. tests/broker/test_avro_reader.py checks with hypothesis that every shipped
schema decodes exactly as fastavro decodes, valid bytes and corrupted ones alike.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["CannotCompile", "Corrupt", "Decoder", "UseFastavro", "compile_reader"]

#: `decode(data, start)`: the record whose body runs from `start` to the end of `data`.
Decoder = Callable[[bytes, int], dict[str, Any]]


class CannotCompile(Exception):
    """The schema pair uses a construct this reader does not compile."""


class UseFastavro(Exception):
    """These bytes hit a corner where only fastavro knows its own answer: decode with it."""


class Corrupt(ValueError):
    """The bytes are not a valid encoding under the writer schema."""


_MASK64 = (1 << 64) - 1
_LONG_MIN = -(1 << 63)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_MILLIS = tuple(timedelta(milliseconds=ms) for ms in range(1000))
#: UTC datetimes of whole seconds since the epoch, by second. Building a datetime from a
#: millisecond count is among the dearest steps of a record; records come in runs from the same
#: second, and adding the milliseconds to a known second costs a fraction of that.
_SECONDS: dict[int, datetime] = {}
_SECONDS_LIMIT = 4096  # then cleared: any run of records still hits from its second on
#: a one-byte varint's value, by byte
_ZIGZAG = tuple((b >> 1) ^ -(b & 1) for b in range(128))


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The zig-zag long at `pos` and the position after it, as fastavro's C reader reads it."""
    # Unrolled to six bytes (sequence numbers, offsets, millisecond times): a loop costs a
    # quarter more per byte in CPython.
    n = data[pos]
    if n < 0x80:
        return _ZIGZAG[n], pos + 1
    b = data[pos + 1]
    if b < 0x80:
        n = (n & 0x7F) | b << 7
        return (n >> 1) ^ -(n & 1), pos + 2
    n = (n & 0x7F) | (b & 0x7F) << 7
    b = data[pos + 2]
    if b < 0x80:
        n |= b << 14
        return (n >> 1) ^ -(n & 1), pos + 3
    n |= (b & 0x7F) << 14
    b = data[pos + 3]
    if b < 0x80:
        n |= b << 21
        return (n >> 1) ^ -(n & 1), pos + 4
    n |= (b & 0x7F) << 21
    b = data[pos + 4]
    if b < 0x80:
        n |= b << 28
        return (n >> 1) ^ -(n & 1), pos + 5
    n |= (b & 0x7F) << 28
    b = data[pos + 5]
    if b < 0x80:
        n |= b << 35
        return (n >> 1) ^ -(n & 1), pos + 6
    n |= (b & 0x7F) << 35
    pos += 6
    for shift in (42, 49, 56, 63):
        b = data[pos]
        pos += 1
        if b < 0x80:
            n = (n | b << shift) & _MASK64  # the 10th byte's high bits fall off 64 bits in C
            return (n >> 1) ^ -(n & 1), pos
        n |= (b & 0x7F) << shift
    # An 11th byte: fastavro shifts a 64-bit integer by 70 or more, which C leaves undefined.
    # Whatever it does there is the answer, so let it do it.
    raise UseFastavro


def _second(second: int) -> datetime:
    """The datetime of `second` since the epoch: fastavro's epoch + timedelta(µs) at a whole
    second, overflowing (OverflowError) exactly where that would for any of its milliseconds."""
    moment = _EPOCH + _SECOND * second
    if len(_SECONDS) >= _SECONDS_LIMIT:
        _SECONDS.clear()
    _SECONDS[second] = moment
    return moment


def _union_index(data: bytes, pos: int, branches: int, where: str) -> tuple[int, int]:
    i, pos = _varint(data, pos)
    if -branches <= i < 0:
        i += branches  # fastavro indexes the branch list Python-style
    if not 0 <= i < branches:
        raise Corrupt(f"{where}: union branch {i} out of range (the union has {branches})")
    return i, pos


def _enum_symbol(data: bytes, pos: int, symbols: tuple[str, ...], where: str) -> tuple[str, int]:
    i, pos = _varint(data, pos)
    try:
        return symbols[i], pos  # Python-style, as fastavro indexes the symbol list
    except IndexError:
        raise Corrupt(f"{where}: enum index {i} out of range ({len(symbols)} symbols)") from None


def _bad_length(where: str, n: int, left: int) -> Corrupt:
    if n < 0:
        return Corrupt(f"{where}: negative length {n}")
    return Corrupt(f"{where}: length {n} exceeds the {left} bytes left")


def _bad_count(where: str, count: int, left: int) -> Corrupt:
    return Corrupt(f"{where}: {count} items cannot fit in the {left} bytes left")


_RUNTIME: dict[str, Any] = {
    "_varint": _varint, "_union_index": _union_index, "_enum_symbol": _enum_symbol,
    "_bad_length": _bad_length, "_bad_count": _bad_count, "_ZIGZAG": _ZIGZAG,
    "_second": _second, "_SECONDS": _SECONDS, "_MILLIS": _MILLIS, "_LONG_MIN": _LONG_MIN,
    "Corrupt": Corrupt, "UseFastavro": UseFastavro,
}

_INDENT = "    "


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return [_INDENT * depth + line for line in lines]


def _varint_lines(target: str, inline: int) -> list[str]:
    """Statements reading a zig-zag long into `target`: up to `inline` bytes inline, longer
    ones by `_varint` (a call and its tuple cost about as much as reading two bytes)."""
    rest = [f"{target}, pos = _varint(data, pos)"]
    for k in range(inline - 1, 0, -1):
        rest = [
            f"b = data[pos + {k}]",
            "if b < 0x80:",
            f"    z |= b << {7 * k}",
            f"    {target} = (z >> 1) ^ -(z & 1)",
            f"    pos += {k + 1}",
            "else:",
            f"    z |= (b & 0x7F) << {7 * k}",
            *_indent(rest),
        ]
    if inline > 1:
        rest.insert(0, "z = b & 0x7F")
    return ["b = data[pos]", "if b < 0x80:", f"    {target} = _ZIGZAG[b]", "    pos += 1", "else:",
            *_indent(rest)]


def _literal(value: Any) -> str:
    """`value` (a JSON default) as Python source that builds a fresh, equal value per record:
    fastavro hands out the schema's own default object, which a caller could mutate."""
    src = repr(value)
    try:
        same = repr(ast.literal_eval(src)) == src
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise CannotCompile(f"default {value!r} has no plain literal")
    return src


def _min_size(schema: Any) -> int:
    """0 if a value of `schema` can take no bytes at all, else 1."""
    if isinstance(schema, list):
        return 1
    t = schema if isinstance(schema, str) else schema["type"]
    if t == "null":
        return 0
    if t == "record":
        return max((_min_size(f["type"]) for f in schema["fields"]), default=0)
    if isinstance(t, (dict, list)):
        return _min_size(t)
    return 1


class _Compiler:
    """Emits the statements that read one value into a variable, advancing `pos`.

    Every generated function has `data`, `pos` and `size` (= len(data)) as locals; `b`, `z`,
    `n`, `end`, `i`, `s` and `t` are scratch names that each emitted block is done with before
    the next one starts. Values go to `f0`, `f1`, … in records and `k`, `x` in containers.
    """

    def __init__(self) -> None:
        self.namespace = dict(_RUNTIME)
        self.functions: list[str] = []

    def constant(self, stem: str, value: Any) -> str:
        name = f"_{stem}{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def value(self, schema: Any, target: str, where: str) -> list[str]:
        if isinstance(schema, list):
            return self.union(schema, target, where)
        if isinstance(schema, str):
            schema = {"type": schema}
        t = schema["type"]
        if isinstance(t, (dict, list)):
            return self.value(t, target, where)
        logical = schema.get("logicalType")
        if logical is not None and (t, logical) != ("long", "timestamp-millis"):
            raise CannotCompile(f"{where}: logicalType {logical!r} on {t!r}")
        if t == "null":
            return [f"{target} = None"]
        if t == "boolean":
            return [f"{target} = data[pos] != 0", "pos += 1"]
        if t in ("int", "long"):
            lines = _varint_lines(target, 6)  # sequence numbers, offsets, times: 6 bytes
            if logical is not None:  # timestamp-millis
                lines += [
                    f"s = {target} // 1000",
                    "t = _SECONDS.get(s)",
                    "if t is None:",
                    "    t = _second(s)",
                    f"{target} = t + _MILLIS[{target} % 1000]",
                ]
            return lines
        if t in ("string", "bytes"):
            return [
                *_varint_lines("n", 2),
                "end = pos + n",
                "if n < 0 or end > size:",
                f"    raise _bad_length({where!r}, n, size - pos)",
                f"{target} = data[pos:end]" + (".decode()" if t == "string" else ""),
                "pos = end",
            ]
        if t == "enum":
            return self.enum(schema, target, where)
        if t == "array":
            return self.container(schema, target, where, "array")
        if t == "map":
            return self.container(schema, target, where, "map")
        if t == "record":
            name = self.record_function(schema, where)
            return [f"{target}, pos = {name}(data, pos, size)"]
        raise CannotCompile(f"{where}: type {t!r}")

    def enum(self, schema: Mapping[str, Any], target: str, where: str) -> list[str]:
        symbols = tuple(schema["symbols"])
        # The symbol for every one-byte index, None where the index is out of range or the
        # varint runs on: one subscript reads a valid enum.
        by_byte = tuple(_symbol_at(symbols, _ZIGZAG[b]) if b < 0x80 else None
                        for b in range(256))
        table = self.constant("by_byte", by_byte)
        syms = self.constant("symbols", symbols)
        return [
            f"{target} = {table}[data[pos]]",
            f"if {target} is None:",
            f"    {target}, pos = _enum_symbol(data, pos, {syms}, {where!r})",
            "else:",
            "    pos += 1",
        ]

    def union(self, branches: list[Any], target: str, where: str) -> list[str]:
        k = len(branches)
        if not 0 < k <= 64:  # 64: every branch index fits one varint byte
            raise CannotCompile(f"{where}: a union of {k} branches")
        reads = [self.value(branch, target, where) for branch in branches]
        # One test per branch on the byte as written; only a non-canonical or negative index
        # (which fastavro takes Python-style) needs the varint read and a second dispatch.
        lines = ["b = data[pos]"]
        for index, read in enumerate(reads):
            lines += [f"{'if' if index == 0 else 'elif'} b == {2 * index}:", "    pos += 1",
                      *_indent(read)]
        lines += ["else:", f"    i, pos = _union_index(data, pos, {k}, {where!r})"]
        for index, read in enumerate(reads[:-1]):
            lines += _indent([f"{'if' if index == 0 else 'elif'} i == {index}:", *_indent(read)])
        lines += _indent(["else:", *_indent(reads[-1])] if k > 1 else reads[-1])
        return lines

    def container(self, schema: Mapping[str, Any], target: str, where: str, kind: str) -> list[str]:
        inner = schema["items"] if kind == "array" else schema["values"]
        if _min_size(inner) == 0:
            # A block of a billion empty items takes no bytes; fastavro would build them all.
            raise CannotCompile(f"{where}: {kind} of zero-size values")
        name = self.constant(kind, None)  # the def below binds it
        where_inner = f"{where}[]" if kind == "array" else f"{where}{{}}"
        if kind == "array":
            start, add = ["out = []", "append = out.append"], ["append(x)"]
            item = self.value(inner, "x", where_inner)
        else:
            start, add = ["out = {}"], ["out[k] = x"]
            item = self.value("string", "k", f"{where} key") + self.value(inner, "x", where_inner)
        body = [
            f"def {name}(data, pos, size):",
            *_indent(start),
            "    while True:",
            *_indent(_varint_lines("count", 1), 2),
            "        if count == 0:",
            "            return out, pos",
            "        if count < 0:",
            # fastavro negates -2**63 in C, gets it back, and reads no items
            "            if count == _LONG_MIN:",
            "                raise UseFastavro",
            "            count = -count",
            *_indent(_varint_lines("_", 1), 3),  # the block's byte size, unused
            "        if count > size - pos:",
            f"            raise _bad_count({where!r}, count, size - pos)",
            "        for _ in range(count):",
            *_indent(item + add, 3),
        ]
        self.functions.append("\n".join(body))
        empty = "[]" if kind == "array" else "{}"
        return [
            "if data[pos] == 0:",
            f"    {target} = {empty}",
            "    pos += 1",
            "else:",
            f"    {target}, pos = {name}(data, pos, size)",
        ]

    def fields(self, schema: Mapping[str, Any], where: str) -> tuple[list[str], list[str]]:
        """The statements reading every field, and the `'name': source` items of the dict."""
        lines: list[str] = []
        items: list[str] = []
        for index, field in enumerate(schema["fields"]):
            var = f"f{index}"
            name = field["name"]
            lines += self.value(field["type"], var, f"{where}.{name}" if where else name)
            items.append(f"{name!r}: {var}")
        return lines, items

    def record_function(self, schema: Mapping[str, Any], where: str) -> str:
        name = self.constant("record", None)  # the def below binds it
        lines, items = self.fields(schema, where)
        self.functions.append("\n".join([
            f"def {name}(data, pos, size):",
            *_indent(lines),
            f"    return {{{', '.join(items)}}}, pos",
        ]))
        return name

    def top(self, writer: Mapping[str, Any], reader: Mapping[str, Any] | None) -> Decoder:
        if writer.get("type") != "record":
            raise CannotCompile("the top-level schema is not a record")
        lines, items = self.fields(writer, "")
        items += [f"{f['name']!r}: {_literal(f['default'])}" for f in _added_fields(writer, reader)]
        source = "\n".join([
            "def decode(data, pos):",
            "    size = len(data)",
            "    try:",
            *_indent(lines or ["pass"], 2),
            "    except IndexError:",
            "        raise Corrupt('truncated: the data ends inside the record') from None",
            "    except UnicodeDecodeError as exc:",
            "        raise Corrupt(f'a string is not UTF-8 ({exc.reason})') from None",
            "    except OverflowError as exc:",
            "        raise Corrupt(f'a value is out of range ({exc})') from None",
            "    if pos != size:",
            "        raise Corrupt(f'{size - pos} trailing bytes after the record')",
            f"    return {{{', '.join(items)}}}",
        ])
        self.functions.append(source)
        code = compile("\n\n".join(self.functions), f"<avro reader {writer.get('name')}>", "exec")
        exec(code, self.namespace)  # source generated here, from the schemas the codec ships
        decode: Decoder = self.namespace["decode"]
        return decode


def _symbol_at(symbols: tuple[str, ...], i: int) -> str | None:
    try:
        return symbols[i]
    except IndexError:
        return None


def _added_fields(writer: Mapping[str, Any],
                  reader: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The reader's fields the writer lacks, which take their defaults.

    The only resolution compiled: the reader keeps every writer field under the same name and
    type, and may add fields with defaults. fastavro puts those after the writer's fields, in
    the reader's order, and so does the generated dict.
    """
    if reader is None:
        return []
    if reader.get("type") != "record" or reader.get("name") != writer.get("name"):
        raise CannotCompile("reader and writer are not the same record")
    ours = {f["name"]: f for f in reader["fields"]}
    if any("aliases" in f for f in reader["fields"]):
        raise CannotCompile("field aliases")
    for field in writer["fields"]:
        mine = ours.get(field["name"])
        if mine is None or mine["type"] != field["type"]:
            raise CannotCompile(f"field {field['name']!r} is dropped or changes type")
    written = {f["name"] for f in writer["fields"]}
    added = [f for f in reader["fields"] if f["name"] not in written]
    for field in added:
        if "default" not in field:
            raise CannotCompile(f"added field {field['name']!r} has no default")
    return added


def compile_reader(writer: Mapping[str, Any],
                   reader: Mapping[str, Any] | None = None) -> Decoder:
    """Compile a decoder for records written with `writer` and read as `reader` (a JSON schema
    dict each; None: read as written). Raises `CannotCompile` for what it does not handle."""
    return _Compiler().top(writer, reader)
