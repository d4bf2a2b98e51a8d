"""The journal: every accepted message, durable in Kafka, numbered strictly per source.

Theory of operation
-------------------
Appends. A source's records all go to one journal partition (crc32 of the source), keyed by the
source, through one idempotent acks=all producer. Seqs are assigned under a lock in produce
order, and an idempotent producer keeps a partition's order, so within a partition a source's
seqs rise with the offsets. A caller learns of durability only from the delivery report.
`append` takes one publication and calls back once per record; `append_many` takes whatever
arrived together (the pubsub service's event-loop tick), under one lock and one pass, and calls
back once per batch. Each record in flight is one small `Delivery` object that librdkafka calls
directly: the cost of an append is Python time under the GIL, on the caller's thread and on the
poll thread alike, and with tens of thousands of records in flight every extra container
object is also garbage-collector time.

A record that fails (a delivery error, or one Kafka refuses outright inside a batch) has
already used its seq: a GAP record explains it, and the caller gets the error.

Checkpoints (the compacted `sources` topic, one partition so its order is total):
- key `SOURCE` → the source's last durable seq and its position, its highest durable publisher
  seq and the publisher seqs whose append failed and no resend has made durable yet;
- key `SOURCE NUL bucket` → position of the first record of seqs [bucket·1024, …): a sparse
  index that lets a read by (source, after seq) seek instead of scanning the partition;
- key `NUL partition NUL p` → "every source's checkpoint covers partition p up to this offset".
The journal owns the source state and its schema; the key scheme, when to flush, the write order
and the recovery read are the checkpoint book's (broker/checkpoints.py): a flush (on the
producer's poll thread, every second or every 1000 deliveries) writes the source checkpoints,
and the partition markers only once Kafka holds them. A failed append is a hold on its source:
until its GAP record is durable no marker moves and the source's checkpoint is not written (a
checkpoint counting the seqs after the hole would hide the hole from recovery). Delivery reports
mostly run on the poll thread but also on any thread inside `flush()`, so what they update is
guarded by a lock of its own; a batch is booked only once every record in it has its outcome.

Recovery (on every start). Load the checkpoints, then scan each journal partition from just after
its marker to the end: that tail is exactly what no checkpoint covers. Per source, the next seq
is one past the highest seen. A hole in the tail — a seq missing between two present ones, which
a crash with records in flight can leave — gets an explicit GAP record, so an audit can prove
there was no silent loss: every seq from 1 to the last is either a DATA record or inside a GAP.

Publisher seqs (docs/robust-binding.md §8). The journal keeps, per source, the highest publisher
seq durable in it and the set of publisher seqs whose append failed and that no resend has made
durable since (a failed pubseq below the highest is not a duplicate: its resend must be
journaled). Both travel in the source checkpoint; a failure is checkpointed at once, and its GAP
record carries the publisher seq, so the recovery scan of the tail rebuilds both exactly. Which
publication to append at all is decided above the journal (`broker.pubseq`).

Known limit: a dead process's last produce request could, in theory, land after recovery scanned
the tail; a transactional producer per source owner would fence it.

Why one module of this length: the per-source seq assignment, its recovery and the reads
share one state under one lock; the record writer (`journal_writer.py`), the publisher-seq
ledger (`pubseq.py`) and the checkpoints (`checkpoints.py`) are already apart.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import structlog

from broker.checkpoints import CheckpointBook, Loaded
from broker.codec import Codec, default_codec
from broker.journal_writer import DataRecordWriter
from broker.kafka_io import KafkaConfig, Position, offset_for_time, read_partition
from broker.kafka_producer import Delivery, KafkaCheckpoints, KafkaProducer
from broker.names import validate_topic
from broker.recent import RecentJournal
from broker.records import JournalEntry, Publication, RecordKind, gap_record, now_ms, to_ms
from common.errors import ApexpsError, InvalidParameter, JournalUnavailable

__all__ = ["SEQ_BUCKET", "AppendCallback", "Appended", "BatchCallback", "Journal",
           "PublisherPosition", "RecoveryReport"]

log = structlog.get_logger(__name__)

#: Seqs per sparse-index entry: a read by (source, after) scans at most this many of the
#: source's records before the first one it wants.
SEQ_BUCKET = 1024
#: An APEX endpoint is far shorter; anything longer is hostile input.
MAX_SOURCE_LEN = 1024

#: Bound on the per-process caches of validated topic names and source partitions.
_CACHE_LIMIT = 100_000
#: Failed publisher seqs remembered per source (so that their resends are journaled). A
#: publisher that never resends leaves them behind; past this many the lowest is forgotten,
#: and a resend of it would be taken for a duplicate.
MAX_FAILED_PUBSEQS = 1024

SCHEMA = "journal_record"
CHECKPOINT_SCHEMA = "source_checkpoint"


class Appended(NamedTuple):
    """An append that Kafka has made durable."""

    source: str
    source_seq: int
    position: Position
    #: the record's `appended_at` (ms), so the acknowledged entry can be rebuilt from memory
    #: exactly as the journal follower would decode it (`JournalEntry.of_publication`)
    appended_at: int = 0


class PublisherPosition(NamedTuple):
    """How far a source's publications are durable in the journal (robust-binding §8)."""

    #: the highest publisher seq durable; 0: none
    publisher_seq: int
    #: the source's newest source seq (DATA or GAP); 0: none
    source_seq: int
    #: publisher seqs whose append failed and that no resend has made durable yet
    failed: frozenset[int]


@dataclass
class RecoveryReport:
    sources: int = 0
    scanned: int = 0
    gaps_written: list[tuple[str, int, int]] = field(default_factory=list)
    duplicates: int = 0
    seconds: float = 0.0


@dataclass
class _SourceState:
    seq: int = 0  # last durable seq
    position: Position | None = None
    indexed_bucket: int = -1
    #: the offset the book's index holds for `indexed_bucket` (the lowest seen of a record in it)
    indexed_offset: int = -1
    pubseq: int = 0  # highest durable publisher seq
    pub_failed: set[int] = field(default_factory=set)

    def publisher_durable(self, pubseq: int) -> None:
        self.pubseq = max(self.pubseq, pubseq)
        if self.pub_failed:
            self.pub_failed.discard(pubseq)

    def publisher_failed(self, pubseq: int) -> None:
        self.pub_failed.add(pubseq)
        if len(self.pub_failed) > MAX_FAILED_PUBSEQS:
            forgotten = min(self.pub_failed)
            self.pub_failed.discard(forgotten)
            log.error("too many failed publisher seqs never resent; forgetting the lowest",
                      pubseq=forgotten, limit=MAX_FAILED_PUBSEQS)


AppendCallback = Callable[[Exception | None, Appended | None], None]
#: One outcome per publication of an `append_many`, in the order given.
BatchCallback = Callable[[list[Appended | JournalUnavailable]], None]

# Hot-path constructors: NamedTuple's generated __new__ is a Python function; tuple.__new__
# builds the same object without the extra frame.
_tuple_new = tuple.__new__


class _Append(Delivery):
    """One `append` in flight."""

    __slots__ = ("appended_at", "callback", "journal", "pubseq", "seq", "source", "topic")

    def __init__(self, journal: Journal, source: str, topic: str, seq: int,
                 callback: AppendCallback, *, pubseq: int | None, appended_at: int) -> None:
        self.appended_at = appended_at
        self.journal = journal
        self.source = source
        self.topic = topic
        self.seq = seq
        self.pubseq = pubseq
        self.callback = callback

    def delivered(self, partition: int, offset: int) -> None:
        source, seq, journal = self.source, self.seq, self.journal
        pos = _tuple_new(Position, (partition, offset))
        with journal._book:
            journal._on_durable(source, seq, pos, self.pubseq)
        try:
            self.callback(None, _tuple_new(Appended, (source, seq, pos, self.appended_at)))
        except Exception:  # the caller's bug must not stop other delivery reports
            log.exception("append callback failed")

    def failed(self, error: JournalUnavailable) -> None:
        self.journal._append_failed(self.source, self.topic, self.seq, error, self.pubseq)
        _call_back(self.callback, error, None)


class _Batch:
    """One `append_many` in flight: where each record went and how many outcomes are still out.

    `left` holds one token per record; each outcome pops one, and the outcome that pops the
    token 0 is the last. list.pop is atomic, so deliveries served on two threads at once (the
    poll thread and a caller inside flush()) can neither lose a count nor finish twice."""

    __slots__ = ("appended_at", "callback", "errors", "journal", "left", "offsets", "parts",
                 "pubseqs", "seqs", "sources", "topics")

    def __init__(self, journal: Journal, n: int, callback: BatchCallback) -> None:
        self.appended_at = 0
        self.journal = journal
        self.callback = callback
        self.sources: list[str] = []
        self.topics: list[str] = []
        self.seqs: list[int] = []
        self.pubseqs: list[int | None] = []
        self.parts: list[int] = []
        self.offsets: list[int] = [-1] * n
        self.errors: dict[int, JournalUnavailable] = {}
        self.left = list(range(n))

    def failed(self, index: int, error: JournalUnavailable) -> None:
        self.errors[index] = error
        self.journal._append_failed(self.sources[index], self.topics[index], self.seqs[index],
                                    error, self.pubseqs[index])
        if not self.left.pop():
            self.journal._finish(self)


class _BatchRecord(Delivery):
    """One record of an `append_many` in flight."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self.batch = batch
        self.index = index

    def delivered(self, partition: int, offset: int) -> None:
        batch = self.batch
        batch.offsets[self.index] = offset
        if not batch.left.pop():
            batch.journal._finish(batch)

    def failed(self, error: JournalUnavailable) -> None:
        self.batch.failed(self.index, error)


class Journal:
    def __init__(self, config: KafkaConfig, producer: KafkaProducer,
                 codec: Codec | None = None) -> None:
        self.config = config
        self.topic = config.topic("journal")
        self.sources_topic = config.topic("sources")
        self._producer = producer
        self._codec = codec or default_codec()
        self._writer = DataRecordWriter(self._codec)
        #: what the journal follower read lately (broker/recent.py), if a follower keeps it:
        #: read_source takes what it covers from there
        self.recent: RecentJournal | None = None
        # _lock: seq assignment and produce order. _book: what delivery reports update (they
        # run on the poll thread, or on any thread inside flush()); re-entrant because a
        # produce under it may serve deliveries on the same thread when the queue is full.
        self._lock = threading.Lock()
        self._book = threading.RLock()
        self._next: dict[str, int] = {}
        self._durable: dict[str, _SourceState] = {}
        # The source checkpoints, the seq index and the partition markers (broker/checkpoints.py).
        self._checkpoints = CheckpointBook(
            KafkaCheckpoints(config, producer, self.sources_topic, self.topic),
            encode_state=self._encode_source, encode_marker=self._encode_marker,
            decode_marker=self._decode_marker, lock=self._book)
        self._partitions = 0
        self._routes: dict[str, tuple[bytes, int]] = {}  # source -> (key, partition)
        self._valid_topics: set[str] = set()
        producer.add_after_poll(self._checkpoints.maybe_flush)

    # --- appends --------------------------------------------------------------------------

    def partition_for(self, source: str) -> int:
        route = self._routes.get(source)
        if route is not None:
            return route[1]
        return zlib.crc32(source.encode()) % self._partitions

    def _route(self, pub: Publication) -> tuple[bytes, int]:
        """Check what the journal itself requires of `pub`; its Kafka key and partition."""
        if not self._partitions:
            raise JournalUnavailable("the journal has not been recovered yet")
        if pub.topic not in self._valid_topics:
            validate_topic(pub.topic)
            if len(self._valid_topics) < _CACHE_LIMIT:
                self._valid_topics.add(pub.topic)
        route = self._routes.get(pub.source)
        if route is None:
            source = pub.source
            if type(source) is not str or not source or len(source) > MAX_SOURCE_LEN \
                    or "\x00" in source:
                raise InvalidParameter("the source endpoint is empty, too long or contains NUL")
            key = source.encode()
            route = (key, zlib.crc32(key) % self._partitions)
            if len(self._routes) < _CACHE_LIMIT:
                self._routes[source] = route
        return route

    def append(self, pub: Publication, callback: AppendCallback) -> int:
        """Queue `pub`; returns its source seq. `callback` runs once it is durable or failed.

        Invalid input raises before anything is assigned or written."""
        key, part = self._route(pub)
        source = pub.source
        with self._lock:
            seq = self._next.get(source, 1)
            appended_at = now_ms()
            value = self._writer.encode(pub, seq, appended_at)
            self._producer.produce(self.topic, key, value,
                                   _Append(self, source, pub.topic, seq, callback,
                                           pubseq=pub.publisher_seq, appended_at=appended_at),
                                   partition=part)
            self._next[source] = seq + 1
        return seq

    def append_many(self, pubs: Sequence[Publication], callback: BatchCallback) -> list[int]:
        """Queue every publication in `pubs`, in order; returns their source seqs.

        What `append` does for one record, with one lock, one pass and one callback for the
        lot: a publisher's records get consecutive seqs in the order given, whatever else is in
        the batch. `callback` runs once, when every record is durable or has failed, with one
        entry per publication in the same order: its `Appended`, or the `JournalUnavailable`
        that says why it failed. A failed record's seq is explained by a GAP record, exactly as
        for `append`; so is the seq of a record Kafka refuses outright (too large, say), which
        `append` would have raised instead. An empty batch calls back at once.

        Invalid input anywhere raises (naming the publication's index in a note) before
        anything is assigned or written; callers that must keep the valid rest can fall back to
        `append` per publication."""
        routes = []
        for i, pub in enumerate(pubs):
            try:
                routes.append(self._route(pub))
            except ApexpsError as exc:
                exc.add_note(f"publication {i} of the batch")
                raise
        if not pubs:
            callback([])
            return []
        batch = _Batch(self, len(pubs), callback)
        sources, topics, seqs, parts = batch.sources, batch.topics, batch.seqs, batch.parts
        pubseqs = batch.pubseqs
        encode = self._writer.encode
        records: list[tuple[bytes, bytes, int, Delivery]] = []
        with self._lock:
            appended_at = batch.appended_at = now_ms()
            nxt = self._next
            taken: dict[str, int] = {}  # seqs of this batch, committed once all encoded
            for i, pub in enumerate(pubs):
                source = pub.source
                seq = taken.get(source) or nxt.get(source, 1)
                try:
                    value = encode(pub, seq, appended_at)
                except ApexpsError as exc:
                    exc.add_note(f"publication {i} of the batch")
                    raise
                taken[source] = seq + 1
                key, part = routes[i]
                sources.append(source)
                topics.append(pub.topic)
                seqs.append(seq)
                pubseqs.append(pub.publisher_seq)
                parts.append(part)
                records.append((key, value, part, _BatchRecord(batch, i)))
            refused = self._producer.produce_many(self.topic, records)
            nxt.update(taken)
        # Outside the lock: a refusal may finish the batch and run the caller's callback here.
        for delivery, error in refused:
            delivery.failed(error)
        return seqs

    def _append_failed(self, source: str, topic: str, seq: int, error: JournalUnavailable,
                       pubseq: int | None = None) -> None:
        log.warning("journal append failed", source=source, seq=seq, pubseq=pubseq,
                    error=str(error))
        if pubseq is not None:
            with self._book:
                st = self._durable.get(source)
                if st is None:
                    st = self._durable[source] = _SourceState()
                st.publisher_failed(pubseq)
                # Checkpoint it now rather than within the second: until it is durable, a
                # broker that dies takes a later resend of this pubseq for a duplicate.
                self._checkpoints.write_now(source)
        self._explain_failed(source, topic, seq, str(error), pubseq)

    def _finish(self, batch: _Batch) -> None:
        """Every record of `batch` has its outcome: book the durable ones, call back once."""
        results: list[Appended | JournalUnavailable] = []
        add = results.append
        errors = batch.errors
        booked: set[str] = set()
        n = 0  # records booked here (the flush rule counts deliveries)
        hw: dict[int, int] = {}
        at = batch.appended_at
        with self._book:
            durable, on_durable = self._durable, self._on_durable
            for i, (source, seq, part, off, pubseq) in enumerate(
                    zip(batch.sources, batch.seqs, batch.parts, batch.offsets, batch.pubseqs,
                        strict=True)):
                if off < 0:
                    add(errors[i])
                    continue
                pos = _tuple_new(Position, (part, off))
                add(_tuple_new(Appended, (source, seq, pos, at)))
                st = durable.get(source)
                # The common case inline: the newest record of the bucket already indexed.
                # A new source or bucket, and a report that comes after a later record's
                # (two threads serving reports: the poll thread and a flush()), take the
                # full path, which keeps the index at each bucket's lowest offset.
                if st is None or seq // SEQ_BUCKET != st.indexed_bucket or seq < st.seq \
                        or off < st.indexed_offset:
                    on_durable(source, seq, pos, pubseq)
                    continue
                if pubseq is not None:
                    st.publisher_durable(pubseq)
                st.seq = seq
                st.position = pos
                booked.add(source)
                n += 1
                if off > hw.get(part, -1):
                    hw[part] = off
            for part, off in hw.items():
                self._checkpoints.durable(part, off)
            self._checkpoints.changed_many(booked, n)
        try:
            batch.callback(results)
        except Exception:  # the caller's bug must not stop other delivery reports
            log.exception("append_many callback failed")

    def append_sync(self, pub: Publication, timeout_s: float = 60.0) -> Appended:
        done = threading.Event()
        out: list[Any] = []

        def cb(err: Exception | None, res: Appended | None) -> None:
            out.append(err or res)
            done.set()

        self.append(pub, cb)
        if not done.wait(timeout_s):
            raise JournalUnavailable("no answer from kafka in time")
        if isinstance(out[0], Exception):
            raise out[0]
        return out[0]  # type: ignore[no-any-return]

    def flush(self, timeout_s: float = 60.0) -> None:
        if self._producer.flush(timeout_s):
            raise JournalUnavailable("kafka did not take every queued record in time")

    def checkpoint(self, timeout_s: float = 60.0) -> None:
        """Write every source checkpoint and partition marker now (they are otherwise written
        within a second) and wait until Kafka holds them: the next recovery scans no tail."""
        self.flush(timeout_s)
        self._checkpoints.settle(timeout_s)

    # Runs under _book, on the poll thread (delivery callbacks) or inside a flush().
    def _on_durable(self, source: str, seq: int, pos: Position,
                    pubseq: int | None = None) -> None:
        st = self._durable.get(source)
        if st is None:
            st = self._durable[source] = _SourceState()
        if pubseq is not None:
            st.publisher_durable(pubseq)
        if seq >= st.seq:  # the position of the highest durable seq, whatever order reports
            st.seq, st.position = seq, pos  # come in
        # Each bucket's entry is the lowest offset of a record in it (read_source starts
        # there); the book keeps it so whatever order delivery reports come in.
        bucket = seq // SEQ_BUCKET
        lowest = self._checkpoints.index(source, bucket, pos.offset, self._encode, source, seq,
                                         pos)
        if bucket >= st.indexed_bucket:
            st.indexed_bucket, st.indexed_offset = bucket, lowest
        self._checkpoints.durable(pos.partition, pos.offset)
        self._checkpoints.changed(source)

    def _explain_failed(self, source: str, topic: str, seq: int, reason: str,
                        pubseq: int | None = None) -> None:
        self._checkpoints.hold(source)
        # The GAP names the failed publisher seq, so recovery knows a resend of it is no
        # duplicate (it adds the pubseq to the source's failed set).
        value = self._codec.encode(SCHEMA, gap_record(source, topic, seq, seq,
                                                      f"append failed: {reason}")
                                   | {"publisher_seq": pubseq})

        def done(err: Exception | None, pos: Position | None) -> None:
            with self._book:
                if err is not None or pos is None:
                    # Keep trying: until this is durable the partition marker stays put, so a
                    # restart rescans and explains the hole itself.
                    self._explain_failed(source, topic, seq, reason, pubseq)
                else:
                    self._on_durable(source, seq, pos)
                self._checkpoints.release(source)

        try:
            self._producer.produce(self.topic, source.encode(), value, done,
                                   partition=self.partition_for(source))
        except JournalUnavailable as exc:
            # The hold stays: no partition marker moves again in this process,
            # so the next start rescans this tail and writes the GAP itself.
            log.error("could not queue a GAP record; a restart will explain the hole",
                      source=source, seq=seq, error=str(exc))

    def _encode(self, source: str, seq: int, pos: Position, *, pubseq: int = 0,
                failed: Iterable[int] = ()) -> bytes:
        return self._codec.encode(CHECKPOINT_SCHEMA, {
            "source": source, "seq": seq, "partition": pos.partition, "offset": pos.offset,
            "updated_at": now_ms(), "publisher_seq": pubseq,
            "publisher_failed": sorted(failed),
        })

    def _encode_source(self, source: str) -> bytes | None:
        st = self._durable.get(source)
        if st is None or st.position is None:
            return None
        return self._encode(source, st.seq, st.position, pubseq=st.pubseq,
                            failed=st.pub_failed)

    def _encode_marker(self, partition: int, offset: int) -> bytes:
        return self._encode("", -1, Position(partition, offset))

    def _decode_marker(self, value: bytes) -> int:
        offset: int = self._codec.decode(value, expect=CHECKPOINT_SCHEMA)[1]["offset"]
        return offset

    def _load_source(self, source: str, value: bytes | None) -> None:
        if value is None:
            return
        _, cp = self._codec.decode(value, expect=CHECKPOINT_SCHEMA)
        st = self._durable.setdefault(source, _SourceState())
        if cp["seq"] >= st.seq:  # the later of two for one seq: a failure noted since
            st.seq, st.position = cp["seq"], Position(cp["partition"], cp["offset"])
            st.pubseq = max(st.pubseq, cp["publisher_seq"])
            st.pub_failed = set(cp["publisher_failed"])

    def _load_bucket(self, value: bytes) -> tuple[int, int]:
        _, cp = self._codec.decode(value, expect=CHECKPOINT_SCHEMA)
        return cp["offset"], to_ms(cp["updated_at"]) or 0

    # --- recovery -------------------------------------------------------------------------

    def recover(self) -> RecoveryReport:
        """Rebuild every source's position from Kafka; explain holes; ready for appends."""
        started = time.monotonic()
        report = RecoveryReport()
        book = self._checkpoints
        self._partitions = book.port.partitions()
        loaded: Loaded = book.load(self._load_source, bucket_at=self._load_bucket)
        for src in loaded.subs:
            buckets = book.buckets(src)
            if buckets:
                st = self._durable.setdefault(src, _SourceState())
                st.indexed_bucket = max(buckets)
                st.indexed_offset = buckets[st.indexed_bucket][0]
        holes: list[tuple[str, str, int, int]] = []
        # source -> (pubseqs of DATA, pubseqs of failed appends' GAPs) anywhere in the tail. A
        # GAP with a pubseq is in the tail only if no marker passed the failure, so the resend
        # that made it durable, if any, is in the tail too (before the GAP if the GAP was
        # retried): the tail alone says which failures are still open.
        tail_pubseqs: dict[str, tuple[set[int], set[int]]] = {}
        for part in range(self._partitions):
            for rec in book.tail(loaded, part):
                report.scanned += 1
                entry = self._decode_entry(rec.position, rec.value)
                st = self._durable.setdefault(entry.source, _SourceState())
                if entry.publisher_seq is not None:
                    seen = tail_pubseqs.setdefault(entry.source, (set(), set()))
                    seen[entry.kind is RecordKind.GAP].add(entry.publisher_seq)
                if entry.last_seq <= st.seq:
                    if entry.kind is RecordKind.DATA and st.position is not None \
                            and rec.position.offset > st.position.offset:
                        report.duplicates += 1
                        log.error("journal holds a duplicate seq", source=entry.source,
                                  seq=entry.source_seq, offset=rec.position.offset)
                    continue
                if entry.source_seq > st.seq + 1:
                    holes.append((entry.source, entry.topic, st.seq + 1, entry.source_seq - 1))
                st.seq, st.position = entry.last_seq, rec.position
                book.changed(entry.source)
                bucket = entry.source_seq // SEQ_BUCKET
                if bucket > st.indexed_bucket:  # the scan goes in offset order: first is lowest
                    st.indexed_bucket, st.indexed_offset = bucket, rec.position.offset
                    book.index(entry.source, bucket, rec.position.offset, self._encode,
                               entry.source, entry.source_seq, rec.position)
        for source, (durable, failed) in tail_pubseqs.items():
            st = self._durable[source]
            for pubseq in sorted(failed - durable):
                st.publisher_failed(pubseq)
            for pubseq in durable:
                st.publisher_durable(pubseq)
            book.changed(source)
        # GAP records explain holes that were only filled *after* the later seqs: scan order
        # saw the hole first, so drop holes a later GAP in the same tail already covers.
        holes = [h for h in holes if not self._gap_covered(h)]
        for source, topic, lo, hi in holes:
            value = self._codec.encode(SCHEMA, gap_record(
                source, topic, lo, hi, "never acknowledged: lost in flight when a broker died"))
            self._producer.produce_sync(self.topic, source.encode(), value,
                                        partition=self.partition_for(source))
            report.gaps_written.append((source, lo, hi))
            log.warning("journal hole explained", source=source, first=lo, last=hi)
        with self._lock:
            for src, st in self._durable.items():
                self._next[src] = st.seq + 1
        book.flush()
        if not book.wait(30):
            log.warning("journal checkpoints not durable after recovery; the next start"
                        " rescans further")
        report.sources = len(self._durable)
        report.seconds = time.monotonic() - started
        log.info("journal recovered", sources=report.sources, scanned=report.scanned,
                 gaps=len(report.gaps_written), seconds=round(report.seconds, 2))
        return report

    def _gap_covered(self, hole: tuple[str, str, int, int]) -> bool:
        source, _, lo, hi = hole
        return any(
            e.kind is RecordKind.GAP and e.source_seq <= lo and (e.gap_to or 0) >= hi
            for e in self.read_source(source, lo - 1, kinds=(RecordKind.GAP,))
        )

    # --- reads ----------------------------------------------------------------------------

    def _decode_entry(self, pos: Position, value: bytes | None) -> JournalEntry:
        if value is None:
            raise ApexpsError.for_code(501, f"empty journal record at {pos}")
        _, rec = self._codec.decode(value, expect=SCHEMA)
        return JournalEntry.from_avro(pos, rec)

    def next_seq(self, source: str) -> int:
        with self._lock:
            return self._next.get(source, 1)

    def last_durable_seq(self, source: str) -> int:
        """The highest seq of `source` Kafka has acknowledged, as DATA or GAP (0: none): every
        seq up to it is in the journal unless retention has deleted it."""
        with self._book:
            st = self._durable.get(source)
            return 0 if st is None else st.seq

    def publisher_position(self, source: str) -> PublisherPosition:
        """What of `source` is durable: its highest publisher seq, newest source seq and the
        publisher seqs that failed since (robust-binding §8). Appends in flight not counted."""
        with self._book:
            st = self._durable.get(source)
            if st is None:
                return PublisherPosition(0, 0, frozenset())
            return PublisherPosition(st.pubseq, st.seq, frozenset(st.pub_failed))

    def read_source(self, source: str, after_seq: int = 0, *,
                    kinds: tuple[RecordKind, ...] = (RecordKind.DATA, RecordKind.GAP),
                    ) -> Generator[JournalEntry, None, None]:
        """Every record of `source` with seqs above `after_seq`, in journal order (which is
        seq order for DATA; a GAP explaining an older hole may come after later seqs)."""
        part = self.partition_for(source)
        key = source.encode()
        want = (after_seq + 1) // SEQ_BUCKET
        start: int | None = None
        for bucket, (offset, _) in self._checkpoints.buckets(source).items():
            if bucket <= want and (start is None or offset > start):
                start = offset
        kept = None if self.recent is None or start is None else self.recent.scan(part, start)
        if kept is not None:
            entries, start = kept
            for entry in entries:
                if entry.source == source and entry.last_seq > after_seq and entry.kind in kinds:
                    yield entry
        for rec in read_partition(self.config, self.topic, part, start):
            if rec.key != key:
                continue
            entry = self._decode_entry(rec.position, rec.value)
            if entry.last_seq > after_seq and entry.kind in kinds:
                yield entry

    def read_from(self, positions: dict[int, int] | None = None, *, topic: str | None = None,
                  until_ms: int | None = None) -> Iterator[JournalEntry]:
        """Records from the given offset per partition (None: the beginning) to the current end,
        optionally only one APEX topic and only appended before `until_ms`."""
        for part in range(self._partitions):
            start = None if positions is None else positions.get(part)
            for rec in read_partition(self.config, self.topic, part, start):
                if until_ms is not None and rec.timestamp_ms >= until_ms:
                    break
                entry = self._decode_entry(rec.position, rec.value)
                if topic is None or entry.topic == topic:
                    yield entry

    def read_time(self, start_ms: int, end_ms: int | None = None, *,
                  topic: str | None = None) -> Iterator[JournalEntry]:
        """Records appended in [start_ms, end_ms)."""
        starts = {p: offset_for_time(self.config, self.topic, p, start_ms)
                  for p in range(self._partitions)}
        return self.read_from(starts, topic=topic, until_ms=end_ms)


def _call_back(callback: AppendCallback, err: Exception | None, res: Appended | None) -> None:
    try:
        callback(err, res)
    except Exception:  # the caller's bug must not stop other delivery reports
        log.exception("append callback failed")

