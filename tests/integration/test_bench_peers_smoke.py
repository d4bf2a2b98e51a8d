"""A tiny run of ops/bench/bench_peers.py against the suite's Kafka: apexps plain and robust,
W3 (the workload with content selectors on the wire; W1 and W2 run the same processes), 200
messages, the real processes (broker, publisher, subscribers) and the real wire. It checks
the benchmark works end to end (every message delivered, each figure printed), not any
figure's value; about 15 s (a broker start per case is most of it)."""

from __future__ import annotations

import pytest

from ops.bench import bench_peers as bp


def test_a_tiny_run_delivers_everything_and_prints_every_figure(
        kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    """W3 with 200 messages, plain and robust: each of the ten selecting subscribers gets its
    twenty and nothing of another symbol, and the table has the row and each process's CPU."""
    assert bp.main(["--bootstrap", kafka_bootstrap, "--runs", "1", "--messages", "200",
                    "--systems", "plain,robust", "--workloads", "W3"]) == 0
    out = capsys.readouterr().out
    assert "INCOMPLETE" not in out and "WRONG" not in out
    for workload in ("W3",):
        for system in ("plain", "robust"):
            [line] = [line for line in out.splitlines()
                      if line.startswith(f"  run 1 {workload} {system}:")]
            assert "complete 1.00, wrong 0.00" in line and "cpu_kafka_us" in line
            assert f"  {workload} {system:10} broker " in out
    assert "W3 1->10, a tenth each" in out
