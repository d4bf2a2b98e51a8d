"""The Spark jobs on a real standalone cluster (tests/spark_cluster.py): executors that do not
have apexps get its Python shipped by the session, and the journal read there equals local
mode's, row for row, the Python fallback's rows included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.codec import MARKER
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, KafkaProducer
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
