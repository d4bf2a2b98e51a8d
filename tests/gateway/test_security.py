"""The gateway as APEX's access control sees it, on a real broker and Kafka: HTTPS to the
browser, TLS to the broker, and each subscription's session authenticated (SASL SCRAM) as its
HTTP user against a broker that requires authentication."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Coroutine
from typing import Any

import aiohttp
import pytest
import trustme

from adapters.beep import Users
from adapters.gateway import Auth
from broker.kafka_io import KafkaConfig
from tests.gateway.live import bench, take
from tests.gateway.sse import SseReader

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def run(body: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(body, 240))


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode())
            .decode()}


def test_https_tls_and_sasl_as_the_http_user(kafka_config: KafkaConfig) -> None:
    """The broker requires TLS and SASL; the gateway serves HTTPS, speaks TLS to the broker,
    and authenticates each subscription's session as the Basic user: fred's subscription
    streams; a user the broker does not know is refused before the broker is asked (401)."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    users = Users()
    users.add("fred", "fred-pw", iterations=4096)
    users.add("pub", "pub-pw", iterations=4096)

    async def body() -> None:
        async with bench(
                kafka_config, security={"tls": server, "require_tls": True, "sasl": users,
                                        "require_auth": True},
                auth=Auth(users=users),
                gateway={"tls": server, "broker_tls": client, "broker_sasl": True},
                pub={"tls": client, "sasl": ("pub", "pub-pw"), "mechanism": "SCRAM-SHA-256"},
                http={"connector": aiohttp.TCPConnector(ssl=client)}) as b:
            assert b.url.startswith("https://")
            await b.pub.create_topic("g.tls")
            url = f"{b.url}/subscriptions"
            async with b.http.post(url, json={"topic": "g.tls"},
                                   headers=_basic("wilma", "x")) as r:
                assert r.status == 401
            async with b.http.post(url, json={"topic": "g.tls"},
                                   headers=_basic("fred", "fred-pw")) as r:
                sub = await r.json()
                assert r.status == 201, sub
            feed = b.gateway.feeds.feeds[sub["id"]]
            assert str(feed.client.endpoint).startswith("fred/gw-")
            r = await b.http.get(sub["events"], headers=_basic("fred", "fred-pw"))
            assert r.status == 200
            reader = SseReader(r)
            await b.publish("g.tls", 0, 2)
            assert [e.data["content"] for e in await take(reader, 2)] == ["m0", "m1"]
            reader.close()
    run(body())
