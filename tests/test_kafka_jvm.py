"""The local Kafka's JVM command line: G1 unless the operator says otherwise, as with Kafka's own
scripts, and a GC log in the data directory (pauses are what a p99 looks for first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.local.kafka import LocalKafka


def _cmd(tmp_path: Path) -> list[str]:
    return LocalKafka(tmp_path, heap="512m")._java([tmp_path / "a.jar", tmp_path / "b.jar"])


def test_default_flags_and_gc_log_in_the_data_dir(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_JVM_PERFORMANCE_OPTS", raising=False)
    cmd = _cmd(tmp_path)
    assert "-Xmx512m" in cmd and "-XX:+UseG1GC" in cmd
    [gc] = [a for a in cmd if a.startswith("-Xlog:gc:")]
    assert gc.split(":")[2] == f"file={tmp_path / 'logs' / 'gc.log'}"
    # the JVM takes options before the class path; the main class follows it
    assert cmd.index(gc) < cmd.index("-cp")


def test_an_operators_performance_opts_replace_the_defaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_JVM_PERFORMANCE_OPTS", "-XX:+UseSerialGC  -Dx=1")
    cmd = _cmd(tmp_path)
    assert "-XX:+UseSerialGC" in cmd and "-Dx=1" in cmd
    assert "-XX:+UseG1GC" not in cmd and "" not in cmd
    assert "-Xmx512m" in cmd  # the heap is the --heap setting's, whatever the options
