"""Hostile HTTP clients against a gateway on a real broker and Kafka: a reader that never reads
is cut off with a bounded queue while the others go on (and it comes back with Last-Event-ID);
hundreds of idle connections leave the gateway serving; the stream and connection caps refuse
with one log line."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlsplit

import pytest
from structlog.testing import capture_logs

from broker.kafka_io import KafkaConfig
from tests.gateway.live import bench, contents, take

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def run(body: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(body, 300))


async def _raw_get(url: str, *, rcvbuf: int | None = None,
                   request: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to the gateway sending (or not) a GET and then never reading."""
    parts = urlsplit(url)
    sock = socket.socket()
    if rcvbuf is not None:  # before connect: no window autotuning, the kernel holds little
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (parts.hostname, parts.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    if request:
        writer.write(f"GET {parts.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
    return reader, writer


def test_a_reader_that_never_reads_is_cut_off_and_the_others_go_on(
        kafka_config: KafkaConfig) -> None:
    """One SSE client never reads while 9.6 MB of deliveries go by: its queue stays within
    its bound, its stream is closed with one log line, the reader beside it gets everything,
    and the slow one, coming back with Last-Event-ID, gets the rest once."""
    async def body() -> None:
        async with bench(kafka_config, stream_queue=8, replay=1024) as b:
            await b.pub.create_topic("g.slow")
            sub = await b.subscribe("g.slow")
            feed = b.gateway.feeds.feeds[sub["id"]]
            good = await b.stream(sub)
            _, slow_writer = await _raw_get(sub["events"], rcvbuf=4096)
            while len(feed.streams) < 2:
                await asyncio.sleep(0.01)
            big = "x" * 64_000
            with capture_logs() as logs:
                got = []
                for k in range(150):  # the good reader keeps up: one in its queue at a time
                    await b.pub.publish("g.slow", f"{k}:{big}".encode())
                    got += await take(good, 1)
            assert [e.id for e in got] == list(range(1, 151))
            cut = [e for e in logs if e["event"] == "gateway stream closed: slow reader"]
            assert len(cut) == 1 and cut[0]["subscription"] == sub["id"]
            assert len(feed.streams) == 1  # only the good one is left
            # and the cut one's handler is gone with its connection, though its client never
            # read: nothing waits on it (the gateway aborted the transport)
            async def settled() -> None:
                while b.gateway.open_streams > 1:
                    await asyncio.sleep(0.01)
            await asyncio.wait_for(settled(), 30)
            slow_writer.close()
            # the slow client comes back, as a browser would, from the last id it read: none
            last = 0
            back = await b.stream(sub, last=last)
            again = await take(back, 150 - last)
            assert [e.id for e in again] == list(range(last + 1, 151))
            assert [c.split(":")[0] for c in contents(again)] == \
                [str(k) for k in range(last, 150)]
            back.close()
            good.close()
    run(body())


def test_300_idle_connections_leave_the_gateway_serving(kafka_config: KafkaConfig) -> None:
    """300 connections that send nothing, and 300 that sent a request line and stalled: the
    gateway still answers /topics, subscribes and streams."""
    async def body() -> None:
        async with bench(kafka_config) as b:
            await b.pub.create_topic("g.idle")
            idle = [await _raw_get(b.url + "/topics", request=False) for _ in range(300)]
            for _, w in idle[:150]:
                w.write(b"GET /topics HTTP/1.1\r\nHost: x\r\n")  # no end of headers
            async with b.http.get(f"{b.url}/topics") as r:
                assert r.status == 200 and "g.idle" in (await r.json())["topics"]
            sub = await b.subscribe("g.idle")
            reader = await b.stream(sub)
            await b.publish("g.idle", 0, 3)
            assert contents(await take(reader, 3)) == ["m0", "m1", "m2"]
            reader.close()
            for _, w in idle:
                w.close()
    run(body())


def test_connection_and_stream_caps_refuse_with_one_log_line(kafka_config: KafkaConfig) -> None:
    """Beyond max_connections a connection is closed at once; beyond max_streams an event
    stream is 503; each refusal is one log line; closing frees the place."""
    async def body() -> None:
        async with bench(kafka_config, max_connections=20, max_streams=2) as b:
            await b.pub.create_topic("g.cap")
            sub = await b.subscribe("g.cap")
            one, two = await b.stream(sub), await b.stream(sub)
            with capture_logs() as logs:
                async with b.http.get(sub["events"]) as r:
                    assert r.status == 503
                idle = [await _raw_get(b.url, request=False) for _ in range(30)]
                # 20 at most are served (the test's own client holds some): the last 10 are
                # closed at once
                for reader, _ in idle[-10:]:
                    assert await asyncio.wait_for(reader.read(), 60) == b""
            events = [e["event"] for e in logs]
            assert events.count("gateway refused") == 1
            assert events.count("gateway refused a connection: too many open") >= 10
            for _, w in idle:
                w.close()
            one.close()
            while len(b.gateway.feeds.feeds[sub["id"]].streams) > 1:
                await asyncio.sleep(0.01)
            three = await b.stream(sub)
            await b.publish("g.cap", 0, 1)
            assert [e.id for e in await take(three, 1)] == [1]
            for s in (two, three):
                s.close()
    run(body())
