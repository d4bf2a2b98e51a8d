"""The pure parts of ops/bench/bench_kafka_gc.py: reading JDK 17's safepoint log lines (every
collector's pauses, and the VM's own) and summing them up."""

from __future__ import annotations

import pytest

from ops.bench import bench_kafka_gc as gc

_T = "[2026-11-26T01:00:42.001+0000][6.001s] "
LOG = "\n".join((
    _T + "Using G1",
    _T + 'Safepoint "G1CollectForAllocation", Time since last: 812 ns, Reaching safepoint:'
         " 95000 ns, At safepoint: 27600000 ns, Total: 27695000 ns",
    _T + "GC(3) Pause Young (Normal) (G1 Evacuation Pause) 60M->12M(256M) 27.512ms",
    _T + 'Safepoint "Cleanup", Time since last: 1000000000 ns, Reaching safepoint: 15000000'
         " ns, At safepoint: 4183 ns, Total: 15004183 ns",
    _T + 'Safepoint "ZMarkStart", Time since last: 1 ns, Reaching safepoint: 100 ns, At'
         " safepoint: 1900 ns, Total: 2000 ns"))


def test_every_safepoint_is_read_with_its_operation_and_milliseconds() -> None:
    """Safepoint lines only (not the collector's own pause lines), Total in ms."""
    assert gc.safepoints(LOG.splitlines()) == [
        ("G1CollectForAllocation", 27.695), ("Cleanup", 15.004183), ("ZMarkStart", 0.002)]


def test_the_collectors_pauses_are_told_from_the_vms_own() -> None:
    """G1's and ZGC's operations count as the collector's; Cleanup is the VM's."""
    ops = [op for op, _ in gc.safepoints(LOG.splitlines())]
    assert [bool(gc._GC_OPS.search(op)) for op in ops] == [True, False, True]


def test_the_summary_gives_count_total_mean_p99_and_max() -> None:
    summary = gc.pause_summary([1.0] * 99 + [50.0])
    assert summary == ("100 safepoints, total 149.0 ms, mean 1.49 ms, p99 50.00 ms,"
                       " max 50.00 ms")
    assert gc.pause_summary([]) == "no safepoints"


@pytest.mark.parametrize("argv", [["--collectors", "CMS"], ["--jits", "C2"], ["--jits", ""],
                                  ["--runs", "0"], ["--rounds", "0"]])
def test_a_bad_choice_is_a_usage_error_before_any_kafka_starts(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        gc.main(argv)
    assert exit_.value.code == 2
    assert "usage:" in capsys.readouterr().err
