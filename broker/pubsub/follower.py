"""Read the journal back as it grows, for live forwarding.

A thread polls a `kafka_io.Tail` over every journal partition and hands each batch of decoded
DATA entries to `deliver`, with how far it read each partition (the adapter hops onto its event
loop there). What the journal returns is durable, in Kafka's order (per source: seq order, since
a source has one partition). The broker forwards its own publications on acknowledgement, from
memory (broker/delivery/cursor.py); what the follower reads is how the fan-out learns of
everything else in the journal (other writers, GAP records) and of what the broker wrote before
it started, and `reached` lets the cursor pass records that forward nothing.

`when_read` is read-your-writes for requests that look at what forwarding built (a snapshot
reads the data item state, which `deliver` advances): it calls back once everything the journal
held when it was asked has been handed to `deliver`. Right after a start, or on a loaded machine,
the tail can be a good half second behind an append that was already acknowledged.

Off the critical path. On one broker the follower forwards almost nothing (its own
publications reached their subscribers on acknowledgement), so it fetches lazily: Kafka answers
its fetch once `FETCH_MIN_BYTES` are there or `FETCH_WAIT_MS` has passed: about ten fetches a
second at a paced rate instead of one per produce. What that costs: a record written by another
writer (another broker, a GAP record) reaches the fan-out up to `FETCH_WAIT_MS` later, and so do
this broker's own records waiting behind it in the cursor, which waits for the follower only
across offsets it did not write itself (broker/delivery/cursor.py); and `when_read` (a snapshot's
read-your-writes) may wait as long. And it does not decode what it already has: the ack road
hands this broker's acknowledged entries over (`acked`), and a record the follower reads at one
of their offsets takes that entry (equal to what decoding would give: `JournalEntry.
of_publication`) instead of decoding the value, for the cursor (which drops it if forwarded) and
for the recent journal (which needs every entry).

Where the follower starts: given per partition by its caller. `BrokerApp` starts it at the
fan-out mark (broker/robust/fanout.py), so what was journaled but not yet on its subscribers'
links when the last broker stopped is forwarded now rather than lost; partitions without a
mark start where the item state's recovery ended (the journal's end).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import structlog

from broker.codec import Codec
from broker.journal import SCHEMA
from broker.kafka_io import KafkaConfig, PartitionReader, Position, StoredRecord, Tail
from broker.recent import RecentJournal
from broker.records import JournalEntry, RecordKind
from common.errors import ApexpsError

__all__ = ["JournalFollower"]

log = structlog.get_logger(__name__)

#: How long Kafka may hold the follower's fetch before it answers with what it has. Measured
#: (1,000 msg/s, the follower's fetches per message from librdkafka's stats, 2026-11-26):
#: answered at the first record (before): 0.16-0.86; 20 ms: 0.052-0.064; 100 ms: 0.010-0.013.
#: With 100 ms, Kafka's JVM spent 197-497 µs per message in bench_peers W2 robust against
#: 266-717 before (with the link log's linger; docs/bench-peers.md). 100 ms is also what an
#: idle tail asked before (`kafka_io.TAIL_FETCH_WAIT_MS`); what it costs other writers is above.
FETCH_WAIT_MS = 100
#: What makes Kafka answer sooner: more than a paced broker writes in FETCH_WAIT_MS (1,000
#: msg/s of 512 octets is ~50 KiB per 100 ms), so the wait decides; a backlog (a start behind
#: the fan-out mark, a flat-out publisher) comes back in fetches of this size without waiting.
FETCH_MIN_BYTES = 1 << 20
#: Acknowledged entries kept for the follower per partition before those it has passed are
#: dropped (one the follower read before its acknowledgement arrived is never taken).
_ACKED_PRUNE = 4096


class JournalFollower:
    def __init__(self, config: KafkaConfig, codec: Codec,
                 deliver: Callable[[list[JournalEntry], dict[int, int]], None], *,
                 start: dict[int, int] | None = None,
                 recent: RecentJournal | None = None) -> None:
        """`deliver(entries, reached)`: the DATA entries read, and per partition read from
        the first offset not yet read. `start`: the offset to begin at per journal partition
        (others: the end).
        `recent`: where to keep what was read, for gap fills and repairs (broker/recent.py)."""
        self._recent = recent
        self._tail = Tail(config, config.topic("journal"), start,
                          fetch_wait_ms=FETCH_WAIT_MS, fetch_min_bytes=FETCH_MIN_BYTES)
        self.start_positions = dict(self._tail.start)
        self._codec, self._deliver = codec, deliver
        #: next offset to hand on, per partition; written by the follower thread after
        #: `deliver` has the records before it, under `_lock` with `_waiters`
        self._read = dict(self._tail.start)
        self._waiters: list[tuple[dict[int, int], Callable[[], None]]] = []
        self._lock = threading.Lock()
        # The journal's ends are asked of a consumer of their own: a watermark query on the
        # tail's consumer waits while the follower thread polls it (seen: for its whole timeout).
        self._ends = PartitionReader(config, config.topic("journal"))
        self._ends_lock = threading.Lock()
        #: partition -> offset -> the entry the ack road built for it (`acked`), under
        #: `_acked_lock`; the follower takes them instead of decoding
        self._acked: dict[int, dict[int, JournalEntry]] = {}
        self._acked_lock = threading.Lock()
        #: records taken from `_acked`, not decoded (tests, the benchmark)
        self.undecoded = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="journal-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def acked(self, entries: Sequence[JournalEntry]) -> None:
        """Kafka acknowledged these journal entries, which this broker wrote (any thread):
        when the follower reads their records it takes them rather than decoding."""
        with self._acked_lock:
            acked = self._acked
            for entry in entries:
                part, offset = entry.position
                known = acked.get(part)
                if known is None:
                    known = acked[part] = {}
                known[offset] = entry

    def acked_held(self) -> int:
        """Acknowledged entries handed over and not yet taken or dropped."""
        with self._acked_lock:
            return sum(len(known) for known in self._acked.values())

    def when_read(self, callback: Callable[[], None]) -> None:
        """Call `callback` once everything the journal holds now has been handed to `deliver`
        (whatever its kind: a record that forwards nothing still counts as read). It runs in
        this thread if that is already so, else in the follower's, right after the `deliver`
        call that completed it: so whatever `deliver` schedules on an event loop runs before
        what `callback` schedules there. Blocks for a watermark query; JournalUnavailable if
        Kafka does not answer it in time."""
        with self._ends_lock:
            ends = {part: self._ends.watermarks(part)[1] for part in self._tail.start}
        with self._lock:
            if self._behind(ends):
                self._waiters.append((ends, callback))
                return
        callback()

    def _behind(self, ends: dict[int, int]) -> bool:
        read = self._read
        return any(read.get(part, 0) < end for part, end in ends.items())

    def _run(self) -> None:
        while not self._stop.is_set():
            batch: list[JournalEntry] = []
            recent = self._recent
            reached: dict[int, int] = {}
            records = self._tail.poll(1000, 0.1)
            taken = self._take(records) if records else {}
            for rec in records:
                part, offset = rec.position
                reached[part] = offset + 1
                had = taken.get(rec.position)
                if had is not None:  # built on acknowledgement: the same entry, not decoded
                    if recent is not None:
                        recent.add(part, offset, had)
                    batch.append(had)
                    continue
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
            if batch or reached:
                try:
                    self._deliver(batch, reached)
                except RuntimeError:  # the event loop is gone: we are shutting down
                    return
            if reached:
                self._advance(reached)

    def _take(self, records: list[StoredRecord]) -> dict[Position, JournalEntry]:
        """The acknowledged entries at these records' positions, out of `_acked`; and the
        ones left behind the records (acknowledged after the follower read them) dropped."""
        taken: dict[Position, JournalEntry] = {}
        ends: dict[int, int] = {}
        with self._acked_lock:
            acked = self._acked
            if not acked:
                return taken
            for rec in records:
                part, offset = rec.position
                ends[part] = offset + 1
                known = acked.get(part)
                if known:
                    entry = known.pop(offset, None)
                    if entry is not None:
                        taken[rec.position] = entry
            for part, end in ends.items():
                known = acked.get(part)
                if known is not None and len(known) > _ACKED_PRUNE:
                    for offset in [o for o in known if o < end]:
                        del known[offset]
        self.undecoded += len(taken)
        return taken

    def _advance(self, reached: dict[int, int]) -> None:
        with self._lock:
            self._read.update(reached)
            if not self._waiters:
                return
            due = [cb for ends, cb in self._waiters if not self._behind(ends)]
            self._waiters = [w for w in self._waiters if self._behind(w[0])]
        for callback in due:
            try:
                callback()
            except Exception:  # a waiter's failure must not stop forwarding
                log.exception("journal follower: a when_read callback failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._tail.close()
        with self._ends_lock:
            self._ends.close()
