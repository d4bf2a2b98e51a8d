"""Content-based pubsub: ingest cost per message, and live fan-out with selector subscriptions.

Run: `.venv/bin/python -m ops.bench.bench_content [--bootstrap HOST:PORT] [--full]`
(without --bootstrap a throwaway local Kafka is started; --quick, the default, runs the 10 and
1,000 subscription cases with fewer messages; --full adds 100,000).

Ingest (no Kafka): `broker.pubsub.ingest.ingest` on the draft's §5.2 quote — one hardened
parse, the six headers, every selectable field — in µs per message; then with the topic's
message schema validated on the same parse, and with a selector schema keeping four names.

Fan-out (real Kafka, the broker's own components in this process): a `BrokerApp` with the
sequenced delivery path; N subscriptions on N subscriber endpoints, each with a JMS selector
that matches about a tenth of the messages (`symbol = 'S<k>' AND net-change-pct > -<t>`, the
symbol uniform over ten values), beside the same N as plain topic subscriptions (each takes
everything). Publications go through `PubsubService.accept` (ingest included) and the journal;
from there it is the live path: the follower reads them back, the service selects through the
topic's `SubscriptionIndex` over the stored fields, the delivery core appends one link record
per delivery to Kafka and the renderer writes each data (the data are counted, not put on
sockets: N endpoints are not N connections). The figure is messages/s and deliveries/s from the
first append to the last delivery rendered. Subscriptions are put in the service's table
directly (not N registry writes to Kafka): set-up is not what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

SYMBOLS = [f"S{k}" for k in range(10)]
TOPIC = "equity.quote.service"
PS = "http://www.example.com/pubsub"
QUOTE = (f"<ps:message-content xmlns:ps='{PS}'><ps:message-id>1029</ps:message-id>"
         "<ps:revision-id>0</ps:revision-id><ps:content Name='Content'>"
         "<equity-quote symbol='XMPL'><issue-name>Example, Inc.</issue-name>"
         "<last-trade>11.0</last-trade><last-trade-datetime>October 18, 2001 11:12:00"
         "</last-trade-datetime><net-change-price>1.0</net-change-price>"
         "<net-change-pct>10.0</net-change-pct><best-bid-price>11.0</best-bid-price>"
         "<best-ask-price>12.0</best-ask-price></equity-quote></ps:content>"
         "</ps:message-content>").encode()
XSD = """<xs:schema xmlns:xs='http://www.w3.org/2001/XMLSchema'>
<xs:element name='equity-quote'><xs:complexType><xs:sequence>
<xs:element name='issue-name' type='xs:string'/><xs:element name='last-trade' type='xs:decimal'/>
<xs:element name='last-trade-datetime' type='xs:string'/>
<xs:element name='net-change-price' type='xs:decimal'/>
<xs:element name='net-change-pct' type='xs:decimal'/>
<xs:element name='best-bid-price' type='xs:decimal'/>
<xs:element name='best-ask-price' type='xs:decimal'/>
</xs:sequence><xs:attribute name='symbol' type='xs:string' use='required'/></xs:complexType>
</xs:element></xs:schema>"""
SELECTOR_SCHEMA = """<selector-schema class='JMS' xmlns:xs='http://www.w3.org/2001/XMLSchema'>
<xs:attribute name='symbol' type='xs:string'/><xs:element name='net-change-pct' type='xs:decimal'/>
<xs:element name='last-trade' type='xs:decimal'/><xs:element name='message-id' type='xs:int'/>
</selector-schema>"""


def _us_per_call(fn: Any, n: int) -> float:
    runs = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - began) / n * 1e6)
    return statistics.median(runs)


def bench_ingest(n: int) -> dict[str, float]:
    from broker.pubsub.ingest import ingest
    from broker.pubsub.schemas import compile_message_schema
    from broker.selectors import parse_selector_schema

    schema = compile_message_schema(XSD)
    selecting = parse_selector_schema(SELECTOR_SCHEMA)
    kw: dict[str, Any] = {"topic": TOPIC, "publisher": "quote@example.com", "now": 1}
    return {
        "headers+fields": _us_per_call(lambda: ingest(QUOTE, "application/xml", **kw), n),
        "+message schema": _us_per_call(
            lambda: ingest(QUOTE, "application/xml", validate=schema.validate, **kw), n),
        "selector schema (4 names)": _us_per_call(
            lambda: ingest(QUOTE, "application/xml", schema=selecting, **kw), n),
    }


def _body(rng: random.Random) -> bytes:
    return (f"<ps:message-content xmlns:ps='{PS}'><ps:content>"
            f"<equity-quote symbol='{rng.choice(SYMBOLS)}'><last-trade>11.0</last-trade>"
            f"<net-change-pct>{rng.uniform(-5, 5):.2f}</net-change-pct></equity-quote>"
            "</ps:content></ps:message-content>").encode()


async def _fanout(bootstrap: str, subs: int, selecting: bool, messages: int) -> dict[str, Any]:
    from adapters.app import BrokerApp
    from broker import selectors
    from broker.kafka_io import KafkaConfig
    from broker.records import Subscription, SubscriptionState, Topic, now_ms
    from broker.robust.config import RobustConfig

    config = KafkaConfig(bootstrap=bootstrap, namespace=f"bc{uuid.uuid4().hex[:10]}")
    async with BrokerApp(config, robust=RobustConfig(heartbeat_ms=3_600_000)) as app:
        app.core.topics.put(Topic(name=TOPIC, created_at=now_ms(), owner="bench"))
        now = now_ms()
        compiled: dict[str, Any] = {}
        for i in range(subs):
            text = f"symbol = 'S{i % 10}' AND net-change-pct > -{50 + i % 7}"
            sel = compiled.get(text)
            if sel is None and selecting:
                sel = compiled[text] = selectors.compile("JMS", text)
            sub = Subscription(subscriber=f"s{i}@example.com", subscription_id="1",
                               topic=TOPIC, duration_s=3600, state=SubscriptionState.ACTIVE,
                               created_at=now, expires_at=now + 3_600_000,
                               selector_class="JMS" if selecting else None,
                               selector=text if selecting else None)
            app.service._remember(sub, sel)  # set-up, not measured (see the docstring)
        assert app.handler.sequenced is not None
        render = app.handler.sequenced.render
        delivered = 0
        done = asyncio.Event()
        expected = messages * (subs // 10 if selecting else subs)

        def sink(data: Any, tags: Any = None) -> None:
            nonlocal delivered
            if data.originator.subaddress == TOPIC:
                delivered += len(data.recipients)
            elif data.content.startswith(b"<batch"):
                delivered += data.content.count(b"kind='data'")
            if delivered >= expected:
                done.set()

        render.send = sink
        rng = random.Random(7)
        bodies = [_body(rng) for _ in range(messages)]

        def publish() -> None:
            pubs = [app.service.accept("quote@example.com", TOPIC, b, "application/xml")
                    for b in bodies]
            failed: list[Any] = []
            for i in range(0, len(pubs), 200):
                app.core.journal.append_many(
                    pubs[i:i + 200],
                    lambda res: failed.extend(r for r in res if isinstance(r, Exception)))
            app.core.journal.flush()
            assert not failed, failed[:1]

        began = time.perf_counter()
        thread = threading.Thread(target=publish)
        thread.start()
        await asyncio.wait_for(done.wait(), 900)
        elapsed = time.perf_counter() - began
        thread.join()
        return {"subs": subs, "selecting": selecting, "messages": messages,
                "deliveries": delivered, "msg_s": messages / elapsed,
                "deliveries_s": delivered / elapsed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--bootstrap", help="an existing Kafka (default: start a throwaway one)")
    ap.add_argument("--full", action="store_true", help="add 100,000 subscriptions")
    ap.add_argument("--messages", type=int, default=0,
                    help="per fan-out case (default: 2,000 quick, 5,000 full)")
    args = ap.parse_args(argv)
    from adapters.cli import logs

    logs.configure("warning", json=True)
    print("ingest, µs per message (median of 5 runs of 2,000):")
    for name, us in bench_ingest(2000).items():
        print(f"  {name:28s} {us:8.1f}")
    counts = [10, 1000, 100_000] if args.full else [10, 1000]
    messages = args.messages or (5000 if args.full else 2000)
    if args.bootstrap is not None:
        return _run_fanout(args.bootstrap, counts, messages)
    from adapters.local.kafka import LocalKafka  # a throwaway single-node Kafka

    kafka = LocalKafka(Path(tempfile.mkdtemp(prefix="apexps-bench-")))
    try:
        return _run_fanout(kafka.start().bootstrap, counts, messages)
    finally:
        kafka.stop()


def _run_fanout(bootstrap: str, counts: list[int], messages: int) -> int:
    print("\nlive fan-out (selector subscriptions each match ~1/10):")
    print(f"  {'subs':>7} {'kind':>8} {'msgs':>6} {'msg/s':>9} {'deliv/s':>10} {'ratio':>6}")
    for n in counts:
        # about the same number of deliveries per case: fewer messages as subscriptions grow
        per = max(20, min(messages, messages * 1000 // max(n, 1000)))
        topic = asyncio.run(_fanout(bootstrap, n, False, per))
        sel = asyncio.run(_fanout(bootstrap, n, True, per))
        for r in (topic, sel):
            ratio = r["msg_s"] / topic["msg_s"]
            print(f"  {n:>7,} {'selector' if r['selecting'] else 'topic':>8} {per:>6}"
                  f" {r['msg_s']:>9,.0f} {r['deliveries_s']:>10,.0f} {ratio:>6.2f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
