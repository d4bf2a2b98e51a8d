"""Waiting until the link log in Kafka holds what a kill -9 test relies on."""

from __future__ import annotations

import asyncio

from broker.codec import default_codec
from broker.kafka_io import KafkaConfig, read_partition
from broker.robust._link_writer import BATCH_SCHEMA

TIMEOUT = 60.0


async def logged(config: KafkaConfig, links: tuple[str, ...], ordinal: int) -> None:
    """Until the link log in Kafka holds a record of each of `links` with at least `ordinal`
    (read from Kafka: the broker is another process). Link records linger in their producer
    for a few ms after they are sent (broker/core.py); one a kill -9 finds there is lost, and
    the restarted broker sends its message again in the new epoch instead of refilling it
    (robust-binding §2.5). A test about the refill waits for this before the kill."""
    codec = default_codec()

    def tops() -> dict[str, int]:
        top = dict.fromkeys(links, 0)
        for rec in read_partition(config, config.topic("links"), 0):
            name, body = codec.decode(rec.value) if rec.value is not None else ("", None)
            for r in body["records"] if name == BATCH_SCHEMA else [body] if body else []:
                if r["link"] in top:
                    top[r["link"]] = max(top[r["link"]], r["ordinal"])
        return top

    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while min((got := await asyncio.to_thread(tops)).values()) < ordinal:  # reads wait on Kafka
        assert asyncio.get_running_loop().time() < deadline, f"link records not durable: {got}"
