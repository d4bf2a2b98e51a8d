"""The real Kafka every integration test talks to.

`APEXPS_BOOTSTRAP=HOST:PORT` points the suite at an existing cluster (bring your own);
otherwise the suite starts its own single-node Kafka from ops/ in a temporary data directory and
stops it at the end. There is no fallback: if no Kafka can be had, the tests fail, never skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.local.kafka import LocalKafka
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, answers, drop_namespace


@pytest.fixture(scope="session", name="kafka_bootstrap")
def _kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of the suite's Kafka (started here unless APEXPS_BOOTSTRAP is set)."""
    given = os.environ.get("APEXPS_BOOTSTRAP")
    if given:
        assert answers(given, timeout_s=15), f"APEXPS_BOOTSTRAP={given} does not answer"
        yield given
        return
    kafka = LocalKafka(tmp_path_factory.mktemp("kafka"))
    state = kafka.start()
    try:
        yield state.bootstrap
    finally:
        kafka.stop()


@pytest.fixture(name="kafka_config")
def _kafka_config(kafka_bootstrap: str) -> Iterator[KafkaConfig]:
    """A KafkaConfig with a namespace of its own, so each test has fresh apexps topics; they
    are deleted after the test."""
    config = KafkaConfig(bootstrap=kafka_bootstrap, namespace=f"t{uuid.uuid4().hex[:12]}")
    yield config
    # Kafka holds a descriptor per segment and this machine allows a process 20,000, which
    # even root cannot raise: a Kafka that kept every test's ~15 partitions died with "Too many
    # open files" after about 1,500 namespaces.
    drop_namespace(config)


@pytest.fixture(name="core")
def _core(kafka_config: KafkaConfig) -> Iterator[BrokerCore]:
    """An opened BrokerCore on fresh topics of the suite's Kafka, as `apexps broker` opens it."""
    core = BrokerCore(kafka_config)
    core.open()
    yield core
    core.close()


@pytest.fixture(name="private_kafka")
def _private_kafka(tmp_path: Path) -> Iterator[LocalKafka]:
    """A Kafka of the test's own, for tests that stop, restart or kill Kafka itself."""
    kafka = LocalKafka(tmp_path / "kafka")
    try:
        yield kafka
    finally:
        kafka.stop()
