"""The content-based commands as a user runs them against a broker process: `apexps subscribe
--selector` says its subscription id once and per delivery the ids it satisfied, `apexps
publish --message-id/--revision/--expires` puts the headers in the journal's record, `apexps
cancel --id/--topic/--all` ends subscriptions and exits 1 with 568 when nothing matched, and a
bad selector is 566/567 with nothing recorded."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from tests.integration.test_pubsub_crash import APEXPS, _broker, _cli

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TOPIC = "equity.quote.service"
SELECTOR = "symbol IN ('XMPL', 'TEST', 'SMPL') AND (net-change-pct > 5.0 OR net-change-pct < -5.0)"


def _quote(tmp: Path, symbol: str, pct: float) -> str:
    path = tmp / f"{symbol}{pct}.xml"
    path.write_text(f"<equity-quote symbol='{symbol}'><net-change-pct>{pct}</net-change-pct>"
                    "</equity-quote>")
    return str(path)


def test_subscribe_publish_cancel_from_the_command_line(kafka_config: KafkaConfig,
                                                        tmp_path: Path) -> None:
    with _broker(kafka_config) as (_, server):
        made = _cli(server, "topic", "create", TOPIC, "--as", "admin@example.com")
        assert made.returncode == 0, made.stderr
        # 567 (an LDAP filter without parentheses, a JMS list left open): the CLI's error
        # line, nothing recorded (566 is the wire test's: --class offers only these two)
        bad_ldap = _cli(server, "subscribe", "--topic", TOPIC, "--as", "jade@example.com",
                         "--selector", "x", "--class", "RFC-2254", "--count", "1")
        assert bad_ldap.returncode == 1 and "error 567" in bad_ldap.stderr, bad_ldap.stderr
        bad = _cli(server, "subscribe", "--topic", TOPIC, "--as", "jade@example.com",
                   "--selector", "symbol IN ('XMPL'", "--count", "1")
        assert bad.returncode == 1 and "error 567" in bad.stderr and "position 17" in bad.stderr
        listener = subprocess.Popen(
            [*APEXPS, "subscribe", "--server", server, "--as", "jade@example.com", "--topic",
             TOPIC, "--selector", SELECTOR, "--count", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert listener.stderr is not None
        said = listener.stderr.readline()
        assert "subscribed to equity.quote.service" in said and "(subscription id 1)" in said
        for symbol, pct, extra in (("IBM", 9.0, []), ("XMPL", 1.0, []),
                                   ("XMPL", 10.0, ["--message-id", "1029", "--revision", "2",
                                                   "--expires", "*"]),
                                   ("TEST", -7.5, ["--expires", "2030-01-01T00:00:00Z"])):
            pub = _cli(server, "publish", "--topic", TOPIC, "--as", "quote@example.com",
                       "--content-type", "application/xml", *extra,
                       _quote(tmp_path, symbol, pct))
            assert pub.returncode == 0, pub.stderr
        out, _ = listener.communicate(timeout=60)
        lines = [json.loads(x) for x in out.splitlines()]
        assert [("symbol='XMPL'" in r["content"], r["subscriptions"]) for r in lines] == \
            [(True, ["1"]), (False, ["1"])]
        assert lines[0]["messageid"] == "1029"
        # --cached: the cached message (message-id 1029, never expires) through the selector
        late = _cli(server, "subscribe", "--topic", TOPIC, "--as", "tom@example.com",
                    "--selector", SELECTOR, "--cached", "--count", "1")
        assert late.returncode == 0, late.stderr
        [cached] = [json.loads(x) for x in late.stdout.splitlines()]
        assert "symbol='XMPL'" in cached["content"] and cached["subscriptions"] == ["1"]
        assert _cli(server, "cancel", "--all", "--as", "tom@example.com").returncode == 0
        # cancel: by id (then nothing left: 568), by topic, all
        first = _cli(server, "cancel", "--id", "1", "--as", "jade@example.com")
        again = _cli(server, "cancel", "--id", "1", "--as", "jade@example.com")
        assert (first.returncode, again.returncode) == (0, 1), (first.stderr, again.stderr)
        assert "error 568" in again.stderr
        for which in (["--topic", TOPIC], ["--all"]):
            none = _cli(server, "cancel", *which, "--as", "jade@example.com")
            assert none.returncode == 1 and "error 568" in none.stderr
    core = BrokerCore(kafka_config)
    core.open()
    try:
        records = {e.fields["symbol"][0]: e for e in core.journal.read_source("quote@example.com")}
        xmpl = [e for e in core.journal.read_source("quote@example.com")
                if e.message_id == "1029"]
        assert [(e.revision_id, e.expiration_date) for e in xmpl] == [("2", "*")]
        assert records["TEST"].expiration_date == "2030-01-01T00:00:00Z"
        assert records["IBM"].fields["publisher"] == ["quote@example.com"]
        assert not list(core.subscriptions)
    finally:
        core.close()


