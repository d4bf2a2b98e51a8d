"""The local Kafka's JVM command line: the measured default collector unless `gc=` or the
operator says otherwise (as with Kafka's own scripts), and a GC and safepoint log in the data
directory (pauses are what a p99 looks for first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.local.kafka import COLLECTORS, DEFAULT_GC, DEFAULT_JIT, JITS, LocalKafka


def _cmd(tmp_path: Path) -> list[str]:
    return LocalKafka(tmp_path, heap="512m")._java([tmp_path / "a.jar", tmp_path / "b.jar"])


def test_default_flags_and_gc_log_in_the_data_dir(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_JVM_PERFORMANCE_OPTS", raising=False)
    cmd = _cmd(tmp_path)
    assert "-Xmx512m" in cmd and COLLECTORS[DEFAULT_GC][0] in cmd
    [gc] = [a for a in cmd if a.startswith("-Xlog:")]
    # every safepoint, whatever the collector: ZGC's pauses are not on the gc tag alone
    assert gc.split(":")[1] == "gc,safepoint"
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


@pytest.mark.parametrize("gc", sorted(COLLECTORS))
def test_each_collector_can_be_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      gc: str) -> None:
    """`LocalKafka(gc=...)` (and `apexps kafka start --gc`) puts that collector's flag on the
    command line, and no other collector's."""
    monkeypatch.delenv("KAFKA_JVM_PERFORMANCE_OPTS", raising=False)
    cmd = LocalKafka(tmp_path, gc=gc)._java([tmp_path / "a.jar"])
    chosen = [flag for flags in COLLECTORS.values() for flag in flags if flag in cmd]
    assert chosen == list(COLLECTORS[gc])


def test_an_unknown_collector_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown collector 'CMS'"):
        LocalKafka(tmp_path, gc="CMS")


@pytest.mark.parametrize("gc", sorted(COLLECTORS))
def test_kafka_start_offers_every_collector(tmp_path: Path, gc: str) -> None:
    """`apexps kafka start --gc NAME` reaches LocalKafka for each of COLLECTORS (the CLI spells
    the names out itself, so they must not drift apart)."""
    from adapters.cli.kafka_cmd import _kafka
    from adapters.cli.main import build_parser

    args = build_parser().parse_args(["kafka", "start", "--data-dir", str(tmp_path), "--gc", gc])
    assert _kafka(args).gc == gc
    default = build_parser().parse_args(["kafka", "start", "--data-dir", str(tmp_path)])
    assert _kafka(default).gc == DEFAULT_GC


@pytest.mark.parametrize("jit", sorted(JITS))
def test_each_jit_mode_can_be_chosen_and_the_cli_offers_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jit: str) -> None:
    """`LocalKafka(jit=...)` puts that mode's flags on the command line and no other's, and
    `apexps kafka start --jit NAME` reaches it (the CLI spells the names out itself)."""
    from adapters.cli.kafka_cmd import _kafka
    from adapters.cli.main import build_parser

    monkeypatch.delenv("KAFKA_JVM_PERFORMANCE_OPTS", raising=False)
    cmd = LocalKafka(tmp_path, jit=jit)._java([tmp_path / "a.jar"])
    chosen = [flag for flags in JITS.values() for flag in flags if flag in cmd]
    assert chosen == list(JITS[jit])
    args = build_parser().parse_args(["kafka", "start", "--data-dir", str(tmp_path), "--jit", jit])
    assert _kafka(args).jit == jit
    default = build_parser().parse_args(["kafka", "start", "--data-dir", str(tmp_path)])
    assert _kafka(default).jit == DEFAULT_JIT


def test_an_unknown_jit_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown JIT mode 'C2'"):
        LocalKafka(tmp_path, jit="C2")
