"""The README's run command, end to end: `apexps up` brings up Kafka and the broker, Ctrl-C
stops both; `apexps kafka status` reports it meanwhile."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker.speedups import ACCELERATORS

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

APEXPS = [sys.executable, "-m", "adapters.cli.main"]


def test_up_serves_then_ctrl_c_stops_broker_and_kafka(tmp_path: Path) -> None:
    """`apexps up` prints the Kafka and APEX addresses, status says running, SIGINT exits 0
    and leaves no Kafka behind."""
    data = tmp_path / "state"
    proc = subprocess.Popen([*APEXPS, "up", "--data-dir", str(data), "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        kafka_line = proc.stdout.readline()
        apex_line = proc.stdout.readline()
        assert kafka_line.startswith("kafka: 127.0.0.1:"), kafka_line
        assert apex_line.startswith("apex: 127.0.0.1:"), apex_line
        status = subprocess.run([*APEXPS, "kafka", "status", "--data-dir", str(data), "--json"],
                                capture_output=True, text=True)
        info = json.loads(status.stdout)
        assert status.returncode == 0 and info["running"]
        assert info["bootstrap"] == kafka_line.split()[1]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "broker stopped" in err
    ready = [json.loads(line) for line in err.splitlines() if "broker ready" in line]
    assert ready and ready[0]["compiled"] == "{0}/{0}".format(len(ACCELERATORS))
    after = subprocess.run([*APEXPS, "kafka", "status", "--data-dir", str(data)],
                           capture_output=True, text=True)
    assert after.returncode == 3 and "running: False" in after.stdout


def test_kafka_start_stop_keeps_data_dir_and_address(tmp_path: Path) -> None:
    """`apexps kafka start` twice on one data dir reuses the running Kafka's address; stop
    ends it and a second stop says it is not running."""
    args = ["--data-dir", str(tmp_path)]
    first = subprocess.run([*APEXPS, "kafka", "start", *args], capture_output=True, text=True)
    try:
        assert first.returncode == 0, first.stderr
        again = subprocess.run([*APEXPS, "kafka", "start", *args], capture_output=True,
                               text=True)
        assert again.stdout == first.stdout
    finally:
        stop = subprocess.run([*APEXPS, "kafka", "stop", *args], capture_output=True, text=True)
    assert stop.stdout.strip() == "stopped"
    assert (tmp_path / "kafka" / "kafka-logs" / "meta.properties").exists()
    again = subprocess.run([*APEXPS, "kafka", "stop", *args], capture_output=True, text=True)
    assert again.stdout.strip() == "not running"
