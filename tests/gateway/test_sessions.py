"""A user's resource watches share one gateway→broker session and one robust link, on a real
broker and Kafka over real HTTP: the gateway demultiplexes the user's Notifies by watch id, a
watch of one user never reaches another's stream, the broker still judges each user (the
session is attached as that user), DELETE ends only that watch, and the last one closes the
user's session."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.client.pubsub_client import PubsubClient
from adapters.client.reconnect import ReconnectPolicy
from adapters.gateway import Auth, Gateway
from broker.kafka_io import KafkaConfig
from broker.records import PublishType
from tests.gateway.live import TIMEOUT, Bench, bench, bench_on, take
from tests.gateway.sse import SseReader
from tests.gateway.test_http import run
from tests.integration.broker_process import start_broker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ACCESS = """<access domain='example.com'>
  <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
  <deny id='not-bob' originator='bob/*@example.com' tokens='pubsub:subscribe'
        topic='g.ann' />
</access>
"""
ANN = {"Authorization": "Bearer tok-ann"}
BOB = {"Authorization": "Bearer tok-bob"}


async def _watch(b: Bench, resource: str, who: dict[str, str],
                 status: int = 201) -> dict[str, Any]:
    async with b.http.post(f"{b.url}/subscriptions", headers=who, json={
            "resource": resource, "events": ["modified"], "expires": 600}) as r:
        sub = await r.json()
        assert r.status == status, sub
        return dict(sub)


async def _stream(b: Bench, sub: dict[str, Any], who: dict[str, str]) -> SseReader:
    r = await b.http.get(sub["events"], headers=who)
    assert r.status == 200
    return SseReader(r)


async def _update(b: Bench, resource: str, n: int) -> None:
    topic, _, item = resource.partition("/")
    await b.pub.publish(topic, f"<v n='{n}' />".encode(), "application/xml",
                        publish_type=PublishType.UPDATE, message_id=item)


def test_one_session_per_user_and_no_watch_crosses_users(kafka_config: KafkaConfig,
                                                         tmp_path: Path) -> None:
    """Ann's three watches and Bob's two make two sessions, one link each; every stream gets
    its own watch's Notifies, numbered 1, 2, 3, and nothing of the others' (Ann and Bob both
    watch g.mux/A); Bob may not watch g.ann, though Ann's session could; DELETE of one of
    Ann's watches ends that stream alone, and her last one closes her session."""
    access = tmp_path / "access.xml"
    access.write_text(ACCESS)
    auth = Auth(tokens={"tok-ann": "ann", "tok-bob": "bob"})

    async def body() -> None:
        async with bench(kafka_config, access_file=str(access), auth=auth) as b:
            for topic in ("g.mux", "g.ann"):
                await b.pub.create_topic(topic)
            for resource in ("g.mux/A", "g.mux/B", "g.mux/C", "g.ann/X"):
                topic, _, item = resource.partition("/")
                await b.pub.publish(topic, b"<v n='0' />", "application/xml",
                                    publish_type=PublishType.IMAGE, message_id=item,
                                    implicit=False)
            ann = {r: await _watch(b, r, ANN) for r in ("g.mux/A", "g.mux/B", "g.ann/X")}
            bob = {r: await _watch(b, r, BOB) for r in ("g.mux/A", "g.mux/C")}
            await _watch(b, "g.ann/X", BOB, 403)  # judged as bob, not on ann's session

            feeds, sessions = b.gateway.feeds.feeds, b.gateway.feeds.sessions
            assert sorted(s.user for s in sessions) == ["ann", "bob"]
            for subs, user in ((ann, "ann"), (bob, "bob")):
                links = {sub["link"] for sub in subs.values()}
                assert len(links) == 1 and links.pop().startswith(f"{user}/gw-")
                assert len({id(feeds[sub["id"]].client) for sub in subs.values()}) == 1
            assert feeds[ann["g.mux/A"]["id"]].client is not feeds[bob["g.mux/A"]["id"]].client

            readers = {(who, r): await _stream(b, sub, hdr)
                       for who, subs, hdr in (("ann", ann, ANN), ("bob", bob, BOB))
                       for r, sub in subs.items()}
            for n in (1, 2):
                for resource in ("g.mux/A", "g.mux/B", "g.mux/C", "g.ann/X"):
                    await _update(b, resource, n)
            for (who, resource), reader in readers.items():
                sub = (ann if who == "ann" else bob)[resource]
                got = await take(reader, 3)
                assert [e.id for e in got] == [1, 2, 3], (who, resource)
                assert {(e.data["subscription"], e.data["resource"]) for e in got} == {
                    (sub["id"], resource)}, (who, resource, [e.data for e in got])
                assert [e.data["versions"][-1]["content"] for e in got] == [
                    "<v n='0' />", "<v n='1' />", "<v n='2' />"]

            # DELETE ends that watch's stream alone
            async with b.http.delete(f"{b.url}/subscriptions/{ann['g.mux/A']['id']}",
                                     headers=ANN) as r:
                assert r.status == 204
            assert await asyncio.wait_for(readers["ann", "g.mux/A"].next(), TIMEOUT) is None
            await _update(b, "g.mux/A", 3)
            await _update(b, "g.mux/B", 3)
            (a3,) = await take(readers["bob", "g.mux/A"], 1)
            (b3,) = await take(readers["ann", "g.mux/B"], 1)
            assert (a3.id, b3.id) == (4, 4)

            # Ann's last watch closes her session; Bob's stays
            for resource in ("g.mux/B", "g.ann/X"):
                async with b.http.delete(f"{b.url}/subscriptions/{ann[resource]['id']}",
                                         headers=ANN) as r:
                    assert r.status == 204
            assert [s.user for s in b.gateway.feeds.sessions] == ["bob"]
            for reader in readers.values():
                reader.close()
    run(body())


@pytest.mark.parametrize("replay", [1024, 1], ids=["from-buffer", "by-gap-fill"])
def test_watches_sharing_a_session_across_a_broker_kill_9(kafka_config: KafkaConfig,
                                                          replay: int) -> None:
    """Two watches on one session read their current state and two updates each (ids 1..3),
    their streams go away, the broker is killed with SIGKILL and started again on its port,
    the items change again; each stream comes back with Last-Event-ID 3 and gets exactly its
    own missed Notifies (A: 4, 5; B: 4), then a live one, once. With a buffer of 1, A's 4
    comes by gap fill of the shared link's new epoch."""
    async def body() -> None:
        ns = kafka_config.namespace
        args = ("--heartbeat-ms", "600000")
        proc, port = await start_broker(kafka_config.bootstrap, *args, namespace=ns, logs=False)
        try:
            async with bench_on(port, replay=replay) as b:
                await b.pub.create_topic("g.k9")
                for item in ("A", "B"):
                    await b.pub.publish("g.k9", b"<v n='0' />", "application/xml",
                                        publish_type=PublishType.IMAGE, message_id=item,
                                        implicit=False)
                subs = {r: await _watch(b, r, {}) for r in ("g.k9/A", "g.k9/B")}
                assert len(b.gateway.feeds.sessions) == 1
                readers = {r: await b.stream(sub) for r, sub in subs.items()}
                for n in (1, 2):
                    for r in subs:
                        await _update(b, r, n)
                for reader in readers.values():
                    assert [e.id for e in await take(reader, 3)] == [1, 2, 3]
                    reader.close()
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
                proc, _ = await start_broker(kafka_config.bootstrap, *args, namespace=ns,
                                             logs=False, port=port)
                for r, n in (("g.k9/A", 3), ("g.k9/B", 3), ("g.k9/A", 4)):
                    await _update(b, r, n)  # the publisher reconnects too
                # A's 5 is in the gateway once a stream after 4 has it: with a buffer of
                # one, A's 4 is then the broker's to give again
                probe = await b.stream(subs["g.k9/A"], last=4)
                assert [e.id for e in await take(probe, 1)] == [5]
                probe.close()
                readers = {r: await b.stream(sub, last=3) for r, sub in subs.items()}
                await _update(b, "g.k9/B", 5)
                for r, want in (("g.k9/A", ["3", "4"]), ("g.k9/B", ["3", "5"])):
                    got = await take(readers[r], 2)
                    assert [e.id for e in got] == [4, 5], r
                    assert [e.data["resource"] for e in got] == [r, r]
                    assert [e.data["versions"][-1]["content"] for e in got] == [
                        f"<v n='{n}' />" for n in want]
                    readers[r].close()
                refilled = b.gateway.feeds.feeds[subs["g.k9/A"]["id"]].refilled
                assert refilled == (1 if replay == 1 else 0)
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    run(body())


def test_a_session_gone_for_good_gives_way_to_a_new_one(kafka_config: KafkaConfig) -> None:
    """The broker is killed and stays away longer than the gateway's reconnect policy allows:
    the user's session is gone for good and its watch's stream ends; with the broker back, the
    user's next watch gets a new session (not 503 from the dead one) and its Notifies."""
    async def body() -> None:
        ns = kafka_config.namespace
        proc, port = await start_broker(kafka_config.bootstrap, namespace=ns, logs=False)
        try:
            gateway = Gateway("127.0.0.1", port, reconnect=ReconnectPolicy(
                wait=0.01, wait_max=0.02, max_attempts=2))
            async with gateway, aiohttp.ClientSession() as http:
                pub = await PubsubClient.connect("127.0.0.1", port, "pub@example.com")
                await pub.create_topic("g.gone")
                await pub.close()
                b = Bench(gateway, http, pub)
                first = await _watch(b, "g.gone/A", {})
                reader = await b.stream(first)
                await take(reader, 1)
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
                assert await asyncio.wait_for(reader.next(), TIMEOUT) is None
                assert gateway.feeds.sessions == {}
                proc, _ = await start_broker(kafka_config.bootstrap, namespace=ns,
                                             logs=False, port=port)
                second = await _watch(b, "g.gone/B", {})
                assert second["link"] != first["link"]
                (current,) = await take(await b.stream(second), 1)
                assert current.data["current"] and current.data["subscription"] == second["id"]
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    run(body())
