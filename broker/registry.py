"""Durable registries: one compacted Kafka topic each, loaded whole at start.

A registry maps a key to the newest record written under it; deleting writes a tombstone, which
compaction later drops. `put` returns only after Kafka has the record, and only then changes the
in-memory view, so what a caller was told and what a restart rebuilds always agree.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from broker.codec import Codec
from broker.kafka_io import KafkaConfig, KafkaProducer, partition_count, read_partition

__all__ = ["Registry"]


class _Keyed(Protocol):
    @property
    def key(self) -> str: ...

    def to_avro(self) -> dict[str, Any]: ...


T = TypeVar("T", bound=_Keyed)


class Registry(Generic[T]):
    def __init__(self, config: KafkaConfig, producer: KafkaProducer, codec: Codec, *,
                 role: str, schema: str, from_avro: Callable[[dict[str, Any]], T]) -> None:
        self.topic = config.topic(role)
        self._config = config
        self._producer = producer
        self._codec = codec
        self._schema = schema
        self._from_avro = from_avro
        self._items: dict[str, T] = {}
        self._lock = threading.Lock()

    def load(self) -> int:
        items: dict[str, T] = {}
        for part in range(partition_count(self._config, self.topic)):
            for rec in read_partition(self._config, self.topic, part):
                if rec.key is None:
                    continue
                key = rec.key.decode()
                if rec.value is None:
                    items.pop(key, None)
                else:
                    _, data = self._codec.decode(rec.value, expect=self._schema)
                    items[key] = self._from_avro(data)
        with self._lock:
            self._items = items
        return len(items)

    def put(self, item: T) -> T:
        value = self._codec.encode(self._schema, item.to_avro())  # invalid: raises, writes nothing
        self._producer.produce_sync(self.topic, item.key.encode(), value)
        with self._lock:
            self._items[item.key] = item
        return item

    def delete(self, key: str) -> bool:
        with self._lock:
            if key not in self._items:
                return False
        self._producer.produce_sync(self.topic, key.encode(), None)
        with self._lock:
            self._items.pop(key, None)
        return True

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items.values()))
