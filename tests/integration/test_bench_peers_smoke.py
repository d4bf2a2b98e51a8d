"""A tiny run of ops/bench/bench_peers.py against the suite's Kafka: raw Kafka, apexps plain
and robust, W3 (the workload with content selectors on the wire; W1 and W2 run the same
processes), 200 messages, the real processes (broker, publisher, subscribers) and the real
wire. It checks the benchmark works end to end (every message delivered, each figure printed),
not any figure's value; about 15 s (a broker start per case is most of it)."""

from __future__ import annotations

import pytest

from ops.bench import bench_peers as bp


def test_a_tiny_run_delivers_everything_and_prints_every_figure(
        kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    """W3 with 200 messages, raw Kafka (ten consumers, each keeping its symbol), plain and
    robust: each of the ten subscribers gets its twenty and nothing of another symbol, and the
    table has the row, apexps's ratio to raw Kafka and each process's CPU."""
    assert bp.main(["--bootstrap", kafka_bootstrap, "--runs", "1", "--messages", "200",
                    "--systems", "kafka,plain,robust", "--workloads", "W3"]) == 0
    out = capsys.readouterr().out
    assert "INCOMPLETE" not in out and "WRONG" not in out
    for workload in ("W3",):
        for system in ("kafka", "plain", "robust"):
            [line] = [line for line in out.splitlines()
                      if line.startswith(f"  run 1 {workload} {system}:")]
            assert "complete 1.00, wrong 0.00" in line and "cpu_kafka_us" in line
            part = "Kafka" if system == "kafka" else "broker"  # raw Kafka has no broker
            assert f"  {workload} {system:10} {part} " in out
    [row] = [line for line in out.splitlines() if line.startswith("W3 1->10, a tenth each")]
    assert row.count("x]") == 2  # plain's and robust's ratios to raw Kafka
