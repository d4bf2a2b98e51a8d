"""The pubsub service survives `kill -9`: topics and subscriptions come back from Kafka, publishing
resumes, and subscribers that re-attach get new messages without subscribing again. Driven
through the CLI (`apexps broker`, `apexps topic`, `apexps publish`, `apexps subscribe`), as a
user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from broker.kafka_io import KafkaConfig

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

APEXPS = [sys.executable, "-m", "adapters.cli.main", "--log-level", "warning"]


@contextmanager
def _broker(config: KafkaConfig) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen([*APEXPS, "broker", "--bootstrap", config.bootstrap,
                             "--namespace", config.namespace, "--listen", "127.0.0.1:0",
                             # `apexps listen` prints every data, heartbeats included; these
                             # tests are about what survives a crash, not about idle links
                             "--heartbeat-ms", "600000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    failed = True
    try:
        line = proc.stdout.readline()
        assert line.startswith("apex: "), (line, proc.stderr.read() if proc.stderr else "")
        yield proc, line.split()[1]
        failed = False
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if failed:  # what the broker logged goes into the failure's report
            print("--- the broker's stderr (last 200 lines) ---\n"
                  + "\n".join((err or "").splitlines()[-200:]), file=sys.stderr)


def _cli(server: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APEXPS, *args, "--server", server], input=stdin,
                          capture_output=True, text=True, timeout=120)


def _subscribe(server: str, who: str, topic: str, count: int) -> subprocess.Popen[str]:
    args = [*APEXPS, "subscribe", "--server", server, "--as", who, "--topic", topic,
            "--count", str(count)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_subscribed(proc: subprocess.Popen[str]) -> None:
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "subscribed to" in line, line


def test_kill_9_keeps_topics_and_subscriptions(kafka_config: KafkaConfig) -> None:
    with _broker(kafka_config) as (proc, server):
        made = _cli(server, "topic", "create", "quotes.eq", "--as", "admin@example.com")
        assert made.returncode == 0, made.stderr
        listener = _subscribe(server, "fred@example.com", "quotes.eq", 3)
        _wait_subscribed(listener)
        pub = _cli(server, "publish", "--topic", "quotes.eq", "--lines", "--as",
                   "ibm@example.com", stdin="a\nb\nc\n")
        assert pub.returncode == 0, pub.stderr
        assert "published 3 messages" in pub.stderr
        out, _ = listener.communicate(timeout=60)
        assert [json.loads(x)["content"] for x in out.splitlines()] == ["a", "b", "c"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    with _broker(kafka_config) as (_, server):
        listed = _cli(server, "topic", "list", "--as", "admin@example.com")
        assert listed.stdout.split() == ["quotes.eq"]
        # fred's subscription survived: re-attaching is enough to receive (no new subscribe)
        # after a kill -9 fred's link begins a new epoch: its reset comes first (robust-binding
        # §2.5), then the message
        attach_only = subprocess.Popen(
            [*APEXPS, "listen", "--server", server, "--as", "fred@example.com", "--count", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert attach_only.stderr is not None
        assert "attached as" in attach_only.stderr.readline()
        pub = _cli(server, "publish", "--topic", "quotes.eq", "--as", "ibm@example.com",
                   stdin="after the crash")
        assert pub.returncode == 0, pub.stderr
        out, _ = attach_only.communicate(timeout=60)
        reset, record = (json.loads(line) for line in out.splitlines())
        assert "<linkreset" in reset["content"]
        assert record["content"] == "after the crash"
        assert record["originator"] == "apex=pubsub/quotes.eq@example.com"


def test_cli_errors_print_the_code_and_exit_nonzero(kafka_config: KafkaConfig) -> None:
    with _broker(kafka_config) as (_, server):
        missing = _cli(server, "publish", "--topic", "no.such", "--as", "ibm@example.com",
                       stdin="x")
        assert missing.returncode == 1
        assert "error 550" in missing.stderr
        dup = _cli(server, "topic", "create", "a.b", "--as", "admin@example.com")
        again = _cli(server, "topic", "create", "a.b", "--as", "admin@example.com")
        assert (dup.returncode, again.returncode) == (0, 1)
        assert "error 553" in again.stderr
    nobody = _cli("127.0.0.1:1", "topic", "list", "--as", "admin@example.com")
    assert nobody.returncode == 3 and "cannot reach the broker" in nobody.stderr
