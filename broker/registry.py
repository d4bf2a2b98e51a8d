"""Durable registries: one compacted Kafka topic each, loaded whole at start.

A registry maps a key to the newest record written under it; deleting writes a tombstone, which
compaction later drops. `put` returns only after Kafka has the record, and only then changes the
in-memory view, so what a caller was told and what a restart rebuilds always agree.

Other processes may write the same topic (the `apexps access` CLI does while a broker runs).
`refresh()` reads only what was appended after the offsets the last `load()`/`refresh()` reached,
up to the high watermark at the time of the call, and applies it. It is meant to be called every
second for the life of a broker, so it keeps one consumer (`kafka_io.PartitionReader`, made on
the first refresh, released by `close()`): a refresh that finds nothing new costs one watermark
request per partition over an open connection, not a new Kafka client.

Kafka's order decides between writers: the view remembers, per key, the offset of the record it
reflects and never replaces it with an older one, so a `put` racing a `refresh` that is still
applying earlier records cannot be undone by them. `version` rises on every change of the
view, and `watch` tells a listener about each change as it is applied, so derived state (the
access index) follows without rebuilding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from broker.codec import Codec
from broker.kafka_io import (
    KAFKA_WAIT_S,
    KafkaConfig,
    PartitionReader,
    StoredRecord,
    partition_count,
    read_partition,
)
from broker.kafka_producer import KafkaProducer

__all__ = ["Registry"]


class _Keyed(Protocol):
    @property
    def key(self) -> str: ...

    def to_avro(self) -> dict[str, Any]: ...


T = TypeVar("T", bound=_Keyed)


class _Change(NamedTuple, Generic[T]):
    """One decoded record: `item` None is a tombstone."""

    key: str
    offset: int
    item: T | None


#: Told (key, item) after each change of a registry's view; item None means the key is gone.
Watcher = Callable[[str, T | None], None]


class Registry(Generic[T]):
    def __init__(self, config: KafkaConfig, producer: KafkaProducer, codec: Codec, *,
                 role: str, schema: str, from_avro: Callable[[dict[str, Any]], T],
                 kafka_wait_s: float = KAFKA_WAIT_S) -> None:
        """`kafka_wait_s`: how long a refresh waits for Kafka before JournalUnavailable."""
        self.topic = config.topic(role)
        self._config = config
        self._producer = producer
        self._codec = codec
        self._schema = schema
        self._from_avro = from_avro
        self._items: dict[str, T] = {}
        #: key -> offset of the record the view reflects for it (tombstones included), so an
        #: older record read late never overwrites a newer one.
        self._offsets: dict[str, int] = {}
        #: partition -> offset after the last record read; None: nothing read yet.
        self._next: dict[int, int | None] = {}
        self._watchers: list[Watcher[T]] = []
        #: Guards the view; put/delete/watch take it, briefly.
        self._lock = threading.Lock()
        #: One load/refresh at a time: they share `_next` and the reader, and a refresh may
        #: wait on Kafka for `kafka_wait_s`, which must not hold up put/get.
        self._reading = threading.Lock()
        self._reader = PartitionReader(config, self.topic, wait_s=kafka_wait_s)  # no client yet
        self._closed = False
        #: Rises whenever the view changes (load, put, delete, or a refresh that applied records).
        self.version = 0

    def watch(self, watcher: Watcher[T]) -> None:
        """Tell `watcher` about every item now in the view, then about each change, in Kafka
        order. It runs under the registry's lock on whichever thread made the change (a
        caller of put/delete, or the one refreshing), so it must be quick and must not call
        back into the registry."""
        with self._lock:
            for key, item in self._items.items():
                watcher(key, item)
            self._watchers.append(watcher)

    def _set(self, change: _Change[T]) -> bool:
        """Apply `change` (lock held) unless the view reflects that offset or a newer one."""
        if self._offsets.get(change.key, -1) >= change.offset:
            return False
        self._offsets[change.key] = change.offset
        if change.item is None:
            if self._items.pop(change.key, None) is None:
                return False
        else:
            self._items[change.key] = change.item
        self.version += 1
        for watcher in self._watchers:
            watcher(change.key, change.item)
        return True

    def load(self) -> int:
        """Read the whole topic, replacing the view; returns how many keys it holds."""
        with self._reading:
            self._check_open()
            return self._load()

    def _load(self) -> int:
        # One-off reads: a registry that is only ever loaded keeps no client around.
        items: dict[str, T] = {}
        offsets: dict[str, int] = {}
        ends: dict[int, int | None] = {}
        for part in range(partition_count(self._config, self.topic)):
            ends[part] = None
            for rec in read_partition(self._config, self.topic, part):
                ends[part] = rec.position.offset + 1
                change = self._decode(rec)
                if change is not None and offsets.get(change.key, -1) < change.offset:
                    offsets[change.key] = change.offset
                    if change.item is None:
                        items.pop(change.key, None)
                    else:
                        items[change.key] = change.item
        with self._lock:
            old = self._items
            self._items, self._offsets, self._next = items, offsets, ends
            self.version += 1
            for key in old.keys() | items.keys():
                if old.get(key) != items.get(key):
                    for watcher in self._watchers:
                        watcher(key, items.get(key))
        return len(items)

    def refresh(self) -> int:
        """Apply records appended since the last load/refresh (by any process), up to the high
        watermark now; returns how many changed the view. Costs one watermark request per
        partition when nothing changed. Safe from several threads (they take turns).

        Raises:
            JournalUnavailable: Kafka did not answer within `kafka_wait_s`; nothing was
                applied from the partition that failed, and the next refresh tries again
                (on a new consumer).
            RuntimeError: the registry was closed.
        """
        with self._reading:
            self._check_open()
            if not self._next:
                return self._load()
            changed = 0
            for part, start in list(self._next.items()):
                low, high = self._reader.watermarks(part)
                first = low if start is None else max(start, low)
                if first >= high:
                    continue
                records = self._reader.read(part, first, high)
                # Decode everything first: a record that does not decode raises with nothing
                # applied.
                changes = [c for c in map(self._decode, records) if c is not None]
                with self._lock:
                    changed += sum(self._set(c) for c in changes)
                    self._next[part] = max(high, self._next.get(part) or 0)
            return changed

    def close(self) -> None:
        """Release the refresh consumer; idempotent. `put`, `delete` and reading the view
        still work (the producer is the caller's); `load` and `refresh` raise RuntimeError,
        rather than quietly making a Kafka client that nothing would close."""
        with self._reading:  # after a refresh in flight, not under it
            self._closed = True
            self._reader.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"registry {self.topic} is closed: it reads Kafka no more")

    def _decode(self, rec: StoredRecord) -> _Change[T] | None:
        if rec.key is None:
            return None
        item = None
        if rec.value is not None:
            _, data = self._codec.decode(rec.value, expect=self._schema)
            item = self._from_avro(data)
        return _Change(rec.key.decode(), rec.position.offset, item)

    def put(self, item: T) -> T:
        value = self._codec.encode(self._schema, item.to_avro())  # invalid: raises, writes nothing
        pos = self._producer.produce_sync(self.topic, item.key.encode(), value)
        with self._lock:
            self._set(_Change(item.key, pos.offset, item))
        return item

    def delete(self, key: str) -> bool:
        with self._lock:
            if key not in self._items:
                return False
        pos = self._producer.produce_sync(self.topic, key.encode(), None)
        with self._lock:
            self._set(_Change(key, pos.offset, None))
        return True

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items.values()))
