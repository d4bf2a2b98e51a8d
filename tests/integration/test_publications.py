"""Many publications in one data (`<publications>`, docs/robust-binding.md §2.6), against the
real Kafka over the real BEEP wire: what a client publishes in one turn goes as one data and
arrives, journaled and forwarded, in call order; one refused publication refuses the document,
and nothing of it is journaled; a hostile document is refused with its code and the service
goes on; a plain subscriber that said batch= gets its live data packed, the same messages with
the same InRe as one that did not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from adapters.apex.codec import BEEP_XML
from adapters.apex.publications_codec import Publication, encode_publications
from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, Ended, PubsubClient
from adapters.pubsub._plain_packs import PlainPacks
from adapters.pubsub.handler import PubsubHandler
from broker.kafka_io import KafkaConfig, watermarks
from broker.records import PublishType
from common.errors import AccessDenied, NotTaken, ParameterSyntaxError, SyntaxError_

pytestmark = pytest.mark.kafka

ACCESS = """<access domain='example.com'>
  <allow id='all' originator='*@example.com' tokens='pubsub:all core:data' />
  <deny id='slate' originator='mr.slate@example.com' tokens='core:data' topic='q.closed' />
</access>
"""


def _spy(monkeypatch: pytest.MonkeyPatch, cls: type, name: str,
         seen: Callable[..., Any] = lambda _self, arg: arg) -> list[Any]:
    """Wrap `cls.name`: each call's `seen(self, arg)` (unless None) is recorded, then the
    method runs as it would."""
    calls: list[Any] = []
    method = getattr(cls, name)

    def spy(self: Any, arg: Any) -> Any:
        if (what := seen(self, arg)) is not None:
            calls.append(what)
        return method(self, arg)

    monkeypatch.setattr(cls, name, spy)
    return calls


def _journal_size(config: KafkaConfig) -> int:
    return sum(watermarks(config, config.topic("journal"), p)[1]
               for p in range(config.journal_partitions))


async def _received(events: AsyncIterator[Delivered | Ended], n: int) -> list[Delivered]:
    got: list[Delivered] = []
    while len(got) < n:
        event = await asyncio.wait_for(anext(events), 30)
        if isinstance(event, Delivered):
            got.append(event)
    return got


async def _one_turn_one_data(config: KafkaConfig, documents: list[Any]) -> None:
    async with BrokerApp(config) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        await pub.create_topic("q.items")
        await jade.subscribe("q.items", 600)
        sent = [f"m{i}".encode() for i in range(50)]
        # gather's tasks take their first step in one turn: one document for all fifty, with
        # a publication that says more than a plain update among them
        await asyncio.gather(*(
            pub.publish("q.items", body, publish_type=PublishType.IMAGE, message_id="X")
            if i == 7 else pub.publish("q.items", body) for i, body in enumerate(sent)))
        assert len(documents) == 1
        got = await _received(jade.events(), len(sent))
        assert [d.content for d in got] == sent
        entries = list(app.core.journal.read_source("pub@example.com"))
        assert [(e.source_seq, e.content) for e in entries] == list(enumerate(sent, 1))
        assert (entries[7].publish_type, entries[7].message_id) == (PublishType.IMAGE, "X")
        # one publication alone goes as a data of its own
        await pub.publish("q.items", b"alone")
        assert len(documents) == 1
        assert [d.content for d in await _received(jade.events(), 1)] == [b"alone"]
        for c in (pub, jade):
            await c.close()


def test_a_turns_publications_go_in_one_data_and_arrive_in_order(
        kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    documents = _spy(monkeypatch, PubsubHandler, "_publications")
    asyncio.run(_one_turn_one_data(kafka_config, documents))


async def _refusals(config: KafkaConfig, access: Path) -> None:
    async with BrokerApp(config, access_file=access) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        slate = await PubsubClient.connect("127.0.0.1", app.port, "mr.slate@example.com")
        jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
        for topic in ("q.items", "q.closed"):
            await pub.create_topic(topic)
        await jade.subscribe("q.items", 600)
        before = _journal_size(config)

        # publication 3 names no topic: every call of the document is refused with 550
        calls = [pub.publish("q.no.such" if i == 3 else "q.items", b"x%d" % i)
                 for i in range(6)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, NotTaken) and "publication 3" in str(r) for r in results)
        # a publication the originator may not make: 537, for the whole document
        results = await asyncio.gather(slate.publish("q.items", b"ok"),
                                       slate.publish("q.closed", b"denied"),
                                       return_exceptions=True)
        assert all(isinstance(r, AccessDenied) for r in results)
        # hostile and malformed documents: 500 and 501; the connection and service go on
        with pytest.raises(SyntaxError_):
            await pub.client.send(pub.endpoint, [pub.service],
                                  b"<!DOCTYPE publications [<!ENTITY a 'b'>]>"
                                  b"<publications>&a;</publications>", BEEP_XML)
        with pytest.raises(ParameterSyntaxError):
            await pub.client.send(pub.endpoint, [pub.service], encode_publications(
                [Publication("q.items", b"x")]).replace(b"eA==", b"e A=="), BEEP_XML)
        with pytest.raises(ParameterSyntaxError, match="inre"):  # the service's to say
            await pub.client.send(pub.endpoint, [pub.service], encode_publications(
                [Publication("q.items", b"x"), Publication("q.items", b"y", in_re=("1",))]),
                BEEP_XML)
        assert _journal_size(config) == before, "a refused document reached Kafka"

        # the source's seqs go on from where they were: nothing of the refused was numbered
        await asyncio.gather(pub.publish("q.items", b"after-1"), pub.publish("q.items",
                                                                            b"after-2"))
        got = await _received(jade.events(), 2)
        assert [d.content for d in got] == [b"after-1", b"after-2"]
        entries = list(app.core.journal.read_source("pub@example.com"))
        assert [(e.source_seq, e.content) for e in entries] == [(1, b"after-1"),
                                                                (2, b"after-2")]
        for c in (pub, slate, jade):
            await c.close()


def test_one_refused_publication_refuses_the_document_and_journals_none_of_it(
        kafka_config: KafkaConfig, tmp_path: Path) -> None:
    access = tmp_path / "access.xml"
    access.write_text(ACCESS)
    asyncio.run(_refusals(kafka_config, access))


QUOTE = "<q sym='{sym}' kind='{kind}' n='{n}'>{pad}</q>"


async def _plain_packed(config: KafkaConfig, packed: list[str]) -> None:
    async with BrokerApp(config, sequenced=False) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade, rex = (await connect("pub@example.com"), await connect("jade@example.com"),
                          await connect("rex@example.com"))
        await pub.create_topic("q.sel")
        # the same two subscriptions each: jade's live data packed (the client's default
        # batch=), rex's a data each (batch=None, as an APEX client that never says batch=)
        ids = {who.endpoint.local: (await who.subscribe("q.sel", 600, selector="sym = 'A'",
                                                        **kw),
                                    await who.subscribe("q.sel", 600, selector="kind = 'x'",
                                                        **kw))
               for who, kw in ((jade, {}), (rex, {"batch": None}))}
        sent = [QUOTE.format(sym=sym, kind=kind, n=n, pad="." * (70_000 if n == 5 else 0))
                .encode() for n, (sym, kind) in enumerate(
                    [("A", "x"), ("A", "y"), ("B", "x"), ("B", "y")] * 3)]
        await asyncio.gather(*(pub.publish("q.sel", body, "application/xml") for body in sent))
        chosen = [b for b in sent if b"sym='A'" in b or b"kind='x'" in b]
        for who in (jade, rex):
            got = await _received(who.events(), len(chosen))
            first, second = ids[who.endpoint.local]
            assert [d.content for d in got] == chosen  # the 70 kB one among them, in its place
            assert [sorted(d.in_re or ()) for d in got] == [
                sorted(([first] if b"sym='A'" in b else []) + ([second] if b"kind='x'" in b
                                                               else [])) for b in chosen]
            assert {d.originator for d in got} == {"apex=pubsub/q.sel@example.com"}
        assert set(packed) == {"jade@example.com"}
        for c in (pub, jade, rex):
            await c.close()


def test_a_plain_subscriber_that_said_batch_takes_its_live_data_packed(
        kafka_config: KafkaConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # the subscribers a pack of two or more went to (one of one goes as a data of its own)
    flushed = _spy(monkeypatch, PlainPacks, "flush",
                   lambda packs, who: who if len(packs._packs.get(who, ((), 0))[0]) > 1 else None)
    asyncio.run(_plain_packed(kafka_config, flushed))
