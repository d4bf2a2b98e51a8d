"""replay() over a real journal: only the topic's DATA records, each (source, seq) once, in
(source, source_seq) order; `source`/`after` as a repair by source; a viewer's tokens; expired
messages kept; and `apexps replay`'s handling of bad input, empty windows, damaged records,
unreachable Kafka or Spark, and Parquet output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapters.cli.main import main
from broker import selectors
from broker.codec import default_codec
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.kafka_producer import KafkaProducer
from broker.records import Publication, gap_record
from broker.spark.journal_reader import load_journal
from broker.spark.replay import REPLAY_COLUMNS, replay

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _journal(config: KafkaConfig) -> None:
    """Sources a, b, c on topic t (c's seq 2 carries token 7; b's seq 1 had expired before it
    was published, b's seq 2 expires at once (`0`), c's seq 1 in 2100), one message on another
    topic, a GAP, a duplicate of a's seq 2, a record that does not decode, and content a
    selector cannot parse."""
    core = BrokerCore(config)
    core.open()
    try:
        for k in range(9):
            src = "abc"[k % 3]
            core.journal.append_sync(Publication(
                "t", f"{src}@example.com", f"<q k='{k}'/>".encode(),
                permission_token="7" if k == 5 else ("8" if k == 8 else None),
                expiration_date={1: "2000-01-01T00:00:00Z", 4: "0",
                                 2: "2100-01-01T00:00:00"}.get(k)))
        core.journal.append_sync(Publication("other", "a@example.com", b"<q k='99'/>"))
        core.journal.append_sync(Publication("t", "d@example.com",
                                             b"<!DOCTYPE q [<!ENTITY e 'x'>]><q k='&e;'/>"))
    finally:
        core.close()
    codec, topic = default_codec(), config.topic("journal")
    producer = KafkaProducer(config)
    dup = Publication("t", "a@example.com", b"<q k='3'/>").to_avro(2, 1)
    producer.produce_sync(topic, b"a@example.com", codec.encode("journal_record", dup),
                          partition=0)
    producer.produce_sync(topic, b"g", codec.encode("journal_record", {
        **gap_record("g@example.com", "t", 1, 5, "publisher gone"), "appended_at": 1}),
        partition=0)
    producer.produce_sync(topic, b"x", b"\xc3\x01\x00\x00 not a record", partition=1)
    producer.close()


@pytest.fixture(name="journal")
def _loaded(kafka_config: KafkaConfig, spark: Any) -> Any:
    _journal(kafka_config)
    return load_journal(spark, kafka_config).cache()


def _keys(df: Any) -> list[tuple[str, int]]:
    return [(r["source"][0], r["source_seq"]) for r in df.collect()]


def test_replay_is_the_topics_data_once_each_in_per_source_order(journal: Any,
                                                                  spark: Any) -> None:
    """GAP, undecodable and other-topic records are not messages; a's seq 2, written twice,
    is replayed once; rows come sorted by (source, source_seq), however Spark partitions the
    work. Expiry as the live fan-out decides: b's seq 1, expired before it was appended, was
    never sent and is out (unless include_expired); `0` and a future date are in."""
    df = replay(journal, topic="t")
    assert tuple(df.columns) == REPLAY_COLUMNS
    # Adaptive execution folds this little data into one partition, where any sorted step
    # would pass for the order; without it the shuffle's partitions come back one by one.
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        keys = _keys(df)
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    assert keys == [("a", 1), ("a", 2), ("a", 3), ("b", 2), ("b", 3),
                    ("c", 1), ("c", 2), ("c", 3), ("d", 1)]
    rows = {(r["source"][0], r["source_seq"]): r for r in df.collect()}
    assert (rows[("b", 2)]["expiration_date"], rows[("c", 1)]["expiration_date"]) == \
        ("0", "2100-01-01T00:00:00")
    assert bytes(rows[("a", 2)]["content"]) == b"<q k='3'/>"
    everything = replay(journal, topic="t", include_expired=True)
    (old,) = [r for r in everything.collect() if (r["source"][0], r["source_seq"]) == ("b", 1)]
    assert old["expiration_date"] == "2000-01-01T00:00:00Z"


def test_source_after_and_viewer_tokens(journal: Any) -> None:
    """`source` + `after` keep that source's later seqs; `tokens` drops a message whose token
    is outside the set and keeps every message without one."""
    assert _keys(replay(journal, topic="t", source="b@example.com", after=1)) == \
        [("b", 2), ("b", 3)]
    assert _keys(replay(journal, topic="t", source="c@example.com")) == \
        [("c", 1), ("c", 2), ("c", 3)]
    assert ("c", 2) not in _keys(replay(journal, topic="t", tokens=[]))
    assert ("c", 3) not in _keys(replay(journal, topic="t", tokens=[]))
    assert len(_keys(replay(journal, topic="t", tokens=[]))) == 7  # 10 - expired - 2 tokened
    seven = _keys(replay(journal, topic="t", tokens=["7"]))
    assert ("c", 2) in seven and ("c", 3) not in seven and len(seven) == 8
    with pytest.raises(ValueError, match="source"):
        replay(journal, topic="t", after=3)


def test_selector_keeps_true_only_and_unparsable_content_has_no_fields(journal: Any) -> None:
    """A selector keeps the rows it is TRUE on (UNKNOWN is out); the DOCTYPE message has no
    fields, so `k IS NULL` selects it alone, with its fields_error."""
    sel = selectors.compile("JMS", "k > 4")
    assert _keys(replay(journal, topic="t", selector=sel)) == [("a", 3), ("b", 3), ("c", 2),
                                                               ("c", 3)]
    (row,) = replay(journal, topic="t", selector=selectors.compile("JMS", "k IS NULL")).collect()
    assert row["source"] == "d@example.com" and "DOCTYPE" in row["fields_error"].upper()


# --- the command ------------------------------------------------------------------------------


def test_help_shows_examples_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """`apexps replay --help` shows the examples, every option and the exit codes."""
    with pytest.raises(SystemExit) as exit_:
        main(["replay", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for part in ("apexps replay --topic equity.quote --out quotes.jsonl", "--selector EXPR",
                 "--source S", "--after N", "--as ENDPOINT", "--format", "--master URL",
                 "Exit codes: 0 done"):
        assert part in text, part


def _cli(config: KafkaConfig, out: Path, *extra: str, topic: str = "t") -> int:
    return main(["replay", "--topic", topic, "--bootstrap", config.bootstrap,
                 "--namespace", config.namespace, "--out", str(out), *extra])


def test_bad_selector_is_567_with_its_position(kafka_config: KafkaConfig, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A bad selector: exit 2, the 567 reason at its position with a caret, no output."""
    out = tmp_path / "x.jsonl"
    assert _cli(kafka_config, out, "--selector", "price > AND x = 1") == 2
    err = capsys.readouterr().err
    assert "error 567:" in err and "at position 8" in err
    assert "  price > AND x = 1\n          ^" in err
    assert _cli(kafka_config, out, "--selector", "(a=1", "--class", "RFC-2254") == 2
    assert "error 567:" in capsys.readouterr().err
    assert _cli(kafka_config, out, "--selector", "a = 1", "--class", "XPath") == 2
    assert "error 566:" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("extra", "says"), [
    (["--from", "yesterday"], "--from: 'yesterday' is neither"),
    (["--to", "2026-13-01"], "--to:"),
    (["--after", "3"], "--after needs --source"),
])
def test_bad_usage_is_exit_2(kafka_config: KafkaConfig, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str], extra: list[str],
                             says: str) -> None:
    """Bad --from/--to or --after alone: exit 2 with a line that names the problem."""
    assert _cli(kafka_config, tmp_path / "x.jsonl", *extra) == 2
    assert says in capsys.readouterr().err


def test_unreachable_kafka_or_spark_is_exit_3(kafka_config: KafkaConfig, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """No Kafka at --bootstrap, or no Spark master at --master: exit 3 saying what to check."""
    assert main(["replay", "--topic", "t", "--bootstrap", "127.0.0.1:1",
                 "--out", str(tmp_path / "x.jsonl")]) == 3
    assert "no Kafka answers at 127.0.0.1:1; check --bootstrap" in capsys.readouterr().err
    assert _cli(kafka_config, tmp_path / "x.jsonl", "--master", "spark://127.0.0.1:1") == 3
    assert "no Spark master answers at spark://127.0.0.1:1" in capsys.readouterr().err


def _logged(err: str, event: str) -> dict[str, Any]:
    (line,) = [json.loads(x) for x in err.splitlines()
               if x.startswith("{") and json.loads(x).get("event") == event]
    return dict(line)


def test_unknown_topic_or_namespace_is_an_empty_replay(kafka_config: KafkaConfig, spark: Any,
                                                       tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A topic with no messages, or a namespace with no journal: an empty file, exit 0, and a
    log line that says it is empty and why."""
    _journal(kafka_config)
    out = tmp_path / "none.jsonl"
    assert _cli(kafka_config, out, topic="no.such.topic") == 0
    assert out.read_text() == ""
    line = _logged(capsys.readouterr().err, "replay empty")
    assert line["note"] == "no messages of topic 'no.such.topic' in the window"
    nowhere = KafkaConfig(bootstrap=kafka_config.bootstrap,
                          namespace=kafka_config.namespace + "-none")
    assert _cli(nowhere, out) == 0
    assert out.read_text() == ""
    assert "has no journal" in _logged(capsys.readouterr().err, "replay empty")["note"]


def test_damaged_records_do_not_stop_the_replay_and_parquet_holds_the_same(
        kafka_config: KafkaConfig, spark: Any, tmp_path: Path) -> None:
    """A journal with an undecodable record and unparsable content, replayed with a selector:
    exit 0, the good messages out; the Parquet output holds the jsonl rows."""
    _journal(kafka_config)
    out = tmp_path / "sel.jsonl"
    assert _cli(kafka_config, out, "--selector", "k > 4 OR k IS NULL") == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["source"][0], r["source_seq"]) for r in rows] == [
        ("a", 3), ("b", 3), ("c", 2), ("c", 3), ("d", 1)]
    assert rows[-1]["fields_error"]
    pq = tmp_path / "pq"
    assert _cli(kafka_config, pq, "--selector", "k > 4 OR k IS NULL", "--format", "parquet") == 0
    back = spark.read.parquet(str(pq)).orderBy("source", "source_seq").collect()
    assert [(r["source"], r["source_seq"], bytes(r["content"]).decode()) for r in back] == \
        [(r["source"], r["source_seq"], r["content"]) for r in rows]
    assert _cli(kafka_config, pq, "--format", "parquet") == 2  # never over existing files
