"""Session-wide fixtures: the real local Kafka (see tests/kafka_fixture.py) and one SparkSession."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest_plugins = ["tests.kafka_fixture"]


@pytest.fixture(scope="session", name="spark")
def _spark() -> Iterator[Any]:
    """One local[2] SparkSession for the whole run (starting one costs seconds)."""
    from ops.spark_session import local_session

    session = local_session(app_name="apexps-tests")
    yield session
    session.stop()
