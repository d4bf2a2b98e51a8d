"""Server-Sent Events through the gateway, on a real broker and Kafka over real HTTP: each
event's id is its link seq, and a stream that reconnects with Last-Event-ID gets every
delivery it missed once -- from the gateway's buffer, from the broker by gap fill when the
buffer no longer holds them, and across a kill -9 of the broker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Coroutine
from typing import Any

import pytest

from broker.kafka_io import KafkaConfig
from tests.gateway.live import bench, bench_on, contents, take
from tests.integration.broker_process import start_broker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def run(body: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(body, 240))


def _m(lo: int, hi: int) -> list[str]:
    return [f"m{k}" for k in range(lo, hi)]


@pytest.mark.parametrize("replay", [1024, 4], ids=["from-buffer", "by-gap-fill"])
def test_reconnect_with_last_event_id_misses_nothing_and_repeats_nothing(
        kafka_config: KafkaConfig, replay: int) -> None:
    """A stream reads 10 deliveries (ids 1..10), goes away while 20 more are published, and
    comes back with Last-Event-ID 10: it gets ids 11..30 once, in order, then live ones. With
    a buffer of 4, ids 11..26 can only come from the broker (gap fill)."""
    async def body() -> None:
        async with bench(kafka_config, replay=replay) as b:
            await b.pub.create_topic("g.sse")
            sub = await b.subscribe("g.sse")
            assert sub["events"] == f"{b.url}/subscriptions/{sub['id']}/events"
            first = await b.stream(sub)
            await b.publish("g.sse", 0, 10)
            got = await take(first, 10)
            assert [e.id for e in got] == list(range(1, 11))
            assert [e.data["seq"] for e in got] == list(range(1, 11))
            first.close()
            await b.publish("g.sse", 10, 30)
            feed = b.gateway.feeds.feeds[sub["id"]]
            while feed.buffer.last < 30:  # the feed has them all (or they come live: also fine)
                await asyncio.sleep(0.01)
            assert feed.buffer.evicted == (26 if replay == 4 else 0)
            second = await b.stream(sub, last=10)
            again = await take(second, 20)
            await b.publish("g.sse", 30, 31)
            again += await take(second, 1)
            assert [e.id for e in again] == list(range(11, 32))
            assert contents(got + again) == _m(0, 31)
            assert feed.refilled == (16 if replay == 4 else 0)
            second.close()
    run(body())


def test_reconnect_from_the_middle_of_the_buffer_and_twice(kafka_config: KafkaConfig) -> None:
    """Last-Event-ID 3 after 8 deliveries gets 4..8; a third stream from 8 gets only what
    is new; a stream without Last-Event-ID gets only what comes after it opened."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.mid")
            sub = await b.subscribe("g.mid")
            one = await b.stream(sub)
            await b.publish("g.mid", 0, 8)
            await take(one, 8)
            two = await b.stream(sub, last=3)
            assert contents(await take(two, 5)) == _m(3, 8)
            fresh = await b.stream(sub)
            three = await b.stream(sub, last=8)
            await b.publish("g.mid", 8, 9)
            for reader in (one, two, three, fresh):
                assert [e.id for e in await take(reader, 1)] == [9]
                reader.close()
    run(body())


def test_broker_kill_9_between_reconnects_changes_nothing(kafka_config: KafkaConfig) -> None:
    """The stream goes away after 5; the broker is killed with SIGKILL and started again on
    its port; 5 more are published; the stream comes back with Last-Event-ID 5 and gets 6..10
    once (the feed's robust client reconnected and refilled by itself)."""
    async def body() -> None:
        ns = kafka_config.namespace
        args = ("--heartbeat-ms", "600000")
        proc, port = await start_broker(kafka_config.bootstrap, *args, namespace=ns, logs=False)
        try:
            async with bench_on(port) as b:
                await b.pub.create_topic("g.kill")
                sub = await b.subscribe("g.kill")
                reader = await b.stream(sub)
                await b.publish("g.kill", 0, 5)
                got = await take(reader, 5)
                reader.close()
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
                proc, _ = await start_broker(kafka_config.bootstrap, *args, namespace=ns,
                                             logs=False, port=port)
                await b.publish("g.kill", 5, 10)  # the publisher reconnects too
                reader = await b.stream(sub, last=5)
                got += await take(reader, 5)
                assert [e.id for e in got] == list(range(1, 11))
                assert contents(got) == _m(0, 10)
                reader.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    run(body())


def test_heartbeat_comments_keep_a_quiet_stream_alive(kafka_config: KafkaConfig) -> None:
    """With nothing to send, the stream carries comment lines (heartbeat) and stays open."""
    async def body() -> None:
        async with bench(kafka_config, heartbeat=0.05) as b:
            await b.pub.create_topic("g.hb")
            sub = await b.subscribe("g.hb")
            reader = await b.stream(sub)
            next_event = asyncio.ensure_future(reader.next())
            while reader.comments < 3:
                await asyncio.sleep(0.02)
            await b.publish("g.hb", 0, 1)
            event = await asyncio.wait_for(next_event, 60)
            assert event is not None and event.id == 1
            reader.close()
    run(body())
