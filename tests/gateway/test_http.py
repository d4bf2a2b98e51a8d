"""The gateway's HTTP API on a real broker and Kafka over real HTTP: status codes and JSON
errors (400, 401, 403, 404, 413, 431), DELETE, the WebSocket, /topics and the console
page; each refusal is one log line and changes nothing."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from adapters.beep import Users
from adapters.gateway import Auth
from broker.kafka_io import KafkaConfig
from tests.gateway.live import bench, take

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ACCESS = """<access domain='example.com'>
  <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
  <deny id='no-secret' originator='web/*@example.com' tokens='pubsub:subscribe'
        topic='g.secret' />
</access>
"""


def run(body: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(body, 240))


async def _refused(r: aiohttp.ClientResponse, status: int, field: str | None = None) -> str:
    assert r.status == status, r.headers  # first: a stream that was not refused never ends
    body = await r.json()
    assert body.get("field") == field, body
    return str(body["error"])


def test_refusals_are_json_with_the_status_and_field(kafka_config: KafkaConfig,
                                                       tmp_path: Path) -> None:
    """Bad JSON and bad fields 400 naming the field; an unknown topic 404 (553 on subscribe);
    a denied subscribe 403 (537); a selector the broker cannot compile 400 (567) naming it;
    unknown routes and subscriptions 404; a watch of events not understood 400 (571). None of them
    leaves a subscription behind."""
    access = tmp_path / "access.xml"
    access.write_text(ACCESS)

    async def body() -> None:
        async with bench(kafka_config, access_file=str(access)) as b:
            await b.pub.create_topic("g.secret")
            await b.pub.create_topic("g.open")
            url = f"{b.url}/subscriptions"
            with capture_logs() as logs:
                async with b.http.post(url, data=b"{nope") as r:
                    assert "not JSON" in await _refused(r, 400)
                async with b.http.post(url, json={"topic": "g.open", "duration": "x"}) as r:
                    await _refused(r, 400, "duration")
                async with b.http.post(url, json={"topic": "g.none"}) as r:
                    assert (await _refused(r, 404, "topic")).startswith("553 ")
                async with b.http.post(url, json={"topic": "g.secret"}) as r:
                    assert (await _refused(r, 403)).startswith("537 ")
                async with b.http.post(url, json={"topic": "g.open",
                                                  "selector": "symbol IN ('X'"}) as r:
                    assert (await _refused(r, 400, "selector")).startswith("567 ")
                async with b.http.post(url, json={"resource": "g.open/m1", "events": [4]}) as r:
                    assert (await _refused(r, 400, "events")).startswith("571 ")
                async with b.http.get(f"{b.url}/nowhere") as r:
                    await _refused(r, 404)
                async with b.http.get(f"{url}/0123/events") as r:
                    await _refused(r, 404, "id")
                async with b.http.delete(f"{url}/0123") as r:
                    await _refused(r, 404, "id")
            refusals = [e for e in logs if e["event"] == "gateway refused"]
            assert [e["status"] for e in refusals] == [400, 400, 404, 403, 400, 400, 404, 404, 404]
            assert b.gateway.feeds.feeds == {}
            assert "exc_info" not in str(logs)
    run(body())


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _quote(symbol: str, pct: float) -> bytes:
    return (f"<ps:message-content xmlns:ps='http://www.example.com/pubsub'><ps:content>"
            f"<equity-quote symbol='{symbol}'><net-change-pct>{pct}</net-change-pct>"
            "</equity-quote></ps:content></ps:message-content>").encode()


def test_a_selector_subscription_streams_only_what_it_matches(kafka_config: KafkaConfig) -> None:
    """A JMS selector through the gateway: the broker matches, the stream carries only the
    matching quotes, with their own link seqs 1, 2, 3; the answer carries the broker's
    subscription id, and DELETE cancels by it."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.sel")
            sub = await b.subscribe("g.sel", selector="symbol = 'XMPL' AND net-change-pct > 1",
                                    **{"class": "jms"})
            assert sub["subscription_id"] and sub["selector"].startswith("symbol")
            reader = await b.stream(sub)
            for symbol, pct in (("XMPL", 2.0), ("IBM", 9.0), ("XMPL", 0.5), ("XMPL", 3.0),
                                ("TEST", 4.0), ("XMPL", 7.0)):
                await b.pub.publish("g.sel", _quote(symbol, pct), "application/xml")
            got = await take(reader, 3)
            assert [e.id for e in got] == [1, 2, 3]
            assert ["net-change-pct>" + str(p) in e.data["content"]
                    for e, p in zip(got, (2.0, 3.0, 7.0), strict=True)] == [True] * 3
            async with b.http.delete(f"{b.url}/subscriptions/{sub['id']}") as r:
                assert r.status == 204
            assert await asyncio.wait_for(reader.next(), 60) is None
    run(body())


def test_oversized_body_is_413_and_oversized_headers_431(kafka_config: KafkaConfig) -> None:
    """A body over max_body is 413; a header field over max_header, or too many header lines,
    is 431; the gateway serves the next request as before."""
    async def body() -> None:
        async with bench(kafka_config, max_body=1024, max_header=512, max_headers=20) as b:
            await b.pub.create_topic("g.big")
            url = f"{b.url}/subscriptions"
            async with b.http.post(url, data=b'{"topic": "' + b"x" * 2000 + b'"}') as r:
                assert r.status == 413
            aiohttp_log = _Records()
            logging.getLogger("aiohttp").addHandler(aiohttp_log)
            with capture_logs() as logs:
                async with b.http.get(f"{b.url}/topics", headers={"X-Big": "y" * 600}) as r:
                    assert r.status == 431
                many = {f"X-H{k}": "1" for k in range(30)}
                async with b.http.get(f"{b.url}/topics", headers=many) as r:
                    assert r.status == 431
            logging.getLogger("aiohttp").removeHandler(aiohttp_log)
            # one line each, ours; no parser traceback from aiohttp
            refusals = [e for e in logs if e["event"].startswith("gateway refused")]
            assert [e["status"] for e in refusals] == [431, 431]
            assert [r for r in aiohttp_log.records if r.exc_info] == []
            async with b.http.get(f"{b.url}/topics") as r:
                assert r.status == 200 and "g.big" in (await r.json())["topics"]
    run(body())


def test_delete_cancels_the_subscription_and_ends_its_streams(kafka_config: KafkaConfig) -> None:
    """DELETE answers 204, ends the open stream, and the broker stops sending: a second
    DELETE and a new stream are 404."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.del")
            sub = await b.subscribe("g.del")
            reader = await b.stream(sub)
            await b.publish("g.del", 0, 2)
            await take(reader, 2)
            feed = b.gateway.feeds.feeds[sub["id"]]
            async with b.http.delete(f"{b.url}/subscriptions/{sub['id']}") as r:
                assert r.status == 204
            assert await asyncio.wait_for(reader.next(), 60) is None
            assert feed.client.link_listener(feed.link) is None  # the link is let go
            async with b.http.delete(f"{b.url}/subscriptions/{sub['id']}") as r:
                assert r.status == 404
            async with b.http.get(sub["events"]) as r:
                assert r.status == 404
            # the broker holds no subscription for it any more: a control subscriber's
            # subscribe/cancel of the same topic still works, and publishing succeeds
            await b.publish("g.del", 2, 3)
    run(body())


def test_the_broker_ending_the_subscription_ends_its_streams(kafka_config: KafkaConfig) -> None:
    """The topic is deleted: the broker cancels the subscription (draft §4.3), the stream
    gets `event: end` and closes, and the id is gone (404)."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.end")
            sub = await b.subscribe("g.end")
            reader = await b.stream(sub)
            await b.publish("g.end", 0, 1)
            await take(reader, 1)
            await b.pub.delete_topic("g.end")
            end = await asyncio.wait_for(reader.next(), 60)
            assert end is not None and end.event == "end" and end.id is None
            assert await asyncio.wait_for(reader.next(), 60) is None
            assert sub["id"] not in b.gateway.feeds.feeds
            async with b.http.get(sub["events"]) as r:
                assert r.status == 404
    run(body())


def test_websocket_subscribes_delivers_and_cancels(kafka_config: KafkaConfig) -> None:
    """On /ws: subscribe answers `subscribed` with the id, deliveries follow as JSON with
    their link seq, a bad operation is an error naming the field and changes nothing, cancel
    answers `cancelled`."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.ws")
            async with b.http.ws_connect(f"{b.url}/ws") as ws:
                await ws.send_json({"op": "subscribe", "topic": "g.ws"})
                answer = await ws.receive_json(timeout=60)
                ident = answer["subscribed"]["id"]
                await b.publish("g.ws", 0, 3)
                got = [await ws.receive_json(timeout=60) for _ in range(3)]
                assert [m["seq"] for m in got] == [1, 2, 3]
                assert [m["delivery"]["content"] for m in got] == ["m0", "m1", "m2"]
                await ws.send_str('{"op": "subscribe", "topic": "g.ws", "duration": -1}')
                error = await ws.receive_json(timeout=60)
                assert (error["status"], error["field"]) == (400, "duration")
                assert list(b.gateway.feeds.feeds) == [ident]
                await ws.send_json({"op": "cancel", "id": ident})
                assert await ws.receive_json(timeout=60) == {"cancelled": ident}
                assert b.gateway.feeds.feeds == {}
    run(body())


def test_topics_and_the_console_page(kafka_config: KafkaConfig) -> None:
    """GET /topics lists the broker's topics; GET / is the console's HTML."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.t1")
            async def topics() -> list[str]:
                async with b.http.get(f"{b.url}/topics") as r:
                    assert r.status == 200
                    return list((await r.json())["topics"])
            for listed in await asyncio.gather(*(topics() for _ in range(3))):
                assert "g.t1" in listed  # three at once, as one user
            async with b.http.get(f"{b.url}/") as r:
                assert r.status == 200 and r.content_type == "text/html"
                page = await r.text()
                assert "EventSource" in page and "http" not in page.replace(
                    "http-equiv", "")  # no CDN, nothing fetched from elsewhere
    run(body())


def test_users_file_and_bearer_tokens(kafka_config: KafkaConfig) -> None:
    """With a users file, no credentials is 401 with a Basic challenge, a wrong password 401,
    the right one 201 and the feed attaches as that user's subaddress; a bearer token (header
    or ?access_token= for EventSource) maps to its user; another user's id is 404."""
    users = Users()
    users.add("fred", "s3cret", iterations=4096)
    auth = Auth(users=users, tokens={"tok-jade": "jade"})

    def basic(user: str, password: str) -> dict[str, str]:
        raw = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {raw}"}

    async def body() -> None:
        async with bench(kafka_config, auth=auth) as b:
            await b.pub.create_topic("g.auth")
            url = f"{b.url}/subscriptions"
            async with b.http.post(url, json={"topic": "g.auth"}) as r:
                await _refused(r, 401)
                assert r.headers["WWW-Authenticate"].startswith("Basic")
            async with b.http.post(url, json={"topic": "g.auth"},
                                   headers=basic("fred", "nope")) as r:
                await _refused(r, 401)
            async with b.http.post(url, json={"topic": "g.auth"},
                                   headers={"Authorization": "Bearer nope"}) as r:
                await _refused(r, 401)
            async with b.http.post(url, json={"topic": "g.auth"},
                                   headers=basic("fred", "s3cret")) as r:
                fred = await r.json()
                assert r.status == 201
            async with b.http.post(url, json={"topic": "g.auth"},
                                   headers={"Authorization": "Bearer tok-jade"}) as r:
                jade = await r.json()
                assert r.status == 201
            feeds = b.gateway.feeds.feeds
            assert str(feeds[fred["id"]].client.endpoint).startswith("fred/gw-")
            assert str(feeds[jade["id"]].client.endpoint).startswith("jade/gw-")
            async with b.http.get(jade["events"], headers=basic("fred", "s3cret")) as r:
                await _refused(r, 404, "id")
            async with b.http.get(jade["events"], params={"access_token": "tok-jade"},
                                  timeout=aiohttp.ClientTimeout(total=None)) as r:
                assert r.status == 200
    run(body())
