"""The gateway's test bench: a real broker (in process, or a separate `apexps broker` a test
may kill), a `Gateway` on loopback in front of it, aiohttp's client, and an APEX publisher."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from adapters.app import BrokerApp
from adapters.client.pubsub_client import PubsubClient
from adapters.client.reconnect import ReconnectPolicy
from adapters.gateway import Auth, Gateway, GatewayLimits
from broker.kafka_io import KafkaConfig
from broker.robust.config import RobustConfig
from tests.gateway.sse import Event, SseReader

#: no heartbeats: link seqs are then exactly the messages, 1, 2, 3 …
QUIET = RobustConfig(heartbeat_ms=600_000)
FAST = ReconnectPolicy(wait=0.05, wait_max=0.5, max_attempts=None)
TIMEOUT = 60.0
PUB = "pub@example.com"


@dataclass
class Bench:
    gateway: Gateway
    http: aiohttp.ClientSession
    pub: PubsubClient

    @property
    def url(self) -> str:
        return self.gateway.url

    async def subscribe(self, topic: str, **fields: Any) -> dict[str, Any]:
        async with self.http.post(f"{self.url}/subscriptions",
                                  json={"topic": topic, **fields}) as r:
            body = await r.json()
            assert r.status == 201, body
            return dict(body)

    async def stream(self, sub: dict[str, Any], last: int | None = None) -> SseReader:
        headers = {} if last is None else {"Last-Event-ID": str(last)}
        r = await self.http.get(sub["events"], headers=headers,
                                timeout=aiohttp.ClientTimeout(total=None))
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        return SseReader(r)

    async def publish(self, topic: str, lo: int, hi: int) -> None:
        for k in range(lo, hi):
            await self.pub.publish(topic, f"m{k}".encode())


async def take(reader: SseReader, count: int) -> list[Event]:
    out = []
    for _ in range(count):
        event = await asyncio.wait_for(reader.next(), TIMEOUT)
        assert event is not None, f"the stream ended after {len(out)} of {count}"
        out.append(event)
    return out


def contents(events: list[Event]) -> list[str]:
    return [e.data["content"] for e in events]


@contextlib.asynccontextmanager
async def bench_on(port: int, *, auth: Auth | None = None, gateway: dict[str, Any] | None = None,
                   pub: dict[str, Any] | None = None, http: dict[str, Any] | None = None,
                   **limits: Any) -> AsyncIterator[Bench]:
    """`gateway`: more `Gateway` arguments; `pub`: `PubsubClient.connect`'s security ones;
    `http`: `aiohttp.ClientSession`'s."""
    gw = Gateway("127.0.0.1", port, auth=auth, limits=GatewayLimits(**limits),
                 reconnect=FAST, **(gateway or {}))
    async with gw, aiohttp.ClientSession(**(http or {})) as session:
        publisher = await PubsubClient.connect("127.0.0.1", port, PUB, reconnect=FAST,
                                               **(pub or {}))
        try:
            yield Bench(gw, session, publisher)
        finally:
            with contextlib.suppress(Exception):
                await publisher.close()


@contextlib.asynccontextmanager
async def bench(config: KafkaConfig, *, access_file: str | None = None,
                security: dict[str, Any] | None = None, **rest: Any) -> AsyncIterator[Bench]:
    """A broker (with `security`: BrokerApp's TLS and SASL settings) and `bench_on` it."""
    async with BrokerApp(config, robust=QUIET, access_file=access_file,
                         security=security) as app, bench_on(app.port, **rest) as b:
        yield b
