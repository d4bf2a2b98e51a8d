"""`apexps watch` as a user runs it against a broker process: the grant on stderr, then one
JSON line per Notify (the current state first, then each event with its name, then the end
with its reason); refusals exit 1 with the broker's code, bad usage exits 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from broker.kafka_io import KafkaConfig
from tests.integration.test_pubsub_crash import APEXPS, _broker, _cli

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _publish(server: str, tmp: Path, body: str, ptype: str) -> None:
    path = tmp / "m.xml"
    path.write_text(body)
    done = _cli(server, "publish", "--topic", "q.w", "--as", "pub@example.com",
                "--content-type", "application/xml", "--type", ptype, "--message-id", "IBM",
                str(path))
    assert done.returncode == 0, done.stderr


def test_watch_prints_each_notify_as_a_json_line(kafka_config: KafkaConfig,
                                                 tmp_path: Path) -> None:
    """Created/modified/deleted by name, the current state first, the end with its reason."""
    with _broker(kafka_config) as (_, server):
        assert _cli(server, "topic", "create", "q.w", "--as", "pub@example.com").returncode == 0
        _publish(server, tmp_path, "<q v='1' />", "image")
        watcher = subprocess.Popen(
            [*APEXPS, "watch", "q.w/IBM", "--server", server, "--as", "jade@example.com",
             "--events", "modified,deleted", "--expires", "permanent"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert watcher.stdout is not None and watcher.stderr is not None
        said = watcher.stderr.readline()
        assert "watching q.w/IBM as 1 for permanent" in said, said
        first = json.loads(watcher.stdout.readline())
        assert (first["state"], first["current"], first["events"]) == ("active", True, [])
        assert [v["content"] for v in first["versions"]] == ["<q v='1' />"]
        assert isinstance(first["linkseq"], int)
        _publish(server, tmp_path, "<q v='2' />", "update")
        modified = json.loads(watcher.stdout.readline())
        assert modified["events"] == ["modified"]
        assert modified["versions"][0]["content"] == "<q v='2' />"
        assert modified["linkseq"] == first["linkseq"] + 1
        _publish(server, tmp_path, "<gone />", "drop")
        out, err = watcher.communicate(timeout=60)
        deleted, ended = (json.loads(x) for x in out.splitlines())
        assert deleted["events"] == ["deleted"]
        assert (ended["state"], ended["reason"]) == ("terminated", "noresource")
        assert watcher.returncode == 0, err

        # a timed watch that runs out: its end is the last line, reason timeout
        late = _cli(server, "watch", "q.w/IBM", "--as", "tom@example.com", "--events",
                    "created", "--expires", "1")
        assert late.returncode == 0, late.stderr
        lines = [json.loads(x) for x in late.stdout.splitlines()]
        assert [(x["state"], x["reason"]) for x in lines] == [("active", None),
                                                              ("terminated", "timeout")]
        assert lines[0]["versions"] == []  # dropped: no state, an empty current Notify

        # --refresh: the watch is refreshed before it runs out, each time with the current
        # state (§3.3.2), and never ends
        kept = _cli(server, "watch", "q.w/IBM", "--as", "sam@example.com", "--events",
                    "created", "--expires", "2", "--refresh", "--count", "3")
        assert kept.returncode == 0, kept.stderr
        assert [(x["state"], x["current"]) for x in map(json.loads, kept.stdout.splitlines())
                ] == [("active", True)] * 3

        # refusals: the broker's code, exit 1; bad usage: exit 2
        nope = _cli(server, "watch", "q.none/IBM", "--as", "jade@example.com", "--events",
                    "created")
        assert nope.returncode == 1 and "550" in nope.stderr, nope.stderr
        odd = _cli(server, "watch", "q.w/IBM", "--as", "jade@example.com", "--events", "4")
        assert odd.returncode == 2 and "not understood" in odd.stderr, odd.stderr


def test_the_brokers_watch_policy_options(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """`apexps broker --watch-expires MIN:MAX --no-permanent-watch`: below MIN is 572 naming
    the minimum, permanent is granted as MAX."""
    proc = subprocess.Popen(
        [*APEXPS, "broker", "--bootstrap", kafka_config.bootstrap, "--namespace",
         kafka_config.namespace, "--listen", "127.0.0.1:0", "--heartbeat-ms", "600000",
         "--watch-expires", "5:100", "--no-permanent-watch"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith("apex: "), line
        server = line.split()[1]
        assert _cli(server, "topic", "create", "q.p", "--as", "pub@example.com").returncode == 0
        brief = _cli(server, "watch", "q.p/A", "--as", "jade@example.com", "--events",
                     "created", "--expires", "2")
        assert brief.returncode == 1 and "572" in brief.stderr and "minimum 5" in brief.stderr
        capped = _cli(server, "watch", "q.p/A", "--as", "jade@example.com", "--events",
                      "created", "--expires", "permanent", "--count", "1")
        assert capped.returncode == 0, capped.stderr
        assert "for 100s" in capped.stderr
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


APPROVAL_ACCESS = """<access domain='example.com'>
  <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
  <deny id='fred' originator='fred@example.com' tokens='pubsub:deletetopic' topic='q.c' />
</access>
"""


def test_watch_decide_approves_and_rejects(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """`apexps broker --approve-watches TOPIC` holds watches pending; `apexps watch-decide`
    approves one (the watcher prints pending, then active with the state) or rejects one (the
    watcher prints terminated/rejected and exits); a refusal exits 1 with the code, bad usage
    2, no broker 3."""
    access = tmp_path / "access.xml"
    access.write_text(APPROVAL_ACCESS)
    proc = subprocess.Popen(
        [*APEXPS, "broker", "--bootstrap", kafka_config.bootstrap, "--namespace",
         kafka_config.namespace, "--listen", "127.0.0.1:0", "--heartbeat-ms", "600000",
         "--access", str(access), "--approve-watches", "q.c"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    watchers: list[subprocess.Popen[str]] = []
    try:
        line = proc.stdout.readline()
        assert line.startswith("apex: "), line
        server = line.split()[1]
        assert _cli(server, "topic", "create", "q.c", "--as", "pub@example.com").returncode == 0
        path = tmp_path / "m.xml"
        path.write_text("<q v='1' />")
        assert _cli(server, "publish", "--topic", "q.c", "--as", "pub@example.com",
                    "--content-type", "application/xml", "--type", "image", "--message-id",
                    "IBM", str(path)).returncode == 0

        def watcher(wid: str) -> subprocess.Popen[str]:
            w = subprocess.Popen(
                [*APEXPS, "watch", "q.c/IBM", "--server", server, "--as", "jade@example.com",
                 "--events", "modified", "--id", wid, "--count", "2"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            watchers.append(w)
            assert w.stdout is not None and w.stderr is not None
            said = w.stderr.readline()
            assert f"watching q.c/IBM as {wid}" in said, said
            first = json.loads(w.stdout.readline())
            assert (first["state"], first["current"], first["versions"]) == ("pending", False,
                                                                              [])
            return w

        def decide(who: str, wid: str, *verdict: str) -> subprocess.CompletedProcess[str]:
            return _cli(server, "watch-decide", "q.c/IBM", "--as", who, "--subscriber",
                        "jade@example.com", "--id", wid, *verdict)

        approved = watcher("a")
        nope = decide("fred@example.com", "a", "--approve")
        assert nope.returncode == 1 and "537" in nope.stderr, nope.stderr
        assert "pubsub:deletetopic" in nope.stderr, nope.stderr  # what it takes
        unknown = decide("pub@example.com", "zz", "--approve")
        assert unknown.returncode == 1 and "550" in unknown.stderr, unknown.stderr
        done = decide("pub@example.com", "a", "--approve")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"resource": "q.c/IBM", "subscriber":
                                           "jade@example.com", "id": "a",
                                           "verdict": "approve", "result": "ok"}
        out, err = approved.communicate(timeout=60)
        assert approved.returncode == 0, err
        (started,) = [json.loads(x) for x in out.splitlines()]
        assert (started["state"], started["current"]) == ("active", True)
        assert [v["content"] for v in started["versions"]] == ["<q v='1' />"]

        rejected = watcher("r")
        assert decide("pub@example.com", "r", "--reject").returncode == 0
        out, err = rejected.communicate(timeout=60)
        assert rejected.returncode == 0, err
        (ended,) = [json.loads(x) for x in out.splitlines()]
        assert (ended["state"], ended["reason"]) == ("terminated", "rejected")

        for usage in ((), ("--approve", "--reject")):
            bad = decide("pub@example.com", "a", *usage)
            assert bad.returncode == 2, bad.stderr
        away = subprocess.run([*APEXPS, "watch-decide", "q.c/IBM", "--as", "pub@example.com",
                               "--subscriber", "jade@example.com", "--id", "a", "--approve",
                               "--server", "127.0.0.1:1"],
                              capture_output=True, text=True, timeout=120)
        assert away.returncode == 3 and "cannot reach the broker" in away.stderr, away.stderr
    finally:
        for w in watchers:
            if w.poll() is None:
                w.kill()
                w.communicate(timeout=60)
        proc.terminate()
        proc.communicate(timeout=60)
