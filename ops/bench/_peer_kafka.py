"""bench_peers's raw-Kafka system: the yardstick under apexps, what Kafka alone costs here.

The publisher is the broker's own producer (`kafka_producer.KafkaProducer`: idempotent, acks=all,
linger 0, lz4, its delivery reports on a poll thread), each publication awaited on the event
loop as the other systems' are; it is warmed first by one record to another topic, since a new
idempotent producer waits 0.5-1 s for its producer id, which would otherwise land on W2's
first second. Each subscriber is a `kafka_io.Tail` with its defaults (Kafka answers a fetch at
the first record, or after 100 ms: the settings the broker's journal follower had until it
went off the critical path), polled in a thread that hands each batch to the event loop, where
the harness stamps the receipt. Kafka has no filter of its own: in W3 ten such consumers read
the one topic and each keeps the messages of its symbol.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from broker.kafka_io import KafkaConfig, Tail
from broker.kafka_producer import KafkaProducer

__all__ = ["RawKafka"]


class RawKafka:
    """One process's side of the raw-Kafka system: a publisher, or subscribers."""

    def __init__(self, config: KafkaConfig, topic: str, publisher: bool) -> None:
        self.config, self.topic = config, config.topic(topic)
        self.loop = asyncio.get_running_loop()
        self.producer = KafkaProducer(config) if publisher else None
        self.stop = threading.Event()
        self.readers: list[tuple[threading.Thread, Any]] = []

    @classmethod
    async def connect(cls, address: str, topic: str, publisher: bool) -> RawKafka:
        """`address`: `BOOTSTRAP/NAMESPACE`; `topic`: one partition, in that namespace."""
        bootstrap, _, namespace = address.rpartition("/")
        self = cls(KafkaConfig(bootstrap=bootstrap, namespace=namespace), topic, publisher)
        if self.producer is not None:  # its producer id, and the topic's metadata, before W2
            await asyncio.to_thread(self.producer.produce_sync, self.config.topic("warm"),
                                    None, b"warm", partition=0)
        return self

    async def publish(self, sym: int, body: bytes) -> None:
        assert self.producer is not None
        done: asyncio.Future[None] = self.loop.create_future()

        def delivered(err: Exception | None, _pos: object) -> None:
            self.loop.call_soon_threadsafe(_settle, done, err)

        self.producer.produce(self.topic, None, body, delivered, partition=0)
        await done

    async def subscribe(self, sym: int, on_message: Callable[[bytes], None]) -> None:
        tail = await asyncio.to_thread(Tail, self.config, self.topic)
        await asyncio.to_thread(tail.poll, 1, 0.5)  # connected, and its first fetch sent
        mine = f"<q symbol='S{sym}'".encode()

        def hand(bodies: list[bytes]) -> None:
            for body in bodies:
                on_message(body)

        def read() -> None:
            while not self.stop.is_set():
                bodies = [r.value for r in tail.poll(1000, 0.1)
                          if r.value is not None and r.value.startswith(mine)]
                if bodies:
                    self.loop.call_soon_threadsafe(hand, bodies)

        thread = threading.Thread(target=read, name=f"kafka-sub-{sym}", daemon=True)
        thread.start()
        self.readers.append((thread, tail))

    async def close(self) -> None:
        self.stop.set()
        for thread, tail in self.readers:
            await asyncio.to_thread(thread.join)
            tail.close()
        if self.producer is not None:
            await asyncio.to_thread(self.producer.close)


def _settle(done: asyncio.Future[None], err: Exception | None) -> None:
    if done.done():
        return
    if err is None:
        done.set_result(None)
    else:
        done.set_exception(err)
