"""Spark decoding the journal: spark-avro in the JVM vs the Python codec as a UDF vs a bare read.

    .venv/bin/python -m ops.bench.bench_spark_decode [--bootstrap HOST:PORT] [--records N]
    apexps bench spark

Writes N journal records (the broker's codec, ~200 B of content and a fields map each) to a
fresh namespace, then in one Spark local[2] session times, best of --rounds, alternating:
- count:  `spark.read.format("kafka")...load().count()`, the floor any decode sits on;
- native: `decode_journal` (broker/spark/journal_reader.py, from_avro per fingerprint), with
  its Python fallback's pass over every row, and "JVM only" without it (`python_fallback=False`);
- python: the same columns from `Codec.decode` in a Python UDF (how the journal was read before).
Both decodes are forced whole with Spark's `noop` sink, so no column is pruned. Without
--bootstrap (or APEXPS_BOOTSTRAP) it starts a throwaway local Kafka.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.codec import default_codec
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.records import Publication, PublishType
from broker.spark.journal_reader import JOURNAL_COLUMNS, decode_journal
from broker.spark.source import kafka_source

COUNT, NATIVE, JVM_ONLY, PYTHON = ("count (no decode)", "native (spark-avro)", "native, JVM only",
                                   "python UDF")


def _fill(config: KafkaConfig, n: int) -> None:
    from confluent_kafka import Producer

    core = BrokerCore(config)
    core.open()  # creates the namespace's topics
    core.close()
    codec = default_codec()
    producer = Producer({"bootstrap.servers": config.bootstrap, "linger.ms": 50})
    topic = config.topic("journal")
    for i in range(n):
        pub = Publication(topic="equity.quote", source=f"p{i % 8}@example.com",
                          content=b"<quote>" + b"x" * 190 + b"</quote>",
                          publish_type=PublishType.UPDATE, message_id=f"m{i % 500}",
                          fields={"symbol": [f"S{i % 1000:03d}"], "last": [str(i)]})
        value = codec.encode("journal_record", pub.to_avro(i // 8 + 1, 1_764_000_000_000 + i))
        while True:
            try:
                producer.produce(topic, value, pub.source.encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("kafka did not take every benchmark record")


def _python_decode(raw: Any) -> Any:
    """The journal's columns through the Python codec, one UDF call per record."""
    from pyspark.sql import functions as F

    native = decode_journal(raw)
    struct = native.select(F.struct(*JOURNAL_COLUMNS).alias("r")).schema["r"].dataType

    def decode(value: bytes | None) -> tuple[Any, ...]:
        from broker.codec import default_codec
        from common.errors import ApexpsError

        try:
            _, rec = default_codec().decode(bytes(value or b""), expect="journal_record")
        except (ApexpsError, ValueError) as exc:
            return (None,) * (len(JOURNAL_COLUMNS) - 1) + (str(exc),)
        return (*(rec.get(c) for c in JOURNAL_COLUMNS[:-1]), None)

    return raw.select(F.udf(decode, struct)(F.col("value")).alias("r")).select("r.*")


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=os.environ.get("APEXPS_BOOTSTRAP"),
                    help="an existing Kafka (default: $APEXPS_BOOTSTRAP, else a throwaway one)")
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; best kept")
    args = ap.parse_args(argv)
    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from adapters.local.kafka import LocalKafka

        kafka = LocalKafka(Path(tempfile.mkdtemp(prefix="apexps-bench-")))
        bootstrap = kafka.start().bootstrap
    try:
        from adapters.local.spark import local_session

        config = KafkaConfig(bootstrap=bootstrap, namespace=f"bench{uuid.uuid4().hex[:8]}")
        print(f"writing {args.records} journal records ...", file=sys.stderr, flush=True)
        _fill(config, args.records)
        spark = local_session(app_name="bench-spark-decode")
        raw = kafka_source(spark, config, "journal")
        runs: dict[str, Callable[[], object]] = {
            COUNT: raw.count,
            NATIVE: lambda: decode_journal(raw).write.format("noop").mode("overwrite").save(),
            JVM_ONLY: lambda: decode_journal(raw, python_fallback=False)
            .write.format("noop").mode("overwrite").save(),
            PYTHON: lambda: _python_decode(raw).write.format("noop").mode("overwrite").save(),
        }
        errors = decode_journal(raw).where("decode_error IS NOT NULL").count()
        if raw.count() != args.records or errors:
            raise RuntimeError(f"read back {raw.count()} records, {errors} undecodable")
        best: dict[str, float] = {}
        for r in range(args.rounds):
            for name, run in runs.items():
                print(f"round {r + 1}/{args.rounds}: {name} ...", file=sys.stderr, flush=True)
                best[name] = min(best.get(name, float("inf")), _timed(run))
        spark.stop()
        print(f"\n{args.records} journal records, Spark local[2], best of {args.rounds}\n")
        print(f"{'':22}{'records/s':>12}{'seconds':>10}")
        for name, secs in best.items():
            print(f"{name:22}{args.records / secs:>12,.0f}{secs:>10.2f}")
        print(f"\nnative / python UDF: {best[PYTHON] / best[NATIVE]:.2f}x faster "
              f"(JVM only: {best[PYTHON] / best[JVM_ONLY]:.2f}x)")
        print(f"native / bare count: {best[COUNT] / best[NATIVE]:.2f}x the rate of reading alone "
              f"(JVM only: {best[COUNT] / best[JVM_ONLY]:.2f}x)")
    finally:
        if kafka is not None:
            kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
