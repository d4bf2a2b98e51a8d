"""Session-wide fixtures: the real local Kafka (tests/kafka_fixture.py), a headless browser
(tests/browser.py), a Spark standalone cluster (tests/spark_cluster.py) and one local
SparkSession."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import structlog

pytest_plugins = ["tests.kafka_fixture", "tests.browser", "tests.spark_cluster"]


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """Tests that run the CLI configure structlog; put the defaults back after each."""
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session", name="spark")
def _spark() -> Iterator[Any]:
    """One local[2] SparkSession for the whole run (starting one costs seconds)."""
    from adapters.local.spark import local_session

    # The audit and replay tests leave cached DataFrames on this one session, and the selector
    # conformance test then builds deep CASE WHEN trees in the driver's analyzer: at the
    # default 2 GB that ran out of heap at the end of a full run.
    session = local_session(app_name="apexps-tests", conf={"spark.driver.memory": "6g"})
    yield session
    session.stop()
