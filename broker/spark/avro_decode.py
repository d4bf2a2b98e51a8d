"""Decode apexps's Avro single-object records in the JVM, with spark-avro's `from_avro`.

Theory of operation
-------------------
Every value apexps writes to Kafka is `C3 01` + the writer schema's 8-byte fingerprint + the
Avro body (broker/codec.py). A topic holds records of a few schema names (the journal only
`journal_record`; the links topic `link_batch` packs and the older single `link_record`; the
items topic headers, versions and markers), each in any of its shipped versions. So the decode
of a Kafka row is a choice by header: for every (name, version) the job knows, one
`from_avro(body, writer schema, {mode: PERMISSIVE, avroSchema: newest version of name})` branch
of a CASE on the first ten bytes. Avro's own schema resolution, inside the JVM, reads an older
writer's bytes into the newest layout and fills the fields it lacks from their defaults, which is
what the Python codec does; every branch of one name therefore has one Spark type, and one
struct column per name (`_rec_<name>`) holds the record, null where the row is of another name.

What the JVM does not decode goes elsewhere, always to a row and never to a failed job (an audit
reports damage, it does not stop at it):
- no value, fewer than ten bytes or a wrong marker: `decode_error`, decided in SQL;
- a known fingerprint whose body `from_avro` cannot read (PERMISSIVE gives null): `decode_error`
  says which schema version failed;
- the right marker but a fingerprint none of the topic's names has: the Python codec
  (`Codec.decode`) as a UDF. It knows the same schemas, so usually it just names the problem
  (an unknown fingerprint, or a record of another name than the topic holds) in its own words;
  it decodes where its schema directory (APEXPS_AVRO_DIR on the executors) knows more than the job.
  The UDF's input is null on every other row: Spark evaluates a Python UDF on all rows even
  inside a CASE branch, so nulling its input is what keeps the Python side to a pass over nulls.
  That pass still costs (ops/bench/bench_spark_decode.py measures it), and it needs apexps on
  the executors: `python_fallback=False` leaves Python out and reports those rows in SQL.
  Where no row needs the fallback the two give the same rows, so a job that reads a frame more
  than once (a cached one) can ask first, in SQL: `needs_python(raw, names)`.

One known difference: the JVM reader does not check that the body was consumed to its end, the
Python codec refuses trailing bytes. apexps's writers never leave any.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from broker.codec import HEADER_LEN, MARKER, Codec, SchemaVersion, default_codec

__all__ = ["BAD_MARKER", "UNKNOWN_FINGERPRINT", "decode_values", "left_to_python",
           "needs_python", "record_column"]

DataFrame = Any  # pyspark.sql.DataFrame; pyspark ships no type stubs mypy can use here
Column = Any

#: The Python codec's words for a value that is not single-object encoded.
BAD_MARKER = "not an Avro single-object encoded record (bad marker)"
#: How `python_fallback=False` begins the error of a row only the Python fallback could decode.
UNKNOWN_FINGERPRINT = "record written with schema fingerprint "


def record_column(name: str) -> str:
    """The struct column `decode_values` puts records of schema `name` in."""
    return f"_rec_{name}"


def decode_values(raw: DataFrame, names: Sequence[str], *, value: str = "value",
                  tombstones: bool = False, codec: Codec | None = None,
                  python_fallback: bool = True) -> DataFrame:
    """`raw` plus `_schema` (the writer schema's name), one `_rec_<name>` struct per name (the
    record in that name's newest layout) and `decode_error`. `codec` gives the schemas decoded
    in the JVM (default: the shipped ones).

    `tombstones`: a null value is a compacted topic's delete, not damage (no error, no record).
    `python_fallback=False`: no Python at all (for executors without apexps installed, and
    without the pass over every row the UDF costs); a fingerprint none of `names` has is then
    reported in SQL.
    """
    from pyspark.sql import functions as F

    codec = codec or default_codec()
    val = F.col(value)
    header = F.substring(val, 1, HEADER_LEN)
    body = F.expr(f"substring(`{value}`, {HEADER_LEN + 1})")
    well_formed = (F.length(val) >= HEADER_LEN) & (F.substring(val, 1, 2) == F.lit(MARKER))

    versions = {name: codec.versions(name) for name in names}
    native: dict[str, Column] = {}
    failed: list[tuple[Column, Column]] = []
    schema_name: Column = F.lit(None).cast("string")
    for name, svs in versions.items():
        reader = json.dumps(svs[-1].raw)
        rec: Column = F.lit(None)
        # PERMISSIVE gives a struct of nulls, not a null, for a body it cannot read: a field
        # that no record of the name leaves null tells the two apart.
        check = F.col(record_column(name))[_required_field(svs[-1].raw)]
        for sv in reversed(svs):
            hit = header == F.lit(MARKER + sv.fingerprint)
            rec = F.when(hit, _from_avro(body, sv, reader)).otherwise(rec)
            schema_name = F.when(hit, F.lit(name)).otherwise(schema_name)
            failed.append((hit & check.isNull(), F.lit(
                f"corrupt {name} record: its body does not decode as {name} v{sv.version} "
                "(spark-avro)")))
        native[name] = rec
    known = F.lit(False)
    for svs in versions.values():
        known = known | header.isin(*[F.lit(MARKER + sv.fingerprint) for sv in svs])

    df = raw.withColumns({**{record_column(n): c for n, c in native.items()},
                          "_schema": schema_name})
    rec_types = [df.schema[record_column(n)].dataType for n in names]
    if python_fallback:
        fallback = F.udf(_fallback_udf(list(names), rec_types),
                         _fallback_type(list(names), rec_types))
        df = df.withColumn("_py", fallback(F.when(well_formed & ~known, val)))
    else:
        unknown = F.concat(F.lit(UNKNOWN_FINGERPRINT),
                           F.lower(F.hex(F.substring(val, 3, HEADER_LEN - 2))),
                           F.lit(f", which no shipped version of {' or '.join(names)} has"))
        df = df.withColumn("_py", F.struct(
            F.lit(None).cast("string").alias("schema"),
            *[F.lit(None).cast(ty).alias(record_column(n))
              for n, ty in zip(names, rec_types, strict=True)],
            unknown.alias("error")))
    error = F.when(val.isNull(), F.lit(None) if tombstones else F.lit("empty record")) \
        .when(~well_formed, F.lit(BAD_MARKER))
    for cond, why in failed:
        error = error.when(cond, why)
    error = error.when(~known, F.col("_py.error"))
    broken = error.isNotNull()
    # A record that failed is no record: its struct of nulls must not pass for one.
    return df.withColumns({
        "_schema": F.when(~broken, F.coalesce(F.col("_schema"), F.col("_py.schema"))),
        **{record_column(n): F.when(~broken, F.coalesce(
            F.col(record_column(n)), F.col(f"_py.{record_column(n)}"))) for n in names},
        "decode_error": error,
    }).drop("_py")


def needs_python(raw: DataFrame, names: Sequence[str], *, value: str = "value",
                 codec: Codec | None = None) -> bool:
    """Whether any row of `raw` is single-object encoded with a fingerprint no shipped version
    of `names` has: the only rows the Python fallback decodes (one Spark job, no Python).
    Without such a row `python_fallback=False` gives what `True` gives, without the pass."""
    from pyspark.sql import functions as F

    codec = codec or default_codec()
    val = F.col(value)
    header = F.substring(val, 1, HEADER_LEN)
    fingerprints = [F.lit(MARKER + sv.fingerprint) for n in names for sv in codec.versions(n)]
    stranger = ((F.length(val) >= HEADER_LEN) & (F.substring(val, 1, 2) == F.lit(MARKER))
                & ~header.isin(*fingerprints))
    return bool(raw.filter(stranger).limit(1).count() > 0)


def left_to_python(decoded: DataFrame) -> bool:
    """Whether a frame decoded with `python_fallback=False` holds a row the fallback would
    have decoded (its error says its fingerprint is unknown): `needs_python`'s question asked
    after the decode, of a kept frame, so that the Kafka rows need not be kept too."""
    from pyspark.sql import functions as F

    return bool(decoded.filter(F.col("decode_error").startswith(UNKNOWN_FINGERPRINT))
                .limit(1).count() > 0)


def _required_field(schema: Any) -> str:
    """The first field of a record schema that cannot be null (every apexps record has one)."""
    for field in schema["fields"]:
        ty = field["type"]
        if not (isinstance(ty, list) and "null" in ty) and ty != "null":
            return str(field["name"])
    raise ValueError(f"schema {schema.get('name')} has no field that cannot be null")


def _from_avro(body: Column, writer: SchemaVersion, reader: str) -> Column:
    from pyspark.sql.avro.functions import from_avro

    options = {"mode": "PERMISSIVE", "avroSchema": reader}
    return from_avro(body, json.dumps(writer.raw), options)


def _fallback_type(names: list[str], rec_types: list[Any]) -> Any:
    from pyspark.sql import types as t

    return t.StructType([
        t.StructField("schema", t.StringType()),
        *[t.StructField(record_column(n), ty) for n, ty in zip(names, rec_types, strict=True)],
        t.StructField("error", t.StringType()),
    ])


def _fallback_udf(names: list[str], rec_types: list[Any]) -> Any:
    """The Python codec's decode of one value into the fallback struct (see the module doc);
    each executor uses its own default codec (the schema directory it sees)."""

    def decode(value: bytes | bytearray | None) -> tuple[Any, ...] | None:
        from common.errors import ApexpsError

        if value is None:
            return None
        nothing = (None,) * len(names)
        try:
            name, rec = default_codec().decode(bytes(value))
        except (ApexpsError, ValueError) as exc:
            return (None, *nothing, str(exc))
        if name not in names:
            return (None, *nothing, f"expected a {' or '.join(names)} record, found {name}")
        recs = [_to_spark(rec, ty) if n == name else None
                for n, ty in zip(names, rec_types, strict=True)]
        return (name, *recs, None)

    return decode


def _to_spark(value: Any, dtype: Any) -> Any:
    """A Python codec value as the Spark type `from_avro` gives the same field."""
    from pyspark.sql import types as t

    if value is None:
        return None
    if isinstance(dtype, t.StructType):
        return tuple(_to_spark(value.get(f.name), f.dataType) for f in dtype.fields)
    if isinstance(dtype, t.ArrayType):
        return [_to_spark(v, dtype.elementType) for v in value]
    if isinstance(dtype, t.MapType):
        return {k: _to_spark(v, dtype.valueType) for k, v in value.items()}
    return value
