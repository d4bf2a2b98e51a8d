"""`apexps replay` equals what live subscribers received: several publishers through a real
broker (real Kafka, real BEEP over TCP), subscribers that were there from the start, one that
came late, one denied a permission token; then the replay of the journal, for the same window
and the same view, holds the same messages in the same per-source order."""

from __future__ import annotations

import asyncio
import base64
import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from adapters.app import BrokerApp
from adapters.cli.main import main
from adapters.client.pubsub_client import Delivered, Ended, LinkEvent, PubsubClient
from broker.entitlements import parse_token_set
from broker.kafka_io import KafkaConfig
from broker.records import AccessEffect, AccessEntry, AccessKind, now_ms
from broker.robust.config import RobustConfig

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)
PUBLISHERS = ("alice@example.com", "bob@example.com", "carol@example.com")
TOKENS = (None, "6747", None, "6800", None)

#: (source, source_seq) -> content: one subscriber's view, per source in arrival order.
View = dict[str, list[tuple[int, bytes]]]


async def _received(client: PubsubClient, count: int) -> View:
    """The next `count` messages `client` is delivered (a link's opening reset skipped)."""
    view: View = defaultdict(list)
    events = client.events()
    got = 0
    while got < count:
        event = await asyncio.wait_for(anext(events), 30)
        if isinstance(event, LinkEvent | Ended):
            assert not isinstance(event, Ended), event
            continue
        assert isinstance(event, Delivered)
        assert event.stamp is not None and event.stamp.source is not None
        assert event.stamp.source_seq is not None
        view[event.stamp.source].append((event.stamp.source_seq, event.content))
        got += 1
    return dict(view)


def _content(k: int, who: str) -> bytes:
    if k == 7:
        return b"\xff\xfe binary, not UTF-8 " + who.encode()
    return f"<quote n='{k}' by='{who}'>\u00e9{k}</quote>".encode()


async def _history(config: KafkaConfig) -> tuple[View, View, View, datetime, int]:
    """fred (every token) and jade (6747 denied) from the start, wilma from `cut` on."""
    async with BrokerApp(config, robust=QUIET) as app:  # default: the domain gets every token
        app.access.put(AccessEntry("cli:jade-6747", "jade@example.com",
                                   parse_token_set("6747").items, AccessEffect.DENY, now_ms(),
                                   kind=AccessKind.PERMTOKEN))
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pubs = [await connect(p) for p in PUBLISHERS]
        fred, jade, wilma = (await connect("fred@example.com"),
                             await connect("jade@example.com"),
                             await connect("wilma@example.com"))
        await pubs[0].create_topic("q.replay")
        await pubs[0].create_topic("q.noise")
        await fred.subscribe("q.replay", 600)
        await jade.subscribe("q.replay", 600, link="jade-desk")

        async def batch(ks: range) -> None:
            for k in ks:
                who = k % len(PUBLISHERS)
                await pubs[who].publish("q.replay", _content(k, PUBLISHERS[who]),
                                        token=TOKENS[k % len(TOKENS)])
                if k % 4 == 0:
                    await pubs[(who + 1) % 3].publish("q.noise", b"<other/>")

        await batch(range(12))
        # Every message of the first batch is acknowledged, so its Kafka timestamp is at or
        # before now; the window of the late subscriber starts on the next millisecond.
        cut_ms = now_ms() + 1
        while now_ms() <= cut_ms:
            await asyncio.sleep(0.001)
        await wilma.subscribe("q.replay", 600)
        await batch(range(12, 30))
        first = sum(1 for k in range(30) if TOKENS[k % len(TOKENS)] != "6747")
        got = (await _received(fred, 30), await _received(jade, first),
               await _received(wilma, 18))
        for c in (*pubs, fred, jade, wilma):
            await c.close()
    return (*got, datetime.fromtimestamp(cut_ms / 1000, UTC), first)


def _replayed(out: Path) -> tuple[list[dict[str, Any]], View]:
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    view: View = defaultdict(list)
    for r in rows:
        raw = (base64.b64decode(r["content"]) if r["content_encoding"] == "base64"
               else r["content"].encode())
        view[r["source"]].append((r["source_seq"], raw))
    return rows, dict(view)


def _replay(kafka_config: KafkaConfig, out: Path, *extra: str) -> tuple[list[dict[str, Any]],
                                                                       View]:
    rc = main(["replay", "--topic", "q.replay", "--bootstrap", kafka_config.bootstrap,
               "--namespace", kafka_config.namespace, "--out", str(out), *extra])
    assert rc == 0
    return _replayed(out)


def test_replay_equals_what_live_subscribers_received(kafka_config: KafkaConfig, spark: Any,
                                                      tmp_path: Path) -> None:
    """The whole journal replays as fred received it, `--as jade` as jade did (her denied
    token left out), `--from CUT` as wilma, who subscribed at CUT, did; each source in its
    live order, the binary message intact."""
    fred, jade, wilma, cut, jade_count = asyncio.run(_history(kafka_config))
    assert set(fred) == set(PUBLISHERS) and sum(map(len, fred.values())) == 30

    rows, everything = _replay(kafka_config, tmp_path / "all.jsonl")
    assert everything == fred
    assert [(r["source"], r["source_seq"]) for r in rows] == sorted(
        (r["source"], r["source_seq"]) for r in rows)
    assert {r["topic"] for r in rows} == {"q.replay"}
    assert sum(r["content_encoding"] == "base64" for r in rows) == 1
    assert [r["permission_token"] for r in rows if r["source"] == PUBLISHERS[0]][:2] == \
        [None, "6800"]  # k = 0, 3: the journal's view carries each message's token

    _, as_jade = _replay(kafka_config, tmp_path / "jade.jsonl", "--as", "jade@example.com")
    assert as_jade == jade and sum(map(len, as_jade.values())) == jade_count < 30

    _, late = _replay(kafka_config, tmp_path / "late.jsonl", "--from", cut.isoformat())
    assert late == wilma and sum(map(len, late.values())) == 18
