"""Message and selector schemas end to end: `apexps topic create --schema/--selector-schema`
against a real broker process (real BEEP over TCP, the shared Kafka), 561 for a publication
that does not conform (nothing journaled, one log line, the broker serving on), and hostile
input — an XSD with an external import, a 10 MB message against a schema, a near-cap message
built to cost the validator the most — refused with the right code in bounded memory (the
broker's peak RSS from /proc, a bound, not a timing)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.beep import DEFAULT_MAX_MESSAGE_SIZE as CAP
from adapters.client.pubsub_client import Delivered, PubsubClient
from broker.kafka_io import KafkaConfig, watermarks
from common.errors import InvalidMessage, InvalidParameter, TransactionFailed
from tests.integration.broker_process import start_broker

pytestmark = pytest.mark.kafka

ADMIN = "admin@example.com"
XS = "xmlns:xs='http://www.w3.org/2001/XMLSchema'"
QUOTE_XSD = f"""<?xml version='1.0'?>
<xs:schema {XS}>
  <xs:element name='equity-quote'>
    <xs:complexType>
      <xs:sequence>
        <xs:element name='issue-name' type='xs:string' minOccurs='0' maxOccurs='unbounded'/>
        <xs:element name='net-change-pct' type='xs:decimal'/>
      </xs:sequence>
      <xs:attribute name='symbol' type='xs:string' use='required'/>
    </xs:complexType>
  </xs:element>
</xs:schema>
"""
SELECTOR_SCHEMA = f"""<selector-schema class='JMS' {XS}>
  <xs:element name='net-change-pct' type='xs:decimal'/>
  <xs:attribute name='symbol' type='xs:string'/>
</selector-schema>
"""
IMPORTING_XSD = f"""<xs:schema {XS}>
  <xs:import namespace='urn:evil' schemaLocation='http://127.0.0.1:9/evil.xsd'/>
  <xs:element name='a' type='xs:string'/>
</xs:schema>
"""


def quote(pct: str, symbol: str = "XMPL") -> bytes:
    return (f"<equity-quote symbol='{symbol}'><issue-name>Example</issue-name>"
            f"<net-change-pct>{pct}</net-change-pct></equity-quote>").encode()


class _Broker:
    """A broker process whose JSON log lines are drained (a full pipe would stall it)."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc, self.port = proc, port
        self.records: list[dict[str, object]] = []
        self._grew = asyncio.Event()
        self._drain = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            if line.startswith(b"{"):
                self.records.append(json.loads(line))
                self._grew.set()

    async def logged(self, event: str, **fields: object) -> dict[str, object]:
        """The first record of `event` with these fields, waiting for it (an event, no sleep)."""
        async def find() -> dict[str, object]:
            while True:
                for record in self.records:
                    if record.get("event") == event and all(
                            record.get(k) == v for k, v in fields.items()):
                        return record
                self._grew.clear()
                await self._grew.wait()
        return await asyncio.wait_for(find(), 60)

    def peak_rss_kib(self) -> int:
        """VmHWM: the most resident memory the broker process has had (since `reset_peak`)."""
        return self._status_kib("VmHWM:")

    def reset_peak(self) -> int:
        """Reset VmHWM to the current RSS (proc(5), clear_refs "5"); return that RSS in KiB."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        return self._status_kib("VmRSS:")

    def _status_kib(self, field: str) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith(field))
        return int(line.split()[1])

    async def close(self) -> None:
        self.proc.terminate()
        await self.proc.wait()
        await self._drain


async def _broker(config: KafkaConfig) -> _Broker:
    proc, port = await start_broker(config.bootstrap, "--heartbeat-ms", "600000",
                                    namespace=config.namespace)
    return _Broker(proc, port)


async def _cli(port: int, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "adapters.cli.main", "--log-level", "warning", *args,
        "--server", f"127.0.0.1:{port}", "--as", ADMIN,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode()


def _journal_size(config: KafkaConfig) -> int:
    return sum(watermarks(config, config.topic("journal"), p)[1]
               for p in range(config.journal_partitions))


async def _next_delivery(events: AsyncIterator[object]) -> Delivered:
    got = await asyncio.wait_for(anext(events), 60)
    assert isinstance(got, Delivered)
    return got


async def _create_and_publish(config: KafkaConfig, tmp: Path) -> None:
    broker = await _broker(config)
    try:
        (tmp / "quote.xsd").write_text(QUOTE_XSD)
        (tmp / "select.xml").write_text(SELECTOR_SCHEMA)
        (tmp / "import.xsd").write_text(IMPORTING_XSD)
        port = broker.port
        code, out = await _cli(port, "topic", "create", "equity.quote", "--schema",
                               str(tmp / "quote.xsd"), "--selector-schema",
                               str(tmp / "select.xml"), "--description", "delayed quotes")
        assert code == 0, out
        # registered by name: the new topic takes equity.quote's message schema
        code, out = await _cli(port, "topic", "create", "equity.quote.eu", "--schema",
                               "equity.quote")
        assert code == 0, out
        # an XSD importing over the network: 553, and no topic
        code, out = await _cli(port, "topic", "create", "evil", "--schema",
                               str(tmp / "import.xsd"))
        assert code == 1 and "553" in out and "self-contained" in out, out
        code, out = await _cli(port, "topic", "create", "nameless", "--schema", "no.such.topic")
        assert code == 1 and "553" in out, out
        code, out = await _cli(port, "topic", "list")
        assert out.split() == ["equity.quote", "equity.quote.eu"], out

        admin = await PubsubClient.connect("127.0.0.1", port, ADMIN)
        fred = await PubsubClient.connect("127.0.0.1", port, "fred@example.com")
        await fred.subscribe("equity.quote.eu", 600)
        events = fred.events()
        before = _journal_size(config)
        xml = "application/beep+xml"
        for bad, kind, why in ((quote("ten"), xml, "net-change-pct"),
                               (quote("1.0").replace(b" symbol='XMPL'", b""), xml, "symbol"),
                               (b"<equity-trade/>", xml, "equity-trade"),
                               (b"not XML at all", xml, "well-formed"),
                               (quote("1.0"), "text/plain", "messages are XML")):
            with pytest.raises(InvalidMessage, match=why) as caught:
                await admin.publish("equity.quote.eu", bad, kind)
            assert caught.value.code == 561
        await broker.logged("publication refused", topic="equity.quote.eu", code=561)
        refusals = [r for r in broker.records if r.get("event") == "publication refused"]
        assert len(refusals) == 5, "one log line per refused publication"
        assert _journal_size(config) == before, "a refused publication reached the journal"
        # the broker serves on: a conforming quote is journaled and delivered
        await admin.publish("equity.quote.eu", quote("7.5"), "application/beep+xml")
        got = await _next_delivery(events)
        assert b"7.5" in got.content
        assert _journal_size(config) == before + 1
        await admin.close()
        await fred.close()
    finally:
        await broker.close()


def test_topic_create_with_schemas_and_561_changes_nothing(kafka_config: KafkaConfig,
                                                           tmp_path: Path) -> None:
    """CLI createtopic with a message and a selector schema, by file and by name; an importing
    XSD is 553 and makes no topic; each non-conforming publication is 561 with one log line,
    the journal unchanged, and the next good one is delivered."""
    asyncio.run(_create_and_publish(kafka_config, tmp_path))


async def _hostile(config: KafkaConfig) -> tuple[int, int, int]:
    broker = await _broker(config)
    try:
        admin = await PubsubClient.connect("127.0.0.1", broker.port, ADMIN)
        # (553 comes back as InvalidParameter: a client knows codes, not the server's classes)
        with pytest.raises(InvalidParameter, match="self-contained"):
            await admin.create_topic("evil", message_schema=(
                f"<message-schema>{IMPORTING_XSD}</message-schema>"))
        await admin.create_topic("q", message_schema=f"<message-schema>{QUOTE_XSD.split('?>')[1]}"
                                                     "</message-schema>")
        fred = await PubsubClient.connect("127.0.0.1", broker.port, "fred@example.com")
        await fred.subscribe("q", 600)
        events = fred.events()
        before, start_rss = _journal_size(config), broker.peak_rss_kib()
        # 10 MB against the schema: over the broker's message cap, refused before any parse
        ten_mb = quote("1.0").replace(b"<issue-name>Example</issue-name>",
                                      b"<issue-name>x</issue-name>" * (10 * 1024 * 1024 // 25))
        rss = broker.reset_peak()
        with pytest.raises(TransactionFailed, match=f"exceeds the limit of {CAP} octets") as big:
            await admin.publish("q", ten_mb, "application/beep+xml")
        # It never reaches the schema: BEEP's 4 MiB message cap drops the payload as it comes
        # and answers ERR 554 (DESIGN invariant 7: the session goes on); the validator's own
        # cap (the same 4 MiB) is checked in tests/broker/test_schemas.py.
        refused = await broker.logged("message refused", code=554)
        assert refused["limit"] == CAP and int(str(refused["size"])) > len(ten_mb), refused
        big_grown = broker.peak_rss_kib() - rss
        assert _journal_size(config) == before
        # the same connection goes on: a good message is journaled and delivered
        await admin.publish("q", quote("1.5"), "application/beep+xml")
        assert b"1.5" in (await _next_delivery(events)).content
        # Just under the cap, 300,000 elements the schema allows, then one it does not:
        # the validator's worst case, walked to the end, and refused.
        many = quote("1.0").replace(
            b"<issue-name>Example</issue-name>",
            b"<issue-name/>" * ((4 * 1024 * 1024 - 4096) // 13)).replace(
            b"<net-change-pct>1.0</net-change-pct>", b"<net-change-pct>x</net-change-pct>")
        with pytest.raises(InvalidMessage, match="net-change-pct"):
            await admin.publish("q", many, "application/beep+xml")
        grown = broker.peak_rss_kib() - start_rss
        assert _journal_size(config) == before + 1
        # still serving
        await admin.publish("q", quote("2.0"), "application/beep+xml")
        assert b"2.0" in (await _next_delivery(events)).content
        assert not [r for r in broker.records if r.get("event") == "protocol violation"]
        await fred.close()
        await admin.close()
        return int(big.value.code), big_grown, grown
    finally:
        await broker.close()


def test_hostile_schema_and_message_are_refused_in_bounded_memory(
        kafka_config: KafkaConfig) -> None:
    """An importing XSD is 553; 10 MB is refused by size, never parsed: ERR 554 naming the
    limit, nothing journaled, the broker's peak RSS less than three times the cap above its RSS
    before, and the same connection then publishes a message that is delivered; a 4 MB message
    of 300,000 elements
    that fails at its end is 561; the broker's peak RSS grows by a bounded amount and it serves
    the next message."""
    code, big_kib, grown_kib = asyncio.run(_hostile(kafka_config))
    assert code == 554, code
    print(f"the broker's peak RSS grew by {big_kib} KiB for 10 MB refused")
    assert big_kib < 3 * CAP // 1024, f"10 MB refused grew the peak RSS by {big_kib} KiB"
    print(f"the broker's peak RSS grew by {grown_kib} KiB")
    assert grown_kib < 256 * 1024, f"the broker's peak RSS grew by {grown_kib} KiB"
