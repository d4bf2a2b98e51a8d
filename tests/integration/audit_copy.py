"""A namespace's topics copied through Kafka into another namespace, with one chosen change: the
damaged histories the audit tests check (the bigger, kill -9 version is ops/audit_history.py).

Records keep their partition, key and Kafka timestamp. The links topic is copied one link
record at a time (packs unpacked, then packed again as they were), so an edit can remove,
repeat or move one link record; the journal is copied record by record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from broker.codec import default_codec
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, partition_count, read_partition

ROLES = ("journal", "links", "subscriptions", "access", "topics")

#: (partition, key, timestamp_ms, value or records) of one Kafka record; for the links topic
#: the value is the list of link records of the pack.
Item = list[Any]
Edit = Callable[[str, list[Item]], list[Item]]


def read(config: KafkaConfig, role: str) -> list[Item]:
    codec = default_codec()
    topic = config.topic(role)
    out: list[Item] = []
    for p in range(partition_count(config, topic)):
        for rec in read_partition(config, topic, p):
            value: Any = rec.value
            if role == "links" and value is not None:
                name, decoded = codec.decode(value)
                value = decoded["records"] if name == "link_batch" else [decoded]
            out.append([p, rec.key, rec.timestamp_ms, value])
    return out


def copy(src: KafkaConfig, dst: KafkaConfig, edit: Edit | None = None) -> None:
    """Copy `src`'s audited topics into `dst` (created as a broker creates them), passing each
    role's items through `edit(role, items)`."""
    core = BrokerCore(dst)
    core.open()
    core.close()
    codec = default_codec()
    producer = Producer({"bootstrap.servers": dst.bootstrap, "enable.idempotence": True})
    for role in ROLES:
        items = read(src, role)
        if edit is not None:
            items = edit(role, items)
        for p, key, ts, value in items:
            if role == "links" and not value:
                continue
            encoded = codec.encode("link_batch", {"records": value}) if role == "links" \
                else value
            producer.produce(dst.topic(role), encoded, key, partition=p, timestamp=ts)
    assert producer.flush(30) == 0


def data_records(items: list[Item], link: str) -> list[tuple[int, int]]:
    """(item index, index in its pack) of every DATA record of `link`, in log order."""
    return [(i, j) for i, item in enumerate(items) for j, r in enumerate(item[3] or [])
            if r["link"] == link and r["kind"] == "DATA"]
