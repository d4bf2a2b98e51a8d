"""Hostile and ill-fitting selectors in subscribe, end to end: a real broker process, real BEEP
over TCP, the shared Kafka. Each is refused (567, or 566 for a class the topic does not offer)
with no subscription recorded, the broker's peak memory grows by a bounded amount (/proc, a
bound, not a timing), and the broker serves a fitting selector afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adapters.client.pubsub_client import Delivered, PubsubClient
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from common.errors import SelectorError, UnsupportedSelectorClass
from tests.integration.broker_process import start_broker

pytestmark = pytest.mark.kafka

ADMIN = "admin@example.com"
XS = "xmlns:xs='http://www.w3.org/2001/XMLSchema'"
SELECTOR_SCHEMA = (f"<selector-schema class='JMS' {XS}>"
                   "<xs:element name='net-change-pct' type='xs:decimal'/>"
                   "<xs:attribute name='symbol' type='xs:string'/></selector-schema>")

#: class, text: each refused with 567 on any topic (tests/selectors/test_hostile.py has more)
HOSTILE = [
    ("JMS", "x IN (" + ", ".join(f"'{i}'" for i in range(20_000)) + ")"),     # past 64 KiB
    ("RFC-2254", "(|" + "(x=1)" * 12_000 + ")"),                              # 12,000 predicates
    ("JMS", " OR ".join(f"x LIKE '%{i}%'" for i in range(3_000))),           # 3,000 LIKEs
    ("JMS", "NOT (" * 200 + "x = 1" + ")" * 200),                             # nesting
    ("RFC-2254", "(&" * 200 + "(x=1)" + ")" * 200),
]
#: class, text, error: refused on the topic with the selector schema only
NOT_FITTING = [
    ("JMS", "industry-group = 'tech'", SelectorError),        # a field it does not offer
    ("JMS", "symbol > 5", SelectorError),                     # a string compared with a number
    ("JMS", "net-change-pct LIKE '1%'", SelectorError),       # LIKE on a decimal
    ("RFC-2254", "(symbol=XMPL)", UnsupportedSelectorClass),  # a class it does not list
]


def _subscribed_topics(config: KafkaConfig) -> list[str]:
    """The topics of every subscription Kafka holds (the registry the broker writes first)."""
    core = BrokerCore(config)
    core.open()
    try:
        return [sub.topic for sub in core.subscriptions]
    finally:
        core.close()


def _peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("VmHWM:")).split()[1])


async def _refusals(config: KafkaConfig) -> int:
    proc, port = await start_broker(config.bootstrap, "--heartbeat-ms", "600000",
                                    namespace=config.namespace, logs=False)
    try:
        admin = await PubsubClient.connect("127.0.0.1", port, ADMIN)
        await admin.create_topic("free")
        await admin.create_topic("quotes", selector_schemas=(SELECTOR_SCHEMA,))
        fred = await PubsubClient.connect("127.0.0.1", port, "fred@example.com")
        start = _peak_rss_kib(proc.pid)
        for klass, text in HOSTILE:
            with pytest.raises(SelectorError, match=r"limit|deeper") as caught:
                await fred.subscribe("free", 600, selector=text, selector_class=klass)
            assert caught.value.code == 567
        for klass, text, error in NOT_FITTING:
            with pytest.raises(error):
                await fred.subscribe("quotes", 600, selector=text, selector_class=klass)
            # the same selector is fine where no schema constrains it
            await fred.subscribe("free", 600, selector=text, selector_class=klass)
        grown = _peak_rss_kib(proc.pid) - start
        recorded = await asyncio.to_thread(_subscribed_topics, config)
        assert "quotes" not in recorded and recorded, recorded
        # nothing recorded for "quotes"; a fitting selector is served and selects
        sub_id = await fred.subscribe("quotes", 600, selector="symbol = 'XMPL' AND"
                                      " net-change-pct > 5.0")
        assert sub_id is not None
        events = fred.events()
        for symbol, pct in (("TEST", "9.0"), ("XMPL", "1.0"), ("XMPL", "7.5")):
            await admin.publish("quotes", f"<equity-quote symbol='{symbol}'><net-change-pct>"
                                f"{pct}</net-change-pct></equity-quote>".encode(),
                                "application/xml")
        while True:  # only a Delivered counts here
            got = await asyncio.wait_for(anext(events), 60)
            if isinstance(got, Delivered):
                break
        assert got.topic == "quotes" and b"7.5" in got.content
        await fred.close()
        await admin.close()
        return grown
    finally:
        proc.terminate()
        await proc.wait()


def test_hostile_and_ill_fitting_selectors_are_refused_and_the_broker_serves_on(
        kafka_config: KafkaConfig) -> None:
    """Five hostile selectors are 567; four that do not fit the topic's selector schema are
    567 / 566 there (and accepted on a topic without one); the broker's peak RSS grows by less
    than 256 MB, and the next fitting subscription receives only what it selects."""
    grown_kib = asyncio.run(_refusals(kafka_config))
    print(f"the broker's peak RSS grew by {grown_kib} KiB")
    assert grown_kib < 256 * 1024
