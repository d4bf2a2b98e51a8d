"""`apexps audit` on real histories: a real broker over BEEP writes a small history (two
publishers, subscribers with and without a denied permission token, two subscriptions on one
link); its audit is clean. Copies of its topics made through Kafka with ONE change each — a
link record removed, one duplicated, two swapped, a journal record removed with no GAP — each
audit to exactly that finding and nothing else."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from adapters.app import BrokerApp
from adapters.cli.main import main
from adapters.client.pubsub_client import PubsubClient
from broker.codec import default_codec
from broker.entitlements import parse_token_set
from broker.kafka_io import KafkaConfig
from broker.records import AccessEffect, AccessEntry, AccessKind, now_ms
from broker.robust.config import RobustConfig
from tests.integration import audit_copy
from tests.integration.deliveries import deliveries

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.usefixtures("spark")]

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)
PER_PUBLISHER = 12
DENIED = "6747"


def _token(k: int) -> str | None:
    return DENIED if k % 4 == 1 else ("6000" if k % 4 == 2 else None)


async def _build(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:  # default: the domain gets every token
        app.access.put(AccessEntry("cli:jade-6747", "jade@example.com",
                                   parse_token_set(DENIED).items, AccessEffect.DENY, now_ms(),
                                   kind=AccessKind.PERMTOKEN))
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        ann, bob, fred, jade, wilma = [await connect(f"{n}@example.com") for n in (
            "ann", "bob", "fred", "jade", "wilma")]
        await ann.create_topic("q.a")
        await bob.create_topic("q.b")
        await fred.subscribe("q.a", 600, link="fred-l")
        await fred.subscribe("q.b", 600, link="fred-l")
        await jade.subscribe("q.a", 600, link="jade-l")
        await wilma.subscribe("q.b", 600)  # on its default link, wilma@example.com
        for k in range(PER_PUBLISHER):
            await asyncio.gather(ann.publish("q.a", f"a{k}".encode(), token=_token(k)),
                                 bob.publish("q.b", f"b{k}".encode(), token=_token(k)))
        denied = sum(_token(k) == DENIED for k in range(PER_PUBLISHER))
        await deliveries(fred, 2 * PER_PUBLISHER)
        await deliveries(jade, PER_PUBLISHER - denied)
        await deliveries(wilma, PER_PUBLISHER)
        for c in (ann, bob, fred, jade, wilma):
            await c.close()


@pytest.fixture(scope="module", name="history")
def _history(kafka_bootstrap: str) -> KafkaConfig:
    config = KafkaConfig(bootstrap=kafka_bootstrap, namespace=f"a{uuid.uuid4().hex[:12]}")
    asyncio.run(_build(config))
    return config


def _copy(history: KafkaConfig, edit: audit_copy.Edit | None = None) -> KafkaConfig:
    config = KafkaConfig(bootstrap=history.bootstrap, namespace=f"d{uuid.uuid4().hex[:12]}")
    audit_copy.copy(history, config, edit)
    return config


def _audit(config: KafkaConfig, out: Path, *extra: str) -> tuple[int, dict[str, Any],
                                                                  list[dict[str, Any]]]:
    from pyspark.sql import SparkSession

    # The history is made in a second: with the default edge every decision would be at it
    # (docs/audit.md), so the rule is checked exactly.
    code = main(["audit", "--bootstrap", config.bootstrap, "--namespace", config.namespace,
                 "--out", str(out), "--edge-ms", "0", *extra])
    summary = json.loads((out / "summary.json").read_text())
    spark = SparkSession.builder.getOrCreate()
    findings = [r.asDict() for r in spark.read.parquet(str(out / "findings")).collect()]
    return code, summary, findings


def _what(findings: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((f["category"], f["link"], f["source"], f["source_seq"], f["link_seq"])
                  for f in findings)


def test_a_clean_history_audits_clean(history: KafkaConfig, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Every category zero; each subscription expected what its topic, lifetime and tokens
    allowed, and its link carried exactly that; the decisions all reconcile. `--message` on
    ann's seq 2, which carries the denied token: fred was entitled and his link carried it,
    jade was not and hers did not; wilma has no subscription to q.a and is not listed."""
    code, summary, findings = _audit(history, tmp_path, "--message", "ann@example.com:2")
    assert (code, findings) == (0, [])
    assert summary["clean"] is True and summary["empty"] is False
    assert set(summary["counts"].values()) == {0}
    denied = sum(_token(k) == DENIED for k in range(PER_PUBLISHER))
    subs = summary["per_subscription"]
    # (labels are subscriber/subscription id; the broker numbers the ids)
    assert {(s["subscriber"], s["topic"]): (s["link"], s["expected"], s["delivered"],
                                            s["missing"], s["extra"], s["withheld"])
            for s in subs.values()} == {
        ("fred@example.com", "q.a"): ("fred-l", PER_PUBLISHER, PER_PUBLISHER, 0, 0, 0),
        ("fred@example.com", "q.b"): ("fred-l", PER_PUBLISHER, PER_PUBLISHER, 0, 0, 0),
        ("jade@example.com", "q.a"): ("jade-l", PER_PUBLISHER - denied, PER_PUBLISHER - denied,
                                      0, 0, denied),
        ("wilma@example.com", "q.b"): ("wilma@example.com", PER_PUBLISHER, PER_PUBLISHER, 0, 0,
                                       0),
    }
    assert all(s["latency_ms"]["max"] >= 0 for s in subs.values())
    # what each link carried, its subscriber acknowledged (NS.acks): every delivery answered ok
    # before the clients closed, and the broker wrote the last of it as it stopped
    assert {link: (v["carried"], v["acknowledged"]) for link, v in summary["per_link"].items()
            } == {"fred-l": (2 * PER_PUBLISHER, 2 * PER_PUBLISHER),
                  "jade-l": (PER_PUBLISHER - denied, PER_PUBLISHER - denied),
                  "wilma@example.com": (PER_PUBLISHER, PER_PUBLISHER)}
    # (the broker's own source, apex=pubsub@example.com, publishes the well-known topics)
    assert all(v["findings"] == 0 for v in summary["per_source"].values())
    assert {s: (v["first"], v["last"], v["messages"], v["findings"])
            for s, v in summary["per_source"].items()
            if s in ("ann@example.com", "bob@example.com")} == {
        "ann@example.com": (1, PER_PUBLISHER, PER_PUBLISHER, 0),
        "bob@example.com": (1, PER_PUBLISHER, PER_PUBLISHER, 0)}
    total = 4 * PER_PUBLISHER
    assert summary["decisions"] == {"total": total, "reconciled": total, "fraction": 1.0}
    assert "NS.acks" in summary["note"]  # says how to read per_link
    assert (tmp_path / "report.html").is_file()

    table = json.loads((tmp_path / "message.json").read_text())["rows"]
    view = {r["subscriber"]: (r["entitled"], r["why_not"], r["carried"], r["link_seq"] is None)
            for r in table}
    assert view == {"fred@example.com": (True, None, True, False),
                    "jade@example.com": (False, "token withheld", False, True)}
    assert "token withheld" in capsys.readouterr().out


def _link_records(items: list[audit_copy.Item], link: str) -> list[dict[str, Any]]:
    return [items[i][3][j] for i, j in audit_copy.data_records(items, link)]


def _seq(record: dict[str, Any]) -> int:
    return int(record["ordinal"] - record["epoch_start"])  # no wrap in a short history


@pytest.fixture(name="links")
def _links(history: KafkaConfig) -> list[audit_copy.Item]:
    return audit_copy.read(history, "links")


def test_a_removed_link_record_is_one_missing_message(history: KafkaConfig,
                                                      links: list[audit_copy.Item],
                                                      tmp_path: Path) -> None:
    gone = _link_records(links, "jade-l")[3]

    def edit(role: str, items: list[audit_copy.Item]) -> list[audit_copy.Item]:
        if role == "links":
            for item in items:
                item[3] = [r for r in item[3] or [] if r != gone]
        return items

    code, _, findings = _audit(_copy(history, edit), tmp_path)
    assert code == 1
    assert _what(findings) == [("missing", "jade-l", gone["source"], gone["source_seq"], None)]
    assert findings[0]["subscriber"] == "jade@example.com"


def test_a_duplicated_link_record_is_one_duplicate(history: KafkaConfig,
                                                   links: list[audit_copy.Item],
                                                   tmp_path: Path) -> None:
    again = _link_records(links, "fred-l")[5]

    def edit(role: str, items: list[audit_copy.Item]) -> list[audit_copy.Item]:
        if role == "links":
            at = next(i for i, item in enumerate(items) if again in (item[3] or []))
            items.insert(at + 1, [items[at][0], b"fred-l", items[at][2], [again]])
        return items

    code, _, findings = _audit(_copy(history, edit), tmp_path)
    assert code == 1
    assert _what(findings) == [("duplicate", "fred-l", again["source"], again["source_seq"],
                                _seq(again))]


def test_two_swapped_link_records_are_one_reorder(history: KafkaConfig,
                                                  links: list[audit_copy.Item],
                                                  tmp_path: Path) -> None:
    (i1, j1), (i2, j2) = audit_copy.data_records(links, "wilma@example.com")[6:8]
    first = links[i1][3][j1]

    def edit(role: str, items: list[audit_copy.Item]) -> list[audit_copy.Item]:
        if role == "links":
            items[i1][3][j1], items[i2][3][j2] = items[i2][3][j2], items[i1][3][j1]
        return items

    code, _, findings = _audit(_copy(history, edit), tmp_path)
    assert code == 1
    # The earlier record now comes second: it is the one out of order.
    assert _what(findings) == [("reorder", "wilma@example.com", first["source"],
                                first["source_seq"], _seq(first))]


def test_a_journal_record_removed_without_a_gap_is_one_source_hole(history: KafkaConfig,
                                                                   tmp_path: Path) -> None:
    codec = default_codec()

    def edit(role: str, items: list[audit_copy.Item]) -> list[audit_copy.Item]:
        if role != "journal":
            return items
        return [item for item in items if codec.decode(item[3])[1]["source_seq"] != 7
                or codec.decode(item[3])[1]["source"] != "bob@example.com"]

    code, summary, findings = _audit(_copy(history, edit), tmp_path)
    assert code == 1
    assert _what(findings) == [("source_hole", None, "bob@example.com", 7, None)]
    assert summary["per_source"]["bob@example.com"]["findings"] == 1


def _new_epoch_carrying(items: list[audit_copy.Item], link: str, message: dict[str, Any],
                        ) -> None:
    """Append to `link` a RESET and one DATA record carrying `message` (another link's record
    of it) in a new epoch: order and duplicates start afresh there, so only the delivery itself
    is judged."""
    last = max((r for item in items for r in item[3] or [] if r["link"] == link),
               key=lambda r: r["ordinal"])
    n, epoch = last["ordinal"], last["epoch"] + 1
    base = {**last, "epoch": epoch, "epoch_start": n + 1, "snapshot": False}
    reset = {**base, "ordinal": n + 1, "kind": "RESET", "journal_partition": None,
             "journal_offset": None, "source": None, "source_seq": None,
             "owner": last["owner"] or link}
    data = {**base, "ordinal": n + 2, "kind": "DATA", "owner": None,
            **{k: message[k] for k in ("journal_partition", "journal_offset", "source",
                                       "source_seq")}}
    p, _, ts, _ = items[-1]
    items.append([p, link.encode(), ts, [reset, data]])


def _carrying(items: list[audit_copy.Item], link: str, source: str, seq: int,
              ) -> dict[str, Any]:
    return next(r for r in _link_records(items, link)
                if (r["source"], r["source_seq"]) == (source, seq))


def test_a_denied_message_on_the_link_is_withheld_delivered(history: KafkaConfig,
                                                            links: list[audit_copy.Item],
                                                            tmp_path: Path) -> None:
    """ann's seq 2 carries 6747, which jade is denied: on jade's link it is one finding."""
    denied = _carrying(links, "fred-l", "ann@example.com", 2)

    def edit(role: str, items: list[audit_copy.Item]) -> list[audit_copy.Item]:
        if role == "links":
            _new_epoch_carrying(items, "jade-l", denied)
        return items

    code, _, findings = _audit(_copy(history, edit), tmp_path)
    assert code == 1
    assert _what(findings) == [("withheld_delivered", "jade-l", "ann@example.com", 2, 1)]


def test_a_message_on_a_link_without_its_topic_is_extra(history: KafkaConfig,
                                                        links: list[audit_copy.Item],
                                                        tmp_path: Path) -> None:
    """wilma subscribes to q.b only: ann's seq 3 (q.a) on her link is one finding."""
    stray = _carrying(links, "fred-l", "ann@example.com", 3)

    def edit(role: str, items: list[audit_copy.Item]) -> list[audit_copy.Item]:
        if role == "links":
            _new_epoch_carrying(items, "wilma@example.com", stray)
        return items

    code, _, findings = _audit(_copy(history, edit), tmp_path)
    assert code == 1
    assert _what(findings) == [("extra", "wilma@example.com", "ann@example.com", 3, 1)]


def test_a_delivery_the_selector_rejects_is_a_decision_mismatch(history: KafkaConfig,
                                                                links: list[audit_copy.Item],
                                                                tmp_path: Path) -> None:
    """wilma's subscription given the selector `k IS NULL`, and bob's seq 5 the field k: her
    link carried a message her selector rejects (fred, with no selector, still wanted it)."""
    codec = default_codec()
    carried = _carrying(links, "wilma@example.com", "bob@example.com", 5)

    def edit(role: str, items: list[audit_copy.Item]) -> list[audit_copy.Item]:
        for item in items:
            if item[3] is None:
                continue
            if role == "subscriptions":
                _, rec = codec.decode(item[3])
                if rec["subscriber"] == "wilma@example.com":
                    item[3] = codec.encode("subscription_record", {
                        **rec, "selector_class": "JMS", "selector": "k IS NULL"})
            elif role == "journal":
                _, rec = codec.decode(item[3])
                if (rec["source"], rec["source_seq"]) == ("bob@example.com", 5):
                    item[3] = codec.encode("journal_record", {**rec, "fields": {"k": ["1"]}})
        return items

    code, summary, findings = _audit(_copy(history, edit), tmp_path)
    assert code == 1
    assert _what(findings) == [("decision_mismatch", "wilma@example.com", "bob@example.com", 5,
                                _seq(carried))]
    assert findings[0]["subscriber"] == "wilma@example.com"
    wilma, = (s for s in summary["per_subscription"].values()
              if s["subscriber"] == "wilma@example.com")
    assert wilma["expected"] == PER_PUBLISHER - 1


class _Planned(Exception):  # carries the audit out of the command, before any write
    def __init__(self, result: Any) -> None:
        self.result = result


def _planned_audit(history: KafkaConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The audit's result as `apexps audit` plans it, taken before anything is written."""
    import broker.spark.audit as package

    real = package.audit

    def planned(*args: Any, **kwargs: Any) -> Any:
        raise _Planned(real(*args, **kwargs))

    monkeypatch.setattr(package, "audit", planned)
    with pytest.raises(_Planned) as got:
        main(["audit", "--bootstrap", history.bootstrap, "--namespace", history.namespace,
              "--out", str(tmp_path)])
    return got.value.result


#: Shuffles by these keys would be a kept frame's rows grouped again: the link log's windows
#: (link, ordinal | epoch ...), the journal's per-source checks (source, lo | publisher_seq),
#: the pairs' joins with the registries (topic; subscriber, topic, token) and judge's fold.
_REGROUPINGS = (("link", "ordinal"), ("link", "epoch"), ("source", "lo"),
                ("source", "publisher_seq"), ("topic",), ("subscriber", "topic"),
                ("link", "source", "source_seq", "topic"))


def test_the_reconciliation_shuffles_no_kept_frame_again(history: KafkaConfig, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kept frame is partitioned once the way its checks group it (broker/spark/audit/
    job.py), so the plan of the findings regroups none of them: no shuffle by a big frame's
    grouping keys, and at most five in all (the lookups of the deliveries no pair explains, and
    the decode errors' de-duplication: few rows). A check of the plan, not of a timing; before,
    the same plan held 84 shuffles."""
    findings = _planned_audit(history, tmp_path, monkeypatch).findings
    plan = findings._jdf.queryExecution().executedPlan().toString()
    shuffles = [tuple(re.sub(r"#\d+L?$", "", key) for key in keys.split(", ")[:-1])
                for keys in re.findall(r"Exchange hashpartitioning\((.*?)\), ENSURE_REQUIREMENTS",
                                       plan)]
    assert [k for k in shuffles if any(k[:len(r)] == r for r in _REGROUPINGS)] == []
    assert len(shuffles) <= 5, shuffles


def _sorts(plan: str) -> list[tuple[str, ...]]:
    """The keys of every Sort in a physical plan's text, without their expression ids."""
    return [tuple(re.sub(r"#\d+L?$", "", key.split(" ")[0]) for key in keys.split(", "))
            for keys in re.findall(r"Sort \[(.*?)\], (?:true|false), \d+", plan)]


def test_the_source_checks_sort_the_journal_twice(history: KafkaConfig, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every per-source window runs in one pass over the journal's ranges (sources.
    source_checks), sorted in seq order once and in log order once; the duplicates, the first
    copy of each seq and the holes read the seq order's sort (a window by (source, lo) needs no
    sort of its own). The third sort by source is the publisher-seq check's, of the records
    with a publisher seq. Before, five: holes, log order, copies, publisher seqs, and the
    duplicates' sort-aggregate."""
    result = _planned_audit(history, tmp_path, monkeypatch)
    plan = result.findings._jdf.queryExecution().executedPlan().toString()
    by_source = sorted({k for k in _sorts(plan) if k[0] == "source"})
    assert by_source == [("source", "kafka_partition", "kafka_offset"),
                         ("source", "lo", "hi", "kafka_offset"),
                         ("source", "publisher_seq", "digest")], by_source


def test_no_python_runs_in_the_reconciliation_of_undated_messages(
        history: KafkaConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No message of the small history has an expiration date, so the expiry's Python
    reading (decisions.pairs) is not in the plan: neither the pairs' nor the findings' plan
    evaluates a Python UDF (before, every audit ran it, over the dated messages' empty half of
    a union that also scanned the messages twice)."""
    result = _planned_audit(history, tmp_path, monkeypatch)
    for frame in (result.pairs, result.findings):
        plan = frame._jdf.queryExecution().executedPlan().toString()
        assert "BatchEvalPython" not in plan and "ArrowEvalPython" not in plan


def test_the_journal_is_read_once_and_only_its_decoded_projection_kept(
        history: KafkaConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher reads the journal's Kafka rows once, into the decoded, projected frame
    every stage reads (job.keep_journal), and keeps no copy of the Kafka rows beside it: the
    window's extent and the fallback question are asked of the kept rows. (Before, the raw rows
    were cached too, and read once more to build the decoded copy.)"""
    import broker.spark.source as source

    real, journals = source.kafka_source, []

    def recorded(spark: Any, config: KafkaConfig, role: str, **window: Any) -> Any:
        frame = real(spark, config, role, **window)
        if role == "journal":
            journals.append(frame)
        return frame

    monkeypatch.setattr(source, "kafka_source", recorded)
    code, _, _ = _audit(history, tmp_path)
    assert code == 0
    assert len(journals) == 1
    level = journals[0].storageLevel
    assert not (level.useMemory or level.useDisk), level


def test_unknown_topic_and_empty_window_are_clean_empty_audits(history: KafkaConfig,
                                                               tmp_path: Path) -> None:
    code, summary, findings = _audit(history, tmp_path / "t", "--topic", "no.such")
    assert (code, findings, summary["clean"], summary["empty"]) == (0, [], True, True)
    assert "unknown topic no.such" in summary["note"]
    code, summary, _ = _audit(history, tmp_path / "w", "--from", "2001-01-01T00:00:00Z",
                              "--to", "2001-01-02T00:00:00Z")
    assert (code, summary["clean"], summary["empty"]) == (0, True, True)
    assert "no records in the window" in summary["note"]


def test_a_corrupted_journal_record_is_a_decode_error_finding(history: KafkaConfig,
                                                              tmp_path: Path) -> None:
    def edit(role: str, items: list[audit_copy.Item]) -> list[audit_copy.Item]:
        if role == "journal":
            p, key, ts, _ = items[-1]
            items.append([p, key, ts + 1, b"\xc3\x01garbage"])
        return items

    code, _, findings = _audit(_copy(history, edit), tmp_path)
    assert code == 1
    assert [f["category"] for f in findings] == ["decode_error"]
    assert "journal partition" in findings[0]["detail"]


@pytest.mark.parametrize("argv, words", [
    (["--message", "ann@example.com"], "is not SOURCE:SEQ"),
    (["--from", "yesterday"], "'yesterday' is neither"),
])
def test_bad_usage_exits_2(argv: list[str], words: str, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--bootstrap", "127.0.0.1:1", "--out", str(tmp_path), *argv]) == 2
    assert words in capsys.readouterr().err


def test_unreachable_kafka_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--bootstrap", "127.0.0.1:1", "--out", str(tmp_path)]) == 3
    assert "no Kafka answers at 127.0.0.1:1" in capsys.readouterr().err
