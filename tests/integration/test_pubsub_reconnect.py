"""A subscriber that reconnects keeps receiving: `apexps broker` is killed with SIGKILL and started
again on the same port; the subscriber's `PubsubClient` (with a reconnect policy) re-dials and
re-attaches by itself, and its `events()` iterator yields what is published after the restart,
without a new subscribe (the subscription lives in Kafka, not in the connection)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from adapters.client.pubsub_client import Delivered, PubsubClient
from adapters.client.reconnect import (
    ConnectionEvent,
    Disconnected,
    Reconnected,
    ReconnectingApexClient,
    ReconnectPolicy,
)
from broker.kafka_io import KafkaConfig

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

APEXPS = [sys.executable, "-m", "adapters.cli.main", "--log-level", "warning"]
TIMEOUT = 60.0


@asynccontextmanager
async def _broker(config: KafkaConfig, port: int = 0) -> AsyncIterator[
        tuple[asyncio.subprocess.Process, int]]:
    proc = await asyncio.create_subprocess_exec(
        *APEXPS, "broker", "--bootstrap", config.bootstrap, "--namespace", config.namespace,
        "--listen", f"127.0.0.1:{port}", stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT)).decode()
        assert line.startswith("apex: "), line
        yield proc, int(line.split()[1].rpartition(":")[2])
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), TIMEOUT)


async def _publish(port: int, topic: str, content: bytes) -> None:
    async with await PubsubClient.connect("127.0.0.1", port, "fred@example.com") as fred:
        await fred.publish(topic, content)


async def _next_delivery(events: AsyncIterator[object]) -> Delivered:
    while True:
        event = await asyncio.wait_for(anext(events), TIMEOUT)
        if isinstance(event, Delivered):
            return event


def test_subscriber_survives_broker_kill_and_restart(kafka_config: KafkaConfig) -> None:
    """SIGKILL the broker, restart it on the same port: the subscriber receives again."""
    async def body() -> None:
        disconnected, reconnected = asyncio.Event(), asyncio.Event()
        async with _broker(kafka_config) as (proc, port):
            async with await PubsubClient.connect("127.0.0.1", port,
                                                  "admin@example.com") as admin:
                await admin.create_topic("quotes.eq")
            barney = await PubsubClient.connect(
                "127.0.0.1", port, "barney@example.com",
                reconnect=ReconnectPolicy(wait=0.05, wait_max=0.5))

            def note(event: ConnectionEvent) -> None:
                if isinstance(event, Disconnected):
                    disconnected.set()
                elif isinstance(event, Reconnected):
                    reconnected.set()

            assert isinstance(barney.client, ReconnectingApexClient)
            barney.client.add_listener(note)
            await barney.subscribe("quotes.eq")
            events = barney.events()
            await _publish(port, "quotes.eq", b"IBM 101")
            assert (await _next_delivery(events)).content == b"IBM 101"
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(disconnected.wait(), TIMEOUT)
        async with _broker(kafka_config, port):
            await asyncio.wait_for(reconnected.wait(), TIMEOUT)
            await _publish(port, "quotes.eq", b"IBM 102")
            got = await _next_delivery(events)
            assert (got.topic, got.content) == ("quotes.eq", b"IBM 102")
            assert await barney.list_topics() == ["quotes.eq"]
            await barney.close()
    asyncio.run(asyncio.wait_for(body(), 4 * TIMEOUT))
