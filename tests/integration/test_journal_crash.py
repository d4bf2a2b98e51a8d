"""Invariants 1 and 2 under a crash: kill -9 the appender, restart, nothing is lost or doubled."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter

import pytest

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.records import RecordKind

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TOTAL, SOURCES, KILL_AFTER = 20_000, 3, 6_000


def _run_child(config: KafkaConfig, count: int, prefix: str,
               kill_after: int | None) -> list[tuple[str, int, str]]:
    """Run the appender; return what it acknowledged (killing it after `kill_after` acks)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.append_child", config.bootstrap,
         config.namespace, str(count), str(SOURCES), prefix],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    acks: list[tuple[str, int, str]] = []
    for line in proc.stdout:
        if line.startswith("ACK "):
            _, source, seq, ident = line.split()
            acks.append((source, int(seq), ident))
            if kill_after is not None and len(acks) == kill_after:
                proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=300) == (-signal.SIGKILL if kill_after is not None else 0)
    return acks


def test_kill_9_midway_loses_and_duplicates_nothing_acknowledged(kafka_config: KafkaConfig) -> None:
    """20,000 appends from 3 sources with a kill -9 partway: every ack is in the journal once,
    seqs keep rising across the restart, and every missing seq is explained by a GAP record."""
    first = _run_child(kafka_config, TOTAL, "a", KILL_AFTER)
    assert len(first) >= KILL_AFTER  # acks already in the pipe when the kill landed count too
    second = _run_child(kafka_config, TOTAL - len(first), "b", None)
    acked = first + second
    assert len(acked) == TOTAL

    core = BrokerCore(kafka_config)
    core.open()
    try:
        for n in range(SOURCES):
            source = f"src{n}@example.com"
            entries = list(core.journal.read_source(source, 0))
            data = [e for e in entries if e.kind is RecordKind.DATA]
            seqs = [e.source_seq for e in data]
            assert seqs == sorted(set(seqs)), "DATA seqs must rise strictly in journal order"
            ids = Counter(re.search(rb"id='([^']+)'", e.content).group(1).decode() for e in data)
            mine = [(seq, ident) for s, seq, ident in acked if s == source]
            by_seq = {e.source_seq: e for e in data}
            for seq, ident in mine:
                assert ids[ident] == 1, f"{ident} must be in the journal exactly once"
                assert f"id='{ident}'".encode() in by_seq[seq].content
            restart_seqs = [seq for s, seq, ident in second if s == source]
            before = [seq for s, seq, ident in first if s == source]
            assert min(restart_seqs) > max(before), "seqs continue upward after the restart"
            covered = set(seqs)
            for e in entries:
                if e.kind is RecordKind.GAP:
                    covered.update(range(e.source_seq, (e.gap_to or e.source_seq) + 1))
            assert covered == set(range(1, max(seqs) + 1)), "every missing seq is explained"
    finally:
        core.close()
