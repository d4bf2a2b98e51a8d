"""`apexps broker --gateway PORT` (the code path of `apexps up --gateway`) and `apexps gateway
--listen --broker` as processes on the shared Kafka: each prints its URL, serves /topics and a
subscription stream, and stops cleanly on SIGINT."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from collections.abc import Coroutine
from typing import Any

import aiohttp
import pytest

from adapters.client.pubsub_client import PubsubClient
from broker.kafka_io import KafkaConfig
from tests.gateway.sse import SseReader

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

APEXPS = [sys.executable, "-m", "adapters.cli.main", "--log-level", "warning"]


def run(body: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(body, 240))


async def _start(*args: str, lines: int) -> tuple[asyncio.subprocess.Process, list[str]]:
    proc = await asyncio.create_subprocess_exec(*APEXPS, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    out = [(await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
           for _ in range(lines)]
    return proc, out


async def _stop(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err


async def _serves(url: str, apex_port: int, topic: str) -> None:
    pub = await PubsubClient.connect("127.0.0.1", apex_port, "pub@example.com")
    await pub.create_topic(topic)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/topics") as r:
            assert r.status == 200 and topic in (await r.json())["topics"]
        async with http.post(f"{url}/subscriptions", json={"topic": topic}) as r:
            sub = await r.json()
            assert r.status == 201, sub
        r = await http.get(sub["events"])
        reader = SseReader(r)
        await pub.publish(topic, b"hello")
        event = await asyncio.wait_for(reader.next(), 60)
        assert event is not None and (event.id, event.data["content"]) == (1, "hello")
        reader.close()
    await pub.close()


def test_broker_with_gateway_then_a_gateway_of_its_own(kafka_config: KafkaConfig) -> None:
    async def body() -> None:
        broker, out = await _start(
            "broker", "--bootstrap", kafka_config.bootstrap, "--namespace",
            f"t{uuid.uuid4().hex[:12]}", "--listen", "127.0.0.1:0", "--gateway", "0",
            "--heartbeat-ms", "600000", lines=2)
        try:
            assert out[0].startswith("apex: 127.0.0.1:") and out[1].startswith("gateway: http")
            apex_port = int(out[0].split()[1].rpartition(":")[2])
            await _serves(out[1].split()[1].rstrip("/"), apex_port, "c.one")
            gw, lines = await _start("gateway", "--listen", "127.0.0.1:0", "--broker",
                                     f"127.0.0.1:{apex_port}", lines=1)
            assert lines[0].startswith("gateway: http://127.0.0.1:")
            await _serves(lines[0].split()[1].rstrip("/"), apex_port, "c.two")
            await _stop(gw)
        finally:
            await _stop(broker)
    run(body())
