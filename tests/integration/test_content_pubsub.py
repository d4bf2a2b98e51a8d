"""Content-based publish-subscribe end to end (draft-content §5): real TCP, BEEP and Kafka.

The draft's running example — quotes on `equity.quote.service`, a subscriber with the §5.8 JMS
selector — through a real broker: ingest stores headers and fields once, subscribe answers with
subscription ids, the fan-out selects from the stored fields, an endpoint whose subscriptions
overlap gets one copy with InRe naming every one it satisfied, a selecting link stays
contiguous, 566/567/568 change nothing, cancel works by id, topic and all, subscriptions keep
their selectors and ids through kill -9, and the live decision agrees with Spark's on the real
journal's fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.app import BrokerApp
from adapters.cli.client_cmd import FOREVER
from adapters.client.pubsub_client import Delivered, Ended, PubsubClient
from adapters.client.robust_client import RobustSubscriber
from broker import selectors
from broker.kafka_io import KafkaConfig
from broker.records import JournalEntry, RecordKind
from broker.robust.config import RobustConfig
from common.errors import SelectorError, UnknownSubscription, UnsupportedSelectorClass
from tests.integration.broker_process import start_broker

pytestmark = pytest.mark.kafka

TOPIC = "equity.quote.service"
#: §5.8's selector, verbatim
SELECTOR = "symbol IN ('XMPL', 'TEST', 'SMPL') AND (net-change-pct > 5.0 OR net-change-pct < -5.0)"
#: overlaps SELECTOR on XMPL's big moves
XMPL = "symbol = 'XMPL'"
QUIET = RobustConfig(heartbeat_ms=600_000)
PS = "http://www.example.com/pubsub"


def quote(symbol: str, pct: float, *, publisher: str | None = None) -> bytes:
    """A §5.2 message; `publisher`: what the content claims (the broker must not believe it)."""
    claim = "" if publisher is None else f"<ps:publisher>{publisher}</ps:publisher>"
    return (f"<ps:message-content xmlns:ps='{PS}'>{claim}<ps:content>"
            f"<equity-quote symbol='{symbol}'><last-trade>11.0</last-trade>"
            f"<net-change-pct>{pct}</net-change-pct></equity-quote>"
            "</ps:content></ps:message-content>").encode()


#: (symbol, net-change-pct) published in this order
QUOTES = [("XMPL", 10.0), ("IBM", 12.0), ("TEST", -7.5), ("XMPL", 1.0), ("SMPL", 5.0),
          ("SMPL", 5.5), ("TEST", 2.0), ("XMPL", -6.0), ("OTHR", -9.0), ("TEST", 6.0)]


def _matches(symbol: str, pct: float) -> bool:
    return symbol in ("XMPL", "TEST", "SMPL") and (pct > 5.0 or pct < -5.0)


async def _deliveries(client: PubsubClient, n: int) -> list[Delivered]:
    got: list[Delivered] = []
    events = client.events()
    while len(got) < n:
        event = await asyncio.wait_for(anext(events), 30)
        if isinstance(event, Delivered):
            got.append(event)
    return got


def _symbol(d: Delivered) -> tuple[str, float]:
    text = d.content.decode()
    symbol = text.split("symbol='")[1].split("'")[0]
    pct = float(text.split("<net-change-pct>")[1].split("<")[0])
    return symbol, pct


async def _drain(events: AsyncIterator[Any], timeout: float = 0.5) -> list[Any]:
    """What arrives in `timeout` after everything expected came (nothing should)."""
    out = []
    with contextlib.suppress(TimeoutError):
        while True:
            out.append(await asyncio.wait_for(anext(events), timeout))
    return out


async def _running_example(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub = await connect("quote-service@example.com")
        jade, tom, barney = (await connect("jade@example.com"), await connect("tom@example.com"),
                             await connect("barney@example.com"))
        await pub.create_topic(TOPIC)
        # jade: one copy per message, InRe in the data's option (no batching)
        j1 = await jade.subscribe(TOPIC, 600, selector=SELECTOR, batch=None)
        j2 = await jade.subscribe(TOPIC, 600, selector=XMPL, batch=None)
        # tom: the same two, batched (InRe rides in each item's stamp)
        t1 = await tom.subscribe(TOPIC, 600, selector=SELECTOR)
        t2 = await tom.subscribe(TOPIC, 600, selector="(symbol=XMPL)",
                                 selector_class="RFC-2254")
        b1 = await barney.subscribe(TOPIC, 600)  # a topic subscription: every message
        assert None not in (j1, j2, t1, t2, b1) and j1 != j2 and t1 != t2
        # subscribing again with the same selector renews it, under its id
        assert await jade.subscribe(TOPIC, 900, selector=SELECTOR, batch=None) == j1
        before = sorted((s.subscriber, s.subscription_id, s.selector)
                        for s in app.service.subscriptions(TOPIC))
        assert len(before) == 5

        # 566, 567, 568: each refused, nothing changed
        with pytest.raises(UnsupportedSelectorClass):
            await jade.subscribe(TOPIC, 600, selector="//quote", selector_class="XPath")
        with pytest.raises(SelectorError) as bad:
            await jade.subscribe(TOPIC, 600, selector="symbol IN ('XMPL'")
        assert "at position 17" in str(bad.value), str(bad.value)
        with pytest.raises(UnknownSubscription):
            await jade.cancel(subscription_id="9999")
        assert j2 != b1
        with pytest.raises(UnknownSubscription):
            await barney.cancel(TOPIC, subscription_id=j2)  # an id of jade's, not of barney's
        assert sorted((s.subscriber, s.subscription_id, s.selector)
                      for s in app.service.subscriptions(TOPIC)) == before

        for symbol, pct in QUOTES:
            claims = "mallory@example.com" if symbol == "XMPL" else None
            await pub.publish(TOPIC, quote(symbol, pct, publisher=claims), "application/xml")

        expected = [(s, p) for s, p in QUOTES if _matches(s, p) or s == "XMPL"]
        for client, (first, second) in ((jade, (j1, j2)), (tom, (t1, t2))):
            got = await _deliveries(client, len(expected))
            assert [_symbol(d) for d in got] == expected
            for d in got:  # one copy per message, InRe naming every subscription it satisfied
                symbol, pct = _symbol(d)
                want = [i for i, hit in ((first, _matches(symbol, pct)),
                                         (second, symbol == "XMPL")) if hit]
                assert d.in_re is not None and sorted(d.in_re) == sorted(want), (symbol, pct)
            # a selecting link carries only its matches, contiguous
            assert [d.stamp.link_seq for d in got if d.stamp] == \
                list(range(1, len(expected) + 1))
        everything = await _deliveries(barney, len(QUOTES))
        assert [_symbol(d) for d in everything] == QUOTES
        assert all(d.in_re is None for d in everything)  # its one plain subscription
        assert not [e for e in await _drain(jade.events()) if isinstance(e, Delivered)]

        # ingest: headers and fields in the journal, the publisher the authenticated one
        entries = [e for e in app.core.journal.read_source("quote-service@example.com")
                   if e.kind is RecordKind.DATA]
        assert len(entries) == len(QUOTES)
        for e, (symbol, pct) in zip(entries, QUOTES, strict=True):
            assert e.fields["symbol"] == [symbol]
            assert e.fields["net-change-pct"] == [str(pct)]
            assert e.fields["publisher"] == ["quote-service@example.com"]
            assert e.publication_date is not None and e.publication_date > 0

        # cancel by id: jade's XMPL subscription ends, the next XMPL move names only j1
        await jade.cancel(subscription_id=j2)
        await pub.publish(TOPIC, quote("XMPL", 20.0), "application/xml")
        [late] = await _deliveries(jade, 1)
        assert _symbol(late) == ("XMPL", 20.0) and late.in_re == (j1,)
        # cancel by topic: all of tom's; cancel all: barney's; then nothing is left to cancel
        await tom.cancel(TOPIC)
        await barney.cancel()
        with pytest.raises(UnknownSubscription):
            await tom.cancel(TOPIC)
        assert sorted(s.subscriber for s in app.service.subscriptions(TOPIC)) == \
            ["jade@example.com"]
        assert {s.subscription_id for s in app.core.subscriptions if s.topic == TOPIC} == {j1}
        caps = await jade.capabilities()
        assert set(caps.selector_classes) == {"JMS", "RFC-2254"}
        for c in (pub, jade, tom, barney):
            await c.close()


def test_running_example(kafka_config: KafkaConfig) -> None:
    asyncio.run(_running_example(kafka_config))


async def _plain_path(config: KafkaConfig) -> None:
    """Unsequenced: one data to several recipients, InRe per recipient (§5.10.1.1)."""
    async with BrokerApp(config, sequenced=False) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade, fred = (await connect("quote-service@example.com"),
                           await connect("jade@example.com"), await connect("fred@example.com"))
        await pub.create_topic(TOPIC)
        j1 = await jade.subscribe(TOPIC, 600, selector=SELECTOR)
        j2 = await jade.subscribe(TOPIC, 600, selector=XMPL)
        f1 = await fred.subscribe(TOPIC, 600, selector="net-change-pct > 0")
        await pub.publish(TOPIC, quote("XMPL", 10.0), "application/xml")
        await pub.publish(TOPIC, quote("IBM", -1.0), "application/xml")  # nobody's
        await pub.publish(TOPIC, quote("TEST", 9.0), "application/xml")
        [a, b] = await _deliveries(jade, 2)
        assert (_symbol(a), sorted(a.in_re or ())) == (("XMPL", 10.0), sorted((j1, j2)))
        assert (_symbol(b), b.in_re) == (("TEST", 9.0), (j1,))
        [c, d] = await _deliveries(fred, 2)
        assert [(_symbol(x), x.in_re) for x in (c, d)] == [(("XMPL", 10.0), (f1,)),
                                                         (("TEST", 9.0), (f1,))]
        for client in (pub, jade, fred):
            await client.close()


def test_plain_path_sends_inre_per_recipient(kafka_config: KafkaConfig) -> None:
    asyncio.run(_plain_path(config=kafka_config))


async def _expiry_names_the_id(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "quote-service@example.com")
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        await pub.create_topic(TOPIC)
        keep = await jade.subscribe(TOPIC, 600, selector=SELECTOR)
        brief = await jade.subscribe(TOPIC, 1, selector=XMPL)
        events = jade.events()
        ended = await asyncio.wait_for(anext(events), 30)
        assert isinstance(ended, Ended) and (ended.topic, ended.subscription_id) == \
            (TOPIC, brief)
        assert [s.subscription_id for s in app.service.subscriptions(TOPIC)] == [keep]
        for c in (pub, jade):
            await c.close()


def test_the_services_cancel_on_expiry_names_the_subscription(kafka_config: KafkaConfig,
                                                              ) -> None:
    asyncio.run(_expiry_names_the_id(kafka_config))


async def _kill_9(config: KafkaConfig) -> None:
    """A robust subscriber with a selector: through kill -9 its subscription keeps selector and
    id, and it resumes with every matching message once, in order, none it did not select."""
    proc, port = await start_broker(config.bootstrap, "--heartbeat-ms", "500",
                                    namespace=config.namespace, logs=False)
    pub_messages: list[tuple[str, float]] = []
    try:
        pub = await PubsubClient.connect("127.0.0.1", port, "quote-service@example.com")
        await pub.create_topic(TOPIC)
        client = await PubsubClient.connect("127.0.0.1", port, "jade@example.com",
                                            reconnect=FOREVER)
        robust = await RobustSubscriber.open(client, "jade-quotes")
        sub_id = await robust.subscribe(TOPIC, 3600, selector=SELECTOR)
        rng = random.Random(20)
        for _ in range(30):
            pub_messages.append((rng.choice(["XMPL", "TEST", "IBM"]),
                                 rng.choice([-9.0, -2.0, 3.0, 7.5])))
            await pub.publish(TOPIC, quote(*pub_messages[-1]), "application/xml")
        await pub.close()
        received: list[tuple[str, float, tuple[str, ...]]] = []
        messages = robust.messages()
        want_before = [m for m in pub_messages if _matches(*m)]
        while len(received) < len(want_before):
            m = await asyncio.wait_for(anext(messages), 30)
            received.append((*_symbol_of(m.content), m.stamp.in_re))
        proc.kill()  # kill -9
        await proc.wait()
        proc, port = await start_broker(config.bootstrap, "--heartbeat-ms", "500",
                                        namespace=config.namespace, logs=False, port=port)
        pub = await PubsubClient.connect("127.0.0.1", port, "quote-service@example.com")
        for _ in range(30):
            pub_messages.append((rng.choice(["XMPL", "TEST", "SMPL", "IBM"]),
                                 rng.choice([-9.0, -2.0, 3.0, 7.5])))
            await pub.publish(TOPIC, quote(*pub_messages[-1]), "application/xml")
        want = [m for m in pub_messages if _matches(*m)]
        while len(received) < len(want):
            m = await asyncio.wait_for(anext(messages), 60)
            received.append((*_symbol_of(m.content), m.stamp.in_re))
        assert [(s, p) for s, p, _ in received] == want
        # the selector and the id survived: every delivery names the one subscription
        assert {ids for _, _, ids in received} == {(sub_id,)}
        # subscribing again with the same selector renews it under the same id
        assert await robust.subscribe(TOPIC, 3600, selector=SELECTOR) == sub_id
        await robust.close()
        await client.close()
        await pub.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _symbol_of(content: bytes) -> tuple[str, float]:
    text = content.decode()
    return (text.split("symbol='")[1].split("'")[0],
            float(text.split("<net-change-pct>")[1].split("<")[0]))


def test_kill_9_keeps_selectors_and_ids_and_the_robust_subscriber_loses_nothing(
        kafka_config: KafkaConfig) -> None:
    asyncio.run(_kill_9(kafka_config))


@pytest.mark.spark
def test_live_and_spark_decisions_agree_on_the_real_journal(kafka_config: KafkaConfig,
                                                            spark: Any) -> None:
    """Generated selectors and messages: a message goes to a selecting subscriber exactly when
    the selector's Spark SQL is TRUE on the journal's `fields` column as Spark reads it."""
    from broker.spark.journal_reader import load_journal
    from tests.selectors.generator import JmsGen, LdapGen, random_message

    rng = random.Random(2002)
    jms, ldap = JmsGen(rng), LdapGen(rng)
    texts = [("JMS", jms.cond()) for _ in range(12)] + \
        [("RFC-2254", ldap.selector()) for _ in range(8)] + [("JMS", SELECTOR)]
    bodies = [random_message(rng) for _ in range(40)] + \
        [quote(s, p) for s, p in QUOTES]
    delivered, entries = asyncio.run(_publish_generated(kafka_config, texts, bodies))
    df = load_journal(spark, kafka_config).where(
        "kind = 'DATA' AND source = 'gen@example.com'")  # not the service's WKT messages
    compiled = [selectors.compile(k, t) for k, t in texts]
    columns = [sel.to_spark("fields").alias(f"s{i}") for i, sel in enumerate(compiled)]
    rows = df.select("source_seq", *columns).collect()
    assert len(rows) == len(entries)
    mismatches = []
    for row in rows:
        for i in range(len(texts)):
            live = row["source_seq"] in delivered[i]
            if live != (row[f"s{i}"] is True):
                mismatches.append((texts[i], entries[row["source_seq"]].fields, live,
                                   row[f"s{i}"]))
    assert not mismatches, "\n".join(map(repr, mismatches[:5]))
    assert any(delivered) and not all(len(d) == len(entries) for d in delivered)


async def _publish_generated(config: KafkaConfig, texts: list[tuple[str, str]],
                             bodies: list[bytes],
                             ) -> tuple[list[set[int]], dict[int, JournalEntry]]:
    """Each selector held by its own subscriber; what each received, by source seq."""
    async with BrokerApp(config, robust=QUIET) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "gen@example.com")
        await pub.create_topic(TOPIC)
        subs = [await PubsubClient.connect("127.0.0.1", app.port, f"s{i}@example.com")
                for i in range(len(texts))]
        for client, (klass, text) in zip(subs, texts, strict=True):
            await client.subscribe(TOPIC, 600, selector=text, selector_class=klass)
        # a last subscriber takes everything: once it has all, every selection was made
        everyone = await PubsubClient.connect("127.0.0.1", app.port, "all@example.com")
        await everyone.subscribe(TOPIC, 600)
        for body in bodies:
            await pub.publish(TOPIC, body, "application/xml")
        await _deliveries(everyone, len(bodies))
        entries = {e.source_seq: e for e in app.core.journal.read_source("gen@example.com")}
        delivered: list[set[int]] = []
        for client in subs:
            await client.cancel(TOPIC)  # its 250 comes after every delivery sent before it
            got = [e for e in await _drain(client.events(), 0.2) if isinstance(e, Delivered)]
            delivered.append({d.stamp.source_seq for d in got if d.stamp and d.stamp.source_seq})
        for c in (pub, everyone, *subs):
            await c.close()
        return delivered, entries


SCHEMA = """<selector-schema class='JMS' xmlns:xs='http://www.w3.org/2001/XMLSchema'>
<xs:attribute name='symbol' type='xs:string'/>
<xs:element name='net-change-pct' type='xs:decimal'/></selector-schema>"""


async def _topic_schema(config: KafkaConfig) -> None:
    """A topic whose selector schema lists JMS and two names: 566 for RFC-2254, 567 for a
    name it does not offer (nothing recorded); ingest keeps only its names; a fitting
    selector is typed by it (net-change-pct compares as a number)."""
    from broker.records import Topic, now_ms

    async with BrokerApp(config, robust=QUIET) as app:
        app.core.topics.put(Topic(name=TOPIC, created_at=now_ms(), owner="admin@example.com",
                                  selector_schema=SCHEMA))
        pub = await PubsubClient.connect("127.0.0.1", app.port, "quote-service@example.com")
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        with pytest.raises(UnsupportedSelectorClass):
            await jade.subscribe(TOPIC, 600, selector="(symbol=XMPL)", selector_class="RFC-2254")
        with pytest.raises(SelectorError):
            await jade.subscribe(TOPIC, 600, selector="last-trade > 10")
        assert app.service.subscriptions(TOPIC) == []
        assert await jade.subscribe(TOPIC, 600, selector=SELECTOR, batch=None) == "1"
        await pub.publish(TOPIC, quote("XMPL", 10.0), "application/xml")
        await pub.publish(TOPIC, quote("TEST", 4.0), "application/xml")
        [got] = await _deliveries(jade, 1)
        assert _symbol(got) == ("XMPL", 10.0)
        [first, _] = list(app.core.journal.read_source("quote-service@example.com"))
        assert first.fields == {"symbol": ["XMPL"], "net-change-pct": ["10.0"]}
        for c in (pub, jade):
            await c.close()


def test_a_topics_selector_schema_decides_566_567_and_the_fields(kafka_config: KafkaConfig,
                                                                 ) -> None:
    asyncio.run(_topic_schema(kafka_config))


def cached_quote(symbol: str, pct: float, mid: str, rev: int, exp: str | None) -> bytes:
    expiry = "" if exp is None else f"<ps:expiration-date>{exp}</ps:expiration-date>"
    return (f"<ps:message-content xmlns:ps='{PS}'>{expiry}<ps:message-id>{mid}</ps:message-id>"
            f"<ps:revision-id>{rev}</ps:revision-id><ps:content>"
            f"<equity-quote symbol='{symbol}'><net-change-pct>{pct}</net-change-pct>"
            "</equity-quote></ps:content></ps:message-content>").encode()


#: (symbol, pct, message-id, revision, expiration) before the subscriber comes
HISTORY = [
    ("XMPL", 10.0, "1", 0, None),       # replaced by revision 1, which still matches
    ("XMPL", 12.0, "1", 1, "*"),        # cached: matches, latest revision, never expires
    ("TEST", 7.0, "2", 0, None),        # replaced by revision 1, which does not match
    ("TEST", 1.0, "2", 1, None),        # latest, does not match: not delivered
    ("SMPL", -8.0, "3", 0, "2001-01-01T00:00:00Z"),  # expired: never cached
    ("SMPL", 9.0, "4", 0, "0"),         # expiration 0: current subscribers only, never cached
    ("IBM", 20.0, "5", 0, None),        # not selected
    ("TEST", -6.0, "6", 3, "2099-01-01T00:00:00Z"),  # cached
]


async def _running_example_cached(config: KafkaConfig, sequenced: bool) -> None:
    """§5.8 with `cached`: the subscriber gets the matching, unexpired, latest-revision cached
    messages first (through its selector), then live traffic, once each."""
    async with BrokerApp(config, robust=QUIET, sequenced=sequenced) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "quote-service@example.com")
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        watcher = await PubsubClient.connect("127.0.0.1", app.port, "watcher@example.com")
        await pub.create_topic(TOPIC)
        await watcher.subscribe(TOPIC, 600)
        for symbol, pct, mid, rev, exp in HISTORY:
            await pub.publish(TOPIC, cached_quote(symbol, pct, mid, rev, exp), "application/xml")
        # forwarded, so in the cache (forward applies the item state first): the plain path
        # does not wait for the follower to catch up before it reads the cache
        await _deliveries(watcher, len(HISTORY) - 1)  # the expired one is never delivered
        sub_id = await jade.subscribe(TOPIC, 600, selector=SELECTOR, cached=True, batch=None)
        await pub.publish(TOPIC, cached_quote("SMPL", 6.0, "7", 0, "0"), "application/xml")
        await pub.publish(TOPIC, cached_quote("IBM", 6.0, "8", 0, None), "application/xml")
        await pub.publish(TOPIC, cached_quote("XMPL", -9.0, "1", 2, None), "application/xml")
        got = await _deliveries(jade, 4)
        assert sorted(_symbol(d) for d in got[:2]) == [("TEST", -6.0), ("XMPL", 12.0)]
        assert [_symbol(d) for d in got[2:]] == [("SMPL", 6.0), ("XMPL", -9.0)]
        assert all(d.in_re == (sub_id,) for d in got)
        assert not [e for e in await _drain(jade.events()) if isinstance(e, Delivered)]
        for c in (pub, jade, watcher):
            await c.close()


@pytest.mark.parametrize("sequenced", [True, False], ids=["robust", "plain"])
def test_running_example_with_cached_messages(kafka_config: KafkaConfig, sequenced: bool,
                                              ) -> None:
    asyncio.run(_running_example_cached(kafka_config, sequenced))
