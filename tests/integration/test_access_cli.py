"""`apexps access …` as an operator runs it: separate processes against the real Kafka, while a
broker-side AccessControl follows what they write."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.access import AccessControl, Token
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, watermarks

pytestmark = pytest.mark.kafka

APEXPS = [sys.executable, "-m", "adapters.cli.main", "--log-level", "warning", "access"]
JAZZ = "music.jazz.milesdavis"

Run = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(name="run")
def _run(kafka_config: KafkaConfig) -> Run:
    """Run `apexps access ARGS… --bootstrap … --namespace …` and return the finished process."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        where = ["--bootstrap", kafka_config.bootstrap, "--namespace", kafka_config.namespace]
        return subprocess.run([*APEXPS, *args, *where], capture_output=True, text=True,
                              timeout=120)

    return run


def _mark(core: BrokerCore) -> int:
    return watermarks(core.config, core.access.topic, 0)[1]


def test_allow_deny_list_check_remove(core: BrokerCore, run: Run) -> None:
    """The operator's round trip: entries made by the CLI list as JSON, `check` decides and
    names the deciding entry (exit 0 allowed, 1 denied), `remove` deletes by bare id."""
    ok = run("allow", "*@example.com", "pubsub:all", "core:data", "--id", "locals")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "allow cli:locals: *@example.com pubsub:all core:data"
    slate = run("deny", "mr.slate@example.com", "core:data", "--topic", JAZZ)
    assert slate.returncode == 0, slate.stderr
    listed = run("list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert rows["cli:locals"]["tokens"] == ["pubsub:all", "core:data"]
    (deny_id,) = [i for i, r in rows.items() if r["effect"] == "deny"]
    assert deny_id.startswith("cli:") and rows[deny_id]["topic"] == JAZZ

    allowed = run("check", "wilma@example.com", "core:data", "--topic", JAZZ)
    assert (allowed.returncode, allowed.stdout.split()[0]) == (0, "allowed")
    assert "cli:locals" in allowed.stdout
    denied = run("check", "mr.slate@example.com", "core:data", "--topic", JAZZ)
    assert (denied.returncode, denied.stdout.split()[0]) == (1, "denied")
    assert deny_id in denied.stdout

    assert run("remove", "locals").returncode == 0
    gone = run("remove", "locals")
    assert gone.returncode == 1 and "apexps access list" in gone.stderr
    table = run("list")
    assert "cli:locals" not in table.stdout and deny_id in table.stdout


def test_a_following_broker_sees_cli_writes(core: BrokerCore, run: Run) -> None:
    """A broker that follows the access topic applies `apexps access allow` without restart."""
    control = AccessControl(core.access, refresh_interval_s=0.1)
    arrived = threading.Event()
    core.access.watch(lambda key, _: arrived.set() if key == "cli:pub" else None)
    control.start_following()
    try:
        assert not control.allowed("barney@rubble.com", Token.DATA, JAZZ)
        assert run("allow", "*@*", "core:data", "--topic", JAZZ, "--id", "pub").returncode == 0
        assert arrived.wait(30)
        assert control.allowed("barney@rubble.com", Token.DATA, JAZZ)
    finally:
        control.stop_following()


def test_load_good_then_bad_file(core: BrokerCore, run: Run, tmp_path: Path) -> None:
    """`load` replaces the file entries; a bad file exits 2 naming the line and writes
    nothing."""
    good = tmp_path / "access.xml"
    good.write_text("<access domain='example.com'>\n"
                    "  <allow id='locals' originator='*@example.com' tokens='core:data'/>\n"
                    "</access>\n")
    loaded = run("load", str(good), "--domain", "example.com")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == f"loaded 1 entries from {good}"
    mark = _mark(core)
    bad = tmp_path / "bad.xml"
    bad.write_text("<access>\n"
                   "  <allow id='x' originator='*@*' tokens='core:data'/>\n"
                   "  <allow id='y' originator='*@*' tokens='core:publish'/>\n"
                   "</access>\n")
    refused = run("load", str(bad))
    assert refused.returncode == 2
    assert "line 3" in refused.stderr and "core:publish" in refused.stderr
    assert _mark(core) == mark
    listed = json.loads(run("list", "--json").stdout)
    assert [r["id"] for r in listed] == ["file:locals"]


@pytest.mark.parametrize("args", [
    ("allow", "fr*ed@example.com", "core:data"),
    ("allow", "fred@example.com", "core:publish"),
    ("deny", "fred@example.com", "core:data", "--topic", "music/jazz"),
    ("allow", "fred@example.com", "core:data", "--id", "file:sneaky"),
])
def test_bad_input_exits_2_and_writes_nothing(core: BrokerCore, run: Run,
                                              args: tuple[str, ...]) -> None:
    """A malformed pattern, unknown token, bad topic or a reserved id prefix exits 2 with a
    553 that says what is wrong, and Kafka gets no record."""
    mark = _mark(core)
    result = run(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("apexps: error 553: ")
    assert _mark(core) == mark


def test_unreachable_kafka_exits_3() -> None:
    """With no Kafka at --bootstrap, the CLI says so and exits 3."""
    result = subprocess.run([*APEXPS, "list", "--bootstrap", "127.0.0.1:1"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3 and "--bootstrap" in result.stderr


def test_unknown_namespace_is_not_created_by_a_read(kafka_config: KafkaConfig) -> None:
    """`list` on a namespace no broker used exits 1 pointing at --namespace, creating nothing."""
    result = subprocess.run([*APEXPS, "list", "--bootstrap", kafka_config.bootstrap,
                             "--namespace", kafka_config.namespace],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "--namespace" in result.stderr
    again = subprocess.run([*APEXPS, "list", "--bootstrap", kafka_config.bootstrap,
                            "--namespace", kafka_config.namespace],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1


def test_permission_token_round_trip(core: BrokerCore, run: Run, tmp_path: Path) -> None:
    """grant-token and deny-token store permtoken entries a following broker applies; list
    shows them as such; check-token decides (exit 0 delivered, 1 withheld) naming the entry;
    remove lifts a deny; the access file takes <grant-token>."""
    control = AccessControl(core.access, refresh_interval_s=0.1)
    arrived = threading.Event()
    core.access.watch(lambda key, _: arrived.set() if key == "cli:no-6747" else None)
    control.start_following()
    try:
        granted = run("grant-token", "*@example.com", "6000-6999, 7*", "--id", "desks")
        assert granted.returncode == 0, granted.stderr
        assert granted.stdout.strip() == "grant-token cli:desks: *@example.com 6000-6999,7*"
        denied = run("deny-token", "jade@example.com", "6747", "--topic", "equity.*",
                     "--id", "no-6747")
        assert denied.returncode == 0, denied.stderr
        assert arrived.wait(30)
        assert control.token_allowed("fred@example.com", "6747", "equity.quote")
        assert not control.token_allowed("jade@example.com", "6747", "equity.quote")
        assert not control.allowed("jade@example.com", Token.DATA, "equity.quote")

        rows = {r["id"]: r for r in json.loads(run("list", "--json").stdout)}
        assert (rows["cli:desks"]["kind"], rows["cli:desks"]["effect"],
                rows["cli:desks"]["tokens"]) == ("permtoken", "allow", ["6000-6999", "7*"])
        assert (rows["cli:no-6747"]["effect"], rows["cli:no-6747"]["topic"]) == \
            ("deny", "equity.*")
        table = run("list").stdout
        assert "grant-token" in table and "deny-token" in table

        withheld = run("check-token", "jade@example.com", "6747", "--topic", "equity.quote")
        assert (withheld.returncode, withheld.stdout.split()[0]) == (1, "withheld")
        assert "cli:no-6747" in withheld.stdout
        elsewhere = run("check-token", "jade@example.com", "6747", "--topic", "fx.eur")
        assert (elsewhere.returncode, elsewhere.stdout.split()[0]) == (0, "delivered")
        assert "cli:desks" in elsewhere.stdout

        assert run("remove", "no-6747").returncode == 0
        again = run("check-token", "jade@example.com", "6747", "--topic", "equity.quote")
        assert again.returncode == 0

        mark = _mark(core)
        for bad in (("grant-token", "*@*", "6000-"), ("deny-token", "j*de@example.com", "1"),
                    ("grant-token", "*@*", "6999-6000")):
            refused = run(*bad)
            assert refused.returncode == 2 and refused.stderr.startswith("apexps: error 553: ")
        assert _mark(core) == mark

        path = tmp_path / "tokens.xml"
        path.write_text("<access>\n  <grant-token id='all' subscriber='*@*' tokens='*'/>\n"
                        "</access>\n")
        assert run("load", str(path)).returncode == 0
        listed = {r["id"]: r for r in json.loads(run("list", "--json").stdout)}
        assert listed["file:all"]["kind"] == "permtoken"
    finally:
        control.stop_following()
