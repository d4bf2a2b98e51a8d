"""Resource watches through the gateway (the event draft's SubscribeGateway, figure 6) on a real
broker and Kafka over real HTTP: `POST /subscriptions` with a resource, events and Expires makes
a watch (the answer says the granted Expires); the SSE stream carries its Notifies as `notify`
events whose id is the link seq; a reconnect with Last-Event-ID gets what it missed and nothing
twice; the watch's end (expiry) is its last Notify, then the stream's end."""

from __future__ import annotations

import asyncio

import pytest

from broker.kafka_io import KafkaConfig
from broker.records import PublishType
from tests.gateway.live import TIMEOUT, bench, take
from tests.gateway.test_http import run

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_resource_watch_streams_its_notifies(kafka_config: KafkaConfig) -> None:
    """Figure 6's F01-F08 over HTTP: the subscribe, the grant, the current-state Notify, a
    Notify per event, Last-Event-ID, and the terminated Notify on expiry."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.res")
            await b.pub.publish("g.res", b"<v n='1' />", "application/xml",
                                publish_type=PublishType.IMAGE, message_id="IBM",
                                implicit=False)
            async with b.http.post(f"{b.url}/subscriptions", json={
                    "resource": "g.res/IBM", "events": ["modified", "deleted"],
                    "expires": 100_000}) as r:
                sub = await r.json()
                assert r.status == 201, sub
            assert (sub["resource"], sub["expires"], sub["watch_events"]) == (
                "g.res/IBM", 86_400, [2, 3])  # shortened to the broker's maximum
            reader = await b.stream(sub)
            (first,) = await take(reader, 1)
            assert first.event == "notify" and first.data["current"]
            assert [v["content"] for v in first.data["versions"]] == ["<v n='1' />"]
            for n in (2, 3):
                await b.pub.publish("g.res", f"<v n='{n}' />".encode(), "application/xml",
                                    publish_type=PublishType.UPDATE, message_id="IBM")
            got = await take(reader, 2)
            assert [e.id for e in got] == [first.id + 1, first.id + 2]  # link seqs
            assert [e.data["events"] for e in got] == [[2], [2]]
            reader.close()
            # back after the first: the two it missed, once each
            again = await b.stream(sub, last=first.id)
            missed = await take(again, 2)
            assert [e.id for e in missed] == [e.id for e in got]
            assert [e.data["versions"][0]["content"] for e in missed] == [
                "<v n='2' />", "<v n='3' />"]
            again.close()

            # a short watch: its expiry ends the stream with a terminated Notify, then `end`
            async with b.http.post(f"{b.url}/subscriptions", json={
                    "resource": "g.res/IBM", "events": ["created"], "expires": 1}) as r:
                short = await r.json()
                assert r.status == 201, short
            ending = await b.stream(short)
            current, last = await take(ending, 2)
            assert current.data["current"] and last.event == "notify"
            assert (last.data["state"], last.data["reason"]) == ("terminated", "timeout")
            end = await asyncio.wait_for(ending.next(), TIMEOUT)
            assert end is not None and end.event == "end" and end.data["reason"] == "timeout"
            assert await asyncio.wait_for(ending.next(), TIMEOUT) is None
            assert short["id"] not in b.gateway.feeds.feeds

            # DELETE cancels the watch on the broker
            async with b.http.delete(f"{b.url}/subscriptions/{sub['id']}") as r:
                assert r.status == 204
            assert list(b.gateway.feeds.feeds) == []
    run(body())


def test_a_resource_watch_over_the_websocket(kafka_config: KafkaConfig) -> None:
    """The WebSocket's subscribe takes a resource too: its Notifies come as `notify`
    messages with their link seqs, and cancel ends the watch."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.wsr")
            async with b.http.ws_connect(f"{b.url}/ws") as ws:
                await ws.send_json({"op": "subscribe", "resource": "g.wsr/A",
                                    "events": ["created"], "expires": 600})
                answer = await ws.receive_json(timeout=TIMEOUT)
                ident = answer["subscribed"]["id"]
                assert answer["subscribed"]["expires"] == 600
                current = await ws.receive_json(timeout=TIMEOUT)
                assert current["notify"]["current"] and current["notify"]["versions"] == []
                await b.pub.publish("g.wsr", b"<a />", "application/xml",
                                    publish_type=PublishType.IMAGE, message_id="A",
                                    implicit=False)
                created = await ws.receive_json(timeout=TIMEOUT)
                assert created["notify"]["events"] == [1]
                assert created["seq"] == current["seq"] + 1
                await ws.send_json({"op": "cancel", "id": ident})
                assert await ws.receive_json(timeout=TIMEOUT) == {"cancelled": ident}
    run(body())


def test_a_watch_stream_opened_late_starts_with_the_current_state(
        kafka_config: KafkaConfig) -> None:
    """The current-state Notify comes right after the grant, usually before the client's GET
    (a browser's certainly): a watch's first stream, with no Last-Event-ID, still begins with
    it, from the feed's buffer, where a topic stream starts live."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.late")
            async with b.http.post(f"{b.url}/subscriptions", json={
                    "resource": "g.late/X", "events": ["created"], "expires": 600}) as r:
                sub = await r.json()
                assert r.status == 201, sub
            feed = b.gateway.feeds.feeds[sub["id"]]
            async with asyncio.timeout(TIMEOUT):
                while feed.buffer.last == 0:  # the gateway holds the Notify: no event to await
                    await asyncio.sleep(0.01)
            reader = await b.stream(sub)
            (current,) = await take(reader, 1)
            assert current.event == "notify" and current.data["current"]
            assert current.id == feed.buffer.last
            await b.pub.publish("g.late", b"<x />", "application/xml",
                                publish_type=PublishType.IMAGE, message_id="X", implicit=False)
            (created,) = await take(reader, 1)
            assert created.data["events"] == [1] and created.id == current.id + 1
            reader.close()
    run(body())
