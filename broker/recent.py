"""The journal's recent past, kept in memory as the follower read it.

A subscriber that lost messages almost always lost recent ones: a dropped connection, a slow
consumer, a broker restart moments ago. Gap fills and source repairs of those would otherwise
read the journal back from Kafka and decode every record again (about 10 µs a record in Python:
a second for a 10,000-message repair). The journal follower has just read and decoded exactly
those records, in offset order, partition by partition, so this keeps them.

What it holds, per journal partition: every record the follower read from some offset `first`
up to `end` (exclusive), contiguous — DATA and GAP entries alike (an undecodable record ends
the run: readers then go to Kafka for anything before it, and get Kafka's own answer). Reads
ask for what it covers and go to Kafka for the rest (`Journal.read_source`,
`broker.robust.refill`), so answers are the same with or without it. Memory is bounded by
`max_bytes` (content octets plus a per-entry allowance); the oldest entries go first. The
follower thread writes, reader threads (gap fills, repairs) read: one lock, held only to copy.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

from broker.records import JournalEntry

__all__ = ["DEFAULT_RECENT_BYTES", "RecentJournal"]

#: Enough for the last few hundred thousand small messages.
DEFAULT_RECENT_BYTES = 64 * 1024 * 1024
#: What an entry costs beyond its content (the object, its strings, the index slot), roughly.
ENTRY_OVERHEAD = 600


class _Run:
    """One partition's contiguous run: entries[i] sits at offsets[i]; `end` is one past the
    last offset read (records the follower skipped, such as compaction holes, leave no entry
    but are covered)."""

    __slots__ = ("end", "entries", "first", "offsets")

    def __init__(self, first: int) -> None:
        self.first = self.end = first
        self.offsets: list[int] = []
        self.entries: list[JournalEntry] = []


class RecentJournal:
    def __init__(self, max_bytes: int = DEFAULT_RECENT_BYTES) -> None:
        self.max_bytes = max_bytes
        self._runs: dict[int, _Run] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def add(self, partition: int, offset: int, entry: JournalEntry | None) -> None:
        """The follower read the record at `offset` (None: one it could not decode, which
        ends the run). Offsets of one partition come in rising order."""
        if self.max_bytes <= 0:
            return
        with self._lock:
            run = self._runs.get(partition)
            if entry is None or run is None or offset < run.end:
                # the start, an undecodable record, or a follower that went back: start over
                if run is not None:
                    self._bytes -= sum(_size(e) for e in run.entries)
                run = self._runs[partition] = _Run(offset + 1 if entry is None else offset)
                if entry is None:
                    return
            run.offsets.append(offset)
            run.entries.append(entry)
            run.end = offset + 1
            self._bytes += _size(entry)
            if self._bytes > self.max_bytes:
                self._evict()

    def add_many(self, entries: Iterable[tuple[int, int, JournalEntry | None]]) -> None:
        for partition, offset, entry in entries:
            self.add(partition, offset, entry)

    def scan(self, partition: int, start: int) -> tuple[list[JournalEntry], int] | None:
        """The entries from `start` on, and the offset after the last one covered; None if
        `start` is before what is kept (read Kafka instead)."""
        with self._lock:
            run = self._runs.get(partition)
            if run is None or not run.first <= start <= run.end:
                return None
            i = bisect.bisect_left(run.offsets, start)
            return run.entries[i:], run.end

    def get(self, partition: int, offset: int) -> JournalEntry | None:
        """The entry at `offset`, if kept."""
        with self._lock:
            run = self._runs.get(partition)
            if run is None or not run.first <= offset < run.end:
                return None
            i = bisect.bisect_left(run.offsets, offset)
            if i < len(run.offsets) and run.offsets[i] == offset:
                return run.entries[i]
            return None

    def _evict(self) -> None:
        """Drop the oldest entries (of the partition whose oldest is oldest) to 3/4 of the
        budget, in one step, so eviction is not paid on every add."""
        target = self.max_bytes * 3 // 4
        while self._bytes > target:
            run = min((r for r in self._runs.values() if r.entries),
                      key=lambda r: r.entries[0].appended_at, default=None)
            if run is None:
                return
            cut, freed = 0, 0
            while cut < len(run.entries) and self._bytes - freed > target:
                freed += _size(run.entries[cut])
                cut += 1
                if cut >= 1024:
                    break  # another partition's oldest may be older now
            run.first = run.offsets[cut] if cut < len(run.offsets) else run.end
            del run.offsets[:cut], run.entries[:cut]
            self._bytes -= freed


def _size(entry: JournalEntry) -> int:
    return len(entry.content) + ENTRY_OVERHEAD
