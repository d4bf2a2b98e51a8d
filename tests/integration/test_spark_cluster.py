"""The Spark jobs on a real standalone cluster (tests/spark_cluster.py): executors that do not
have apexps get its Python shipped by the session; the journal read there equals local mode's,
row for row, the Python fallback's rows included; `apexps audit --master spark://...` of a
real history gives local mode's summary and findings."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from adapters.cli.main import main
from broker.codec import MARKER
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.kafka_producer import KafkaProducer
from broker.records import Publication, PublishType
from broker.spark.journal_reader import load_journal
from tests.spark_cluster import SparkCluster, run_on_cluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]


def _rows(df: Any) -> list[dict[str, Any]]:
    rows = [r.asDict(recursive=True) for r in df.collect()]
    return sorted(rows, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))


def journal_on_cluster(spark: Any, bootstrap: str, namespace: str) -> dict[str, Any]:
    """(Run in the cluster job's driver.) The journal's rows, and where executors found broker."""
    config = KafkaConfig(bootstrap=bootstrap, namespace=namespace)
    found = spark.sparkContext.parallelize([0], 1).map(
        lambda _: __import__("broker").__file__).collect()
    return {"rows": _rows(load_journal(spark, config)), "broker_file": found[0],
            "master": spark.sparkContext.master}


def _write_history(config: KafkaConfig) -> None:
    core = BrokerCore(config)
    core.open()
    try:
        for i in range(40):
            core.journal.append_sync(Publication(
                topic=f"t{i % 2}", source=f"p{i % 3}@example.com",
                content=f"<q n='{i}'/>".encode(), publish_type=PublishType.UPDATE,
                message_id=f"m{i}" if i % 2 else None, fields={"n": [str(i)]}))
    finally:
        core.close()
    producer = KafkaProducer(config)
    # A record of a schema nobody ships (decoded by the Python fallback, on the executors) and
    # one that is not Avro at all: both must become rows with the same errors as in local mode.
    producer.produce_sync(config.topic("journal"), b"x", MARKER + b"\x01" * 8 + b"\x02body",
                          partition=0)
    producer.produce_sync(config.topic("journal"), b"y", b"not avro", partition=1)
    producer.close()


def test_journal_on_the_cluster_equals_local_mode(kafka_config: KafkaConfig, spark: Any,
                                                  spark_cluster: SparkCluster,
                                                  tmp_path: Path) -> None:
    """load_journal through a standalone master and worker gives local mode's rows exactly."""
    _write_history(kafka_config)
    local = _rows(load_journal(spark, kafka_config))
    assert len(local) == 42
    assert sum(r["decode_error"] is not None for r in local) == 2

    got = run_on_cluster(spark_cluster, "tests.integration.test_spark_cluster:journal_on_cluster",
                         tmp_path, bootstrap=kafka_config.bootstrap,
                         namespace=kafka_config.namespace)
    assert got["master"] == spark_cluster.master_url
    # The executors' broker came from the zip the session shipped, not from an install.
    assert ".zip/broker/__init__.py" in got["broker_file"], got["broker_file"]
    assert got["rows"] == local
    apps = spark_cluster.status()["completedapps"]
    assert any(a["name"] == "apexps-cluster-test" for a in apps)


def _audit_result(spark: Any, out: Path, code: int) -> dict[str, Any]:
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("generated_at")
    findings = [r.asDict() for r in spark.read.parquet(str(out / "findings")).collect()]
    return {"code": code, "summary": summary,
            "findings": sorted(findings, key=lambda f: repr(sorted(f.items()))),
            "report": (out / "report.html").is_file()}


def audit_on_cluster(spark: Any, bootstrap: str, namespace: str, out: str) -> dict[str, Any]:
    """(Run in the cluster job's driver.) `apexps audit --master` the cluster's URL."""
    code = main(["audit", "--bootstrap", bootstrap, "--namespace", namespace, "--out", out,
                 "--master", spark.sparkContext.master])
    return _audit_result(spark, Path(out), code)


def test_the_audit_on_the_cluster_equals_local_mode(kafka_bootstrap: str, spark: Any,
                                                    spark_cluster: SparkCluster,
                                                    tmp_path: Path) -> None:
    """The audit of a real history (a broker over BEEP, links, a denied token) through the
    standalone cluster: the same exit status, summary and findings as on local[2]."""
    from tests.integration.test_audit import _build

    config = KafkaConfig(bootstrap=kafka_bootstrap, namespace=f"c{uuid.uuid4().hex[:12]}")
    asyncio.run(_build(config))
    local_out = tmp_path / "local"
    local = _audit_result(spark, local_out, main([
        "audit", "--bootstrap", kafka_bootstrap, "--namespace", config.namespace,
        "--out", str(local_out)]))
    assert local["code"] == 0 and local["summary"]["clean"] and local["report"]
    assert local["summary"]["decisions"]["total"] > 0

    got = run_on_cluster(spark_cluster, "tests.integration.test_spark_cluster:audit_on_cluster",
                         tmp_path, bootstrap=kafka_bootstrap, namespace=config.namespace,
                         out=str(tmp_path / "cluster"))
    assert got == local
