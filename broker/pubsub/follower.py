"""Read the journal back as it grows, for live forwarding.

A thread polls a `kafka_io.Tail` over every journal partition and hands each batch of decoded
DATA entries to `deliver` (the adapter hops onto its event loop there). Forwarding from what the
journal returns, rather than from the message in hand, means a subscriber only ever sees what
Kafka made durable, in Kafka's order (per source: seq order, since a source has one partition).

Where the follower starts: given per partition by its caller. `BrokerApp` starts it at the
fan-out mark (broker/robust/fanout.py), so what was journaled but not yet on its subscribers'
links when the last broker stopped is forwarded now rather than lost; partitions without a
mark start where the item state's recovery ended (the journal's end).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from broker.codec import Codec
from broker.errors import ApexpsError
from broker.journal import SCHEMA
from broker.kafka_io import KafkaConfig, Tail
from broker.recent import RecentJournal
from broker.records import JournalEntry, RecordKind

__all__ = ["JournalFollower"]

log = structlog.get_logger(__name__)


class JournalFollower:
    def __init__(self, config: KafkaConfig, codec: Codec,
                 deliver: Callable[[list[JournalEntry]], None], *,
                 start: dict[int, int] | None = None,
                 recent: RecentJournal | None = None) -> None:
        """`start`: the offset to begin at per journal partition (others: the end).
        `recent`: where to keep what was read, for gap fills and repairs (broker/recent.py)."""
        self._recent = recent
        self._tail = Tail(config, config.topic("journal"), start)
        self.start_positions = dict(self._tail.start)
        self._codec, self._deliver = codec, deliver
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="journal-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            batch: list[JournalEntry] = []
            recent = self._recent
            for rec in self._tail.poll(1000, 0.1):
                part, offset = rec.position
                if rec.value is None:
                    if recent is not None:
                        recent.add(part, offset, None)
                    continue
                try:
                    _, data = self._codec.decode(rec.value, expect=SCHEMA)
                except ApexpsError as exc:
                    log.error("undecodable journal record skipped", position=str(rec.position),
                              error=str(exc))
                    if recent is not None:
                        recent.add(part, offset, None)
                    continue
                entry = JournalEntry.from_avro(rec.position, data)
                if recent is not None:
                    recent.add(part, offset, entry)
                if entry.kind is RecordKind.DATA:
                    batch.append(entry)
            if batch:
                try:
                    self._deliver(batch)
                except RuntimeError:  # the event loop is gone: we are shutting down
                    return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._tail.close()
