"""The apex=pubsub service end to end: real Kafka, real BEEP over TCP, the draft's numbered steps
with each reply code (draft-schwartz-apex-pubsub §4.2-§4.7), fan-out read back from the journal,
expiry, and access control that leaves no trace when it refuses."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lxml import etree

from adapters.apex import Endpoint
from adapters.app import BrokerApp
from adapters.client.client import ApexClient
from adapters.client.pubsub_client import Delivered, Ended, PubsubClient
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, watermarks
from common.errors import AccessDenied, ApexpsError, InvalidParameter, NotTaken
from tests.integration.broker_process import start_broker

pytestmark = pytest.mark.kafka

DOMAIN = "example.com"
ACCESS = """<access domain='example.com'>
  <allow id='admins' originator='admin@example.com' tokens='pubsub:all core:data' />
  <allow id='readers' originator='*@example.com' tokens='pubsub:listtopics pubsub:subscribe
     pubsub:cancel' />
  <allow id='jazz-open' originator='*@*' tokens='core:data' topic='music.jazz' />
  <deny id='slate' originator='mr.slate@example.com' tokens='core:data' topic='music.jazz' />
  <deny id='banned' originator='banned@example.com' tokens='pubsub:all' />
</access>
"""


async def _next(events: AsyncIterator[Delivered | Ended], timeout: float = 30) -> Delivered | Ended:
    return await asyncio.wait_for(anext(events), timeout)


def _journal_size(config: KafkaConfig) -> int:
    return sum(watermarks(config, config.topic("journal"), p)[1]
               for p in range(config.journal_partitions))


async def _steps(config: KafkaConfig, access: Path) -> None:
    async with BrokerApp(config, domain=DOMAIN, access_file=access) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        admin, fred, slate, banned = (await connect("admin@example.com"),
                                      await connect("fred@example.com"),
                                      await connect("mr.slate@example.com"),
                                      await connect("banned@example.com"))
        # createtopic: 537 (fred lacks pubsub:createtopic), 553 (bad name), 250, 553 (exists)
        with pytest.raises(AccessDenied):
            await fred.create_topic("music.jazz")
        with pytest.raises(InvalidParameter):
            await admin.create_topic("Not/A@Topic")
        await admin.create_topic("music.jazz")
        with pytest.raises(InvalidParameter):
            await admin.create_topic("music.jazz")
        # listtopics: 537, 250 with the topic
        with pytest.raises(AccessDenied):
            await banned.list_topics()
        assert await fred.list_topics() == ["music.jazz"]
        # subscribe: 537, 553 unknown topic, 553 duration <= 0, 250
        with pytest.raises(AccessDenied):
            await banned.subscribe("music.jazz", 60)
        with pytest.raises(InvalidParameter):
            await fred.subscribe("music.rock", 60)
        with pytest.raises(InvalidParameter):
            await fred.subscribe("music.jazz", 0)
        await fred.subscribe("music.jazz", 60)
        # data: 550 unknown topic, 537 for the denied mr.slate (deny beats the *@* allow)
        before = _journal_size(config)
        with pytest.raises(NotTaken):
            await admin.publish("music.rock", b"x")
        with pytest.raises(AccessDenied):
            await slate.publish("music.jazz", b"<yabba/>")
        assert _journal_size(config) == before, "a refused publication reached Kafka"
        # a publication is forwarded to the subscriber, read back from the journal
        await admin.publish("music.jazz", b"<FavoriteAlbum title='Kind of Blue' />",
                            "application/beep+xml")
        got = await _next(fred.events())
        assert isinstance(got, Delivered) and got.topic == "music.jazz"
        # XML content travels inside data-content: the same element, not the same octets
        album = etree.fromstring(got.content)
        assert (album.tag, album.get("title")) == ("FavoriteAlbum", "Kind of Blue")
        assert got.originator == "apex=pubsub/music.jazz@example.com"
        # cancel: 537, 553 unknown topic, 250, then nothing more arrives for fred
        with pytest.raises(AccessDenied):
            await banned.cancel("music.jazz")
        with pytest.raises(InvalidParameter):
            await fred.cancel("music.rock")
        await fred.cancel("music.jazz")
        assert app.service.recipients("music.jazz") == []
        # "only subscribers may publish" (draft §7): music.bop has no general core:data allow;
        # the service grants it on subscribe and takes it back on cancel
        await admin.create_topic("music.bop")
        with pytest.raises(AccessDenied):
            await fred.publish("music.bop", b"before")
        await fred.subscribe("music.bop", 60)
        await fred.publish("music.bop", b"while subscribed")
        await fred.cancel("music.bop")
        with pytest.raises(AccessDenied):
            await fred.publish("music.bop", b"after")
        # deletetopic: 537, 553 unknown, 250; then data to it is 550
        with pytest.raises(AccessDenied):
            await fred.delete_topic("music.jazz")
        with pytest.raises(InvalidParameter):
            await admin.delete_topic("music.rock")
        await admin.delete_topic("music.jazz")
        with pytest.raises(NotTaken):
            await admin.publish("music.jazz", b"x")
        for c in (admin, fred, slate, banned):
            await c.close()


def test_every_numbered_step_and_code(kafka_config: KafkaConfig, tmp_path: Path) -> None:
    access = tmp_path / "access.xml"
    access.write_text(ACCESS)
    asyncio.run(_steps(kafka_config, access))


async def _denied_leaves_no_trace(config: KafkaConfig, access: Path) -> tuple[int, ...]:
    async with BrokerApp(config, domain=DOMAIN, access_file=access) as app:
        admin = await PubsubClient.connect("127.0.0.1", app.port, "admin@example.com")
        await admin.create_topic("music.jazz")
        outsider = await PubsubClient.connect("127.0.0.1", app.port, "wilma@example.com")
        sizes = (_journal_size(config), len(app.core.topics), len(app.core.subscriptions))
        refusals = 0
        for attempt in (outsider.create_topic("music.bebop"), outsider.delete_topic("music.jazz"),
                        outsider.publish("music.blues", b"x")):
            try:
                await attempt
            except AccessDenied:
                refusals += 1
            except NotTaken:  # music.blues does not exist: 550 comes after the access check
                refusals += 10
        app.core.topics.load()
        app.core.subscriptions.load()
        after = (_journal_size(config), len(app.core.topics), len(app.core.subscriptions))
        await admin.close()
        await outsider.close()
        return refusals, *sizes, *after


def test_unauthorized_operations_answer_537_and_change_nothing(kafka_config: KafkaConfig,
                                                               tmp_path: Path) -> None:
    access = tmp_path / "access.xml"
    access.write_text(ACCESS)
    refusals, *sizes = asyncio.run(_denied_leaves_no_trace(kafka_config, access))
    assert refusals == 3
    assert sizes[:3] == sizes[3:]


async def _expiry_and_delete(config: KafkaConfig) -> list[str]:
    async with BrokerApp(config, domain=DOMAIN) as app:
        fred = await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com")
        await fred.create_topic("news.short")
        await fred.create_topic("news.long")
        await fred.subscribe("news.short", 1)
        await fred.subscribe("news.long", 600)
        seen: list[str] = []
        events = fred.events()
        first = await _next(events, 15)  # the service's cancel on expiry
        assert isinstance(first, Ended)
        seen.append(f"ended {first.topic}")
        assert app.service.recipients("news.short") == []
        await fred.delete_topic("news.long")  # its subscription ends with it, with a cancel
        second = await _next(events, 15)
        assert isinstance(second, Ended)
        seen.append(f"ended {second.topic}")
        await fred.close()
        return seen


def test_duration_expiry_and_deletetopic_send_the_cancel(kafka_config: KafkaConfig) -> None:
    assert asyncio.run(_expiry_and_delete(kafka_config)) == ["ended news.short",
                                                             "ended news.long"]


async def _receive_all(client: PubsubClient, count: int,
                       topics: set[str]) -> Counter[bytes]:
    counter: Counter[bytes] = Counter()
    events = client.events()
    while sum(counter.values()) < count:
        event = await _next(events)
        assert isinstance(event, Delivered)
        assert event.topic in topics
        counter[event.content] += 1
    return counter


async def _fan_out(config: KafkaConfig) -> tuple[dict[str, Counter[bytes]], dict[str, set[bytes]],
                                                  list[str], int, dict[str, bytes]]:
    topics = [f"t{i}.feed" for i in range(5)]
    proc, port = await start_broker(config.bootstrap, namespace=config.namespace,
                                      logs=False)
    pubs = [await PubsubClient.connect("127.0.0.1", port, f"pub{i}@example.com")
            for i in range(3)]
    for t in topics:
        await pubs[0].create_topic(t)
    names = [f"sub{i}@example.com" for i in range(20)]
    subs = {who: await PubsubClient.connect("127.0.0.1", port, who) for who in names}
    wants = {who: {topics[i % 5], topics[(i + 1) % 5]} for i, who in enumerate(names)}
    for who, client in subs.items():
        for t in sorted(wants[who]):
            await client.subscribe(t, 600)
    sent: dict[str, set[bytes]] = {t: set() for t in topics}

    async def publish(n: int, client: PubsubClient) -> None:
        for k, t in itertools.product(range(10), topics):
            body = f"p{n}-{t}-{k}".encode()
            await client.publish(t, body)
            sent[t].add(body)

    await asyncio.gather(*(publish(n, c) for n, c in enumerate(pubs)))
    expected = {who: set().union(*(sent[t] for t in wants[who])) for who in names}
    got = {who: await _receive_all(subs[who], len(expected[who]), wants[who]) for who in names}
    # Nothing beyond: a marker published now is the next thing each subscriber of t0 sees.
    await pubs[0].publish(topics[0], b"marker")
    for who in names:
        if topics[0] in wants[who]:
            event = await _next(subs[who].events())
            assert isinstance(event, Delivered) and event.content == b"marker", who
    # kill -9, restart on the same Kafka: topics and subscriptions are back, publishing resumes
    proc.kill()
    await proc.wait()
    for c in (*pubs, *subs.values()):
        with contextlib.suppress(ApexpsError, ConnectionError):
            await c.close()
    proc, port = await start_broker(config.bootstrap, namespace=config.namespace,
                                      logs=False)
    try:
        admin = await PubsubClient.connect("127.0.0.1", port, "pub0@example.com")
        listed = await admin.list_topics()
        core = BrokerCore(config)
        core.open()
        subscriptions = len(core.subscriptions)
        core.close()
        # the subscribers only re-attach: their subscriptions live in the broker
        again = {who: await PubsubClient.connect("127.0.0.1", port, who) for who in names}
        for t in topics:
            await admin.publish(t, f"after-{t}".encode())
        after = {}
        for who, client in again.items():
            seen = await _receive_all(client, 2, wants[who])
            after[who] = b" ".join(sorted(seen))
        for c in (admin, *again.values()):
            await c.close()
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 60)
    return got, expected, listed, subscriptions, after


def test_three_publishers_five_topics_twenty_subscribers_and_kill_9(
        kafka_config: KafkaConfig) -> None:
    """Every subscriber receives exactly the messages of its topics, each once; after kill -9
    and a restart the 5 topics and 40 subscriptions are intact and publishing resumes."""
    got, expected, listed, subscriptions, after = asyncio.run(_fan_out(kafka_config))
    for who, counter in got.items():
        assert set(counter) == expected[who], who
        assert max(counter.values()) == 1, f"{who} got duplicates"
    assert listed == [f"t{i}.feed" for i in range(5)]
    assert subscriptions == 40
    for i, (who, seen) in enumerate(sorted(after.items(), key=lambda kv: int(kv[0][3:-12]))):
        mine = sorted(f"after-t{j}.feed" for j in (i % 5, (i + 1) % 5))
        assert seen == " ".join(mine).encode(), who


async def _bad_documents(config: KafkaConfig) -> list[int]:
    async with BrokerApp(config, domain=DOMAIN) as app:
        client = await ApexClient.connect("127.0.0.1", app.port)
        await client.attach("fred@example.com")
        codes = []
        for doc in (b"<createtopic topic='a'", b"<frobnicate />",
                    b"<!DOCTYPE x [<!ENTITY a 'b'>]><listtopics />"):
            try:
                await client.send("fred@example.com", ["apex=pubsub@example.com"], doc,
                                  "application/beep+xml")
                codes.append(250)
            except ApexpsError as exc:
                codes.append(int(exc.code))
        # and the service keeps serving
        pubsub = PubsubClient(client, Endpoint.parse("fred@example.com"))
        await pubsub.create_topic("still.serving")
        codes.append(250 if "still.serving" in await pubsub.list_topics() else 0)
        await pubsub.close()
        return codes


def test_malformed_documents_get_500_501_and_the_service_survives(
        kafka_config: KafkaConfig) -> None:
    assert asyncio.run(_bad_documents(kafka_config)) == [500, 501, 500, 250]
