"""The ways to run apexps agree with each other: compose.yaml, the local Kafka, the CLI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from adapters.cli.client_cmd import DEFAULT_APEX_PORT
from adapters.cli.main import build_parser
from adapters.local.kafka import KAFKA_POM
from broker.kafka_io import KafkaConfig

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_kafka_version_matches_the_local_kafka() -> None:
    """The container image runs the same Kafka version ops/kafka/pom.xml provisions."""
    pom_version = re.search(r"<kafka.version>([^<]+)<", KAFKA_POM.read_text()).group(1)
    assert _compose()["services"]["kafka"]["image"] == f"apache/kafka:{pom_version}"


def test_compose_broker_points_at_compose_kafka_and_default_layout() -> None:
    """The broker's bootstrap is the Kafka service's advertised listener, its namespace and
    APEX port are the local defaults, and the port is published."""
    services = _compose()["services"]
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    args = build_parser().parse_args(services["apexps"]["command"])
    assert f"PLAINTEXT://{args.bootstrap}" == advertised
    assert args.namespace == KafkaConfig().namespace
    assert args.listen[1] == DEFAULT_APEX_PORT
    assert f"{DEFAULT_APEX_PORT}:{DEFAULT_APEX_PORT}" in services["apexps"]["ports"]


def test_help_lists_every_command_group() -> None:
    """`apexps --help` names each command a user needs and exits 0."""
    out = subprocess.run([sys.executable, "-m", "adapters.cli.main", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for command in ("up", "broker", "kafka", "access", "selector", "bench", "send", "listen"):
        assert re.search(rf"^\s+{command}\s", out, re.M), command


def test_bad_usage_exits_2_with_a_message() -> None:
    """A malformed --listen is refused by the parser with exit 2 and says what it expected."""
    proc = subprocess.run([sys.executable, "-m", "adapters.cli.main", "broker", "--bootstrap",
                           "x:1", "--listen", "nonsense"], capture_output=True, text=True)
    assert proc.returncode == 2 and "HOST:PORT" in proc.stderr
