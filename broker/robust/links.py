"""The link log: what every link seq carried, durable in Kafka, so a range can be refilled exactly.

Theory of operation
-------------------
Records. A link is an ordered stream of records, one per link seq: DATA (journal coordinates,
source and source seq of the message it carried), HEARTBEAT, or RESET (link seq 0; a new epoch
begins). Each record also has an *ordinal*: its position on the link since the link began, +1 per
record, never wrapping and never reset. Link seqs wrap and restart; ordinals do not, so they are
what the log indexes and compares, and the link seq is derived from the ordinal, the ordinal of
the epoch's reset (`epoch_start`) and the resolution. A link's first record is always a RESET
(epoch 0); `append_many` inserts one itself for a new link, after a record of the link failed to
become durable (its seq can never be refilled, so the link must not pretend otherwise), and for
a link recovered at another resolution than the log's.

Appends. All of a link's records go to one partition of `NS.links` (crc32 of the link id),
through the broker's one idempotent acks=all producer, so within a partition a link's ordinals
rise with the offsets. They travel packed: the records of one `append_many` that share a
partition go in one Kafka record (a `link_batch`, up to `PACK_RECORDS`), keyed by the link id
when they are all of one link. A fan-out turn puts one record on each of its subscribers' links;
one Kafka record per partition instead of one per subscriber is what keeps the link log's cost
per delivery small (a produce, a delivery report and Kafka's handling of it, per pack). A pack is
durable or fails as a whole; its records share its offset. `append_many` assigns seqs under a
lock in the order given and returns the records at once; its callback runs once, when every
record is durable or failed.
The fan-out should send an item to its subscriber only when the callback says it is durable: a
seq the subscriber saw must be one a restarted broker can refill and will not hand out again.

Checkpoints (the compacted `NS.linkindex` topic, one partition, the journal's `sources` pattern):
- key `LINK` → the link's last durable record (ordinal, epoch, epoch start, resolution, owner);
- key `LINK NUL bucket` → the lowest offset of a Kafka record holding one with an ordinal in
  [bucket·1024, (bucket+1)·1024): a sparse index, so `read_range` seeks instead of scanning the
  partition from its start;
- key `NUL partition NUL p` → every link's checkpoint covers partition p up to this offset.
Delivery reports book each record as it becomes durable (they arrive in offset order per
partition). The key scheme, the flush (on the producer's poll thread, every second or 1000
deliveries: the dirty link checkpoints, then the partition markers once Kafka holds them), the
pruning of index buckets past the retention window and the recovery read are the checkpoint
book's (broker/checkpoints.py); the link log owns its state and schema.

Recovery (`recover`, on every start). Load the checkpoints, then scan each links partition from
just after its marker to the end; per link the last durable record is the highest ordinal seen,
and appends continue after it (the next link seq follows the last durable one: a record that was
in flight at a kill -9 and never became durable is simply assigned again). The log's *writer* is
a new generation, its recovery time: should a dead process's last produce land after recovery
scanned the tail (the journal's known limit, which a transactional producer would fence), two
records share an ordinal and `read_range` keeps the newer writer's.

Reads (`read_range`). Translate the link seq range to ordinals from the link's newest durable
record (ranges are validated by `LinkSeqSpace.check_range`: 553 for a bad range, 570 beyond the
maximum gap), seek to the bucket's offset and collect that link's records. The range must lie in
the current epoch, within the link retention window (`retention_ms`, by each record's time;
Kafka deletes later, on its own schedule) and be complete; otherwise 569, link context gone.

What is elsewhere: the values the log speaks (`LinkItem`, `LinkRecord`, `LinkHead`:
`link_records.py`), the record writer (`_link_writer.py`), the seq arithmetic (`linkseq.py`) and
the checkpoints (`broker/checkpoints.py`). What stays here (appends, the durable bookkeeping,
recovery and range reads) works on the same per-link heads and index under the same two locks.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import structlog

from broker.checkpoints import CheckpointBook, Loaded
from broker.codec import Codec, default_codec
from broker.kafka_io import KafkaConfig, Position, offset_for_time, partition_count, read_partition
from broker.kafka_producer import Delivery, KafkaCheckpoints, KafkaProducer
from broker.records import now_ms, to_ms
from broker.robust._link_writer import BATCH_SCHEMA, SCHEMA, LinkRecordWriter
from broker.robust.config import DEFAULT_MAX_GAP
from broker.robust.link_records import LinkHead, LinkItem, LinkKind, LinkRecord, space_for
from broker.robust.linkid import validate_link_id
from broker.robust.linkseq import DEFAULT_BITS, LinkSeqSpace
from common.errors import (
    BadGapRange,
    InvalidParameter,
    JournalUnavailable,
    LinkContextGone,
    NotYourLink,
    RecordSchemaError,
)

__all__ = ["LINK_BUCKET", "LinkBatchCallback", "LinkLog", "LinkRecoveryReport"]

log = structlog.get_logger(__name__)

#: Ordinals per sparse-index entry: a read scans at most this many of the link's records
#: before the first one it wants.
LINK_BUCKET = 1024

CHECKPOINT_SCHEMA = "link_checkpoint"
#: Most link records one Kafka record packs: a worst-case record (a 1,024-character link id, long
#: source and owner) is a few KB, so a pack stays well inside Kafka's 1 MB message limit.
PACK_RECORDS = 128

_RESET = LinkKind.RESET


@dataclass
class LinkRecoveryReport:
    links: int = 0
    scanned: int = 0
    seconds: float = 0.0
    writer: int = 0


class _Head(NamedTuple):
    """A link's newest *assigned* record: what the next append follows (one per assignment,
    so a tuple rather than a `_State`)."""

    ordinal: int
    epoch: int
    epoch_start: int
    bits: int
    owner: str | None

    def head(self, link: str) -> LinkHead:
        return LinkHead(link, self.epoch, space_for(self.bits).add(0, self.ordinal
                                                                 - self.epoch_start),
                        self.ordinal, self.epoch_start, self.bits, self.owner)


@dataclass(slots=True)
class _State:
    """A link's newest durable record (its index is the checkpoint book's)."""

    ordinal: int
    epoch: int
    epoch_start: int
    bits: int
    owner: str | None
    position: Position | None = None
    writer: int = 0

    def head(self, link: str) -> LinkHead:
        return LinkHead(link, self.epoch, space_for(self.bits).add(0, self.ordinal
                                                                 - self.epoch_start),
                        self.ordinal, self.epoch_start, self.bits, self.owner)


#: One outcome per record `append_many` returned, in the same order.
LinkBatchCallback = Callable[[list["LinkRecord | JournalUnavailable"]], None]


class _Batch:
    """One `append_many` in flight; see broker/journal.py `_Batch` for the token counting (one
    token per Kafka record, which packs several link records)."""

    __slots__ = ("callback", "left", "log", "outcomes")

    def __init__(self, log_: LinkLog, records: list[LinkRecord], packs: int,
                 callback: LinkBatchCallback) -> None:
        self.log = log_
        self.callback = callback
        self.outcomes: list[LinkRecord | JournalUnavailable] = list(records)
        self.left = list(range(packs))

    def done(self) -> None:
        if not self.left.pop():
            try:
                self.callback(self.outcomes)
            except Exception:  # the caller's bug must not stop other delivery reports
                log.exception("link append callback failed")


class _Pack(Delivery):
    """One Kafka record of the links topic: the link records at `indices` of its batch."""

    __slots__ = ("batch", "indices")

    def __init__(self, batch: _Batch, indices: list[int]) -> None:
        self.batch = batch
        self.indices = indices

    def delivered(self, partition: int, offset: int) -> None:
        batch = self.batch
        outcomes = batch.outcomes
        batch.log._on_durable([r for i in self.indices
                               if isinstance(r := outcomes[i], LinkRecord)],
                              Position(partition, offset))
        batch.done()

    def failed(self, error: JournalUnavailable) -> None:
        batch = self.batch
        for i in self.indices:
            record = batch.outcomes[i]
            if isinstance(record, LinkRecord):
                batch.log._on_failed(record, error)
            batch.outcomes[i] = error
        batch.done()


class LinkLog:
    """What each link seq carried, in `NS.links`; see the module docstring.

    Args:
        bits: link seq resolution for new epochs (16, 32 or 64).
        max_gap: most link seqs one `read_range` may return (more: 570).
        retention_ms: the link retention window (default: the config's `link_retention_ms`).
        clock: epoch milliseconds (tests move it).
    """

    def __init__(self, config: KafkaConfig, producer: KafkaProducer, codec: Codec | None = None,
                 *, bits: int = DEFAULT_BITS, max_gap: int = DEFAULT_MAX_GAP,
                 retention_ms: int | None = None, clock: Callable[[], int] = now_ms) -> None:
        self.config = config
        self.topic = config.topic("links")
        self.index_topic = config.topic("linkindex")
        self.space = LinkSeqSpace(bits)
        self.max_gap = max_gap
        self.retention_ms = config.link_retention_ms if retention_ms is None else retention_ms
        self._clock = clock
        self._producer = producer
        self._codec = codec or default_codec()
        self._record_writer = LinkRecordWriter(self._codec)
        # _lock: assignment and produce order. _book: what delivery reports update (poll
        # thread, or any thread inside flush()); never take _lock under _book.
        self._lock = threading.Lock()
        self._book = threading.RLock()
        self._claims = threading.Lock()  # one claim at a time: check, then append
        self._heads: dict[str, _Head] = {}
        self._durable: dict[str, _State] = {}
        #: links whose next append must begin a new epoch. Delivery reports add to it without
        #: _lock (set.add is atomic under the GIL; append_many may be waiting for queue space
        #: that only those reports free).
        self._broken: set[str] = set()
        # The link checkpoints, the ordinal index and the partition markers
        # (broker/checkpoints.py); index buckets older than the retention window are pruned.
        self._checkpoints = CheckpointBook(
            KafkaCheckpoints(config, producer, self.index_topic, self.topic),
            encode_state=self._encode_link, encode_marker=self._encode_marker,
            decode_marker=self._decode_marker, lock=self._book,
            retention_ms=self.retention_ms, clock=clock)
        self._partitions = 0
        self._writer = 0
        #: the newest writer the log held at recovery (the last generation that wrote)
        self.last_writer = 0
        self._loaded_writer = 0  # the highest writer the checkpoints name (recovery)
        producer.add_after_poll(self._checkpoints.maybe_flush)

    # --- appends --------------------------------------------------------------------------

    def partition_for(self, link: str) -> int:
        return zlib.crc32(link.encode()) % self._partitions

    def append_many(self, items: Sequence[LinkItem], callback: LinkBatchCallback,
                    ) -> list[LinkRecord]:
        """Give each item the next seq on its link, in the order given; queue them all.

        Returns the records at once — more than `items` when a link needs a RESET first (a new
        link, or one whose earlier record failed), so the caller sends those resets too.
        `callback` runs once, when every returned record is durable or has failed, with one
        entry per returned record: the record, or the `JournalUnavailable` saying why not. An
        empty batch calls back at once. Invalid items raise (553) before anything is assigned.
        """
        if not self._partitions:
            raise JournalUnavailable("the link log has not been recovered yet")
        for i, item in enumerate(items):
            try:
                item.check()
            except InvalidParameter as exc:
                exc.add_note(f"link item {i} of the batch")
                raise
        if not items:
            callback([])
            return []
        records: list[LinkRecord] = []
        append = records.append
        with self._lock:
            at = self._clock()
            heads: dict[str, _Head] = {}  # this batch's new heads, committed once produced
            known, broken, bits_now, writer = self._heads, self._broken, self.space.bits, \
                self._writer
            for item in items:
                link, kind = item.link, item.kind
                head = heads.get(link) or known.get(link)
                if kind is _RESET:
                    broken.discard(link)
                    heads[link] = self._reset_record(records, link, item.owner, head, at)
                    continue
                if head is None or link in broken or head.bits != bits_now:
                    head = self._reset_record(records, link, None, head, at)
                    broken.discard(link)
                # the next seq of the epoch (LinkSeqSpace.add inlined: once per delivery)
                ordinal, epoch, start, bits = head.ordinal + 1, head.epoch, head.epoch_start, \
                    head.bits
                append(LinkRecord(link, ordinal, epoch, start, bits,
                                  (ordinal - start - 1) % ((1 << bits) - 1) + 1, kind,
                                  item.position, item.source, item.source_seq, None, writer,
                                  at, item.snapshot))
                heads[link] = _Head(ordinal, epoch, start, bits, head.owner)
            refused = self._produce(records, callback)
            self._heads.update(heads)
        for delivery, error in refused:  # outside the lock: this may run the callback
            delivery.failed(error)
        return records

    def _produce(self, records: list[LinkRecord], callback: LinkBatchCallback,
                 ) -> list[tuple[Delivery, JournalUnavailable]]:
        """Queue `records` packed: per partition, in their order, up to `PACK_RECORDS` to one
        Kafka record (under `_lock`: the produce order is the assignment order)."""
        by_part: dict[int, list[int]] = {}
        if self._partitions == 1:  # the default: no link needs hashing
            by_part[0] = list(range(len(records)))
        else:
            for i, r in enumerate(records):
                part = self.partition_for(r.link)
                indices = by_part.get(part)
                if indices is None:
                    by_part[part] = [i]
                else:
                    indices.append(i)
        chunks = [(part, indices[k:k + PACK_RECORDS]) for part, indices in by_part.items()
                  for k in range(0, len(indices), PACK_RECORDS)]
        batch = _Batch(self, records, len(chunks), callback)
        encode = self._record_writer.encode_many
        queued: list[tuple[bytes | None, bytes, int, Delivery]] = []
        for part, indices in chunks:
            pack = [records[i] for i in indices]
            link = pack[0].link
            # One link's pack keeps the link as its key, so a read of another link skips it
            # without decoding; a mixed pack has none and is decoded.
            key = link.encode() if all(r.link == link for r in pack) else None
            queued.append((key, encode(pack), part, _Pack(batch, indices)))
        return self._producer.produce_many(self.topic, queued)

    def _reset_record(self, out: list[LinkRecord], link: str, owner: str | None,
                      head: _Head | None, at: int) -> _Head:
        """Append to `out` the RESET that begins `link`'s next epoch (its first: epoch 0);
        the link's new head. `owner`: who claims the link (None: it keeps its owner)."""
        bits = self.space.bits
        if head is None:
            ordinal = epoch = 0
            keeps = owner
        else:
            ordinal, epoch = head.ordinal + 1, head.epoch + 1
            keeps = owner or head.owner
        out.append(LinkRecord(link, ordinal, epoch, ordinal, bits, 0, _RESET, None, None, None,
                              owner, self._writer, at, False))
        return _Head(ordinal, epoch, ordinal, bits, keeps)

    @property
    def writer(self) -> int:
        """This process's writer generation (its recovery time)."""
        return self._writer

    def begin_new_epochs(self) -> int:
        """Every known link begins a new epoch with its next append (a reset first): after a
        start that does not follow a clean stop, records a subscriber saw may be lost, and
        their seqs must not be handed to other messages (broker/robust/fanout.py). How many
        links."""
        with self._lock:
            self._broken.update(self._heads)
            return len(self._heads)

    def append_sync(self, items: Sequence[LinkItem], timeout_s: float = 60.0,
                    ) -> list[LinkRecord]:
        """`append_many` and wait; raises the first failure."""
        done = threading.Event()
        out: list[list[LinkRecord | JournalUnavailable]] = []

        def cb(outcomes: list[LinkRecord | JournalUnavailable]) -> None:
            out.append(outcomes)
            done.set()

        self.append_many(items, cb)
        if not done.wait(timeout_s):
            raise JournalUnavailable("no answer from kafka in time")
        for outcome in out[0]:
            if isinstance(outcome, JournalUnavailable):
                raise outcome
        return [r for r in out[0] if isinstance(r, LinkRecord)]

    def claim(self, link: str, owner: str) -> LinkRecord | None:
        """Make `owner` the owner of `link` (on subscribe): a new link begins with its epoch-0
        reset, durable when this returns; a link `owner` already has is left alone (None);
        537 if another owns it. An existing link nobody owns is claimed by a reset that begins
        a new epoch, since ownership travels on resets."""
        validate_link_id(link)
        with self._claims:
            with self._lock:
                head = self._heads.get(link)
            if head is not None:
                if head.owner is not None and head.owner != owner:
                    raise NotYourLink(f"link {link!r} belongs to another subscriber")
                if head.owner == owner:
                    return None
            return self.append_sync([LinkItem.reset(link, owner)])[0]

    def check_owner(self, link: str, requester: str) -> None:
        """537 unless `requester` may ask for `link`'s ranges (its owner, or nobody owns it)."""
        with self._lock:
            head = self._heads.get(link)
        if head is not None and head.owner is not None and head.owner != requester:
            raise NotYourLink(f"link {link!r} belongs to another subscriber")

    # --- what is where --------------------------------------------------------------------

    def head(self, link: str) -> LinkHead | None:
        """The link's newest *assigned* record (what the next append follows)."""
        with self._lock:
            st = self._heads.get(link)
        return None if st is None else st.head(link)

    def last(self, link: str) -> LinkHead | None:
        """The link's newest *durable* record; after recovery the next seq follows it."""
        with self._book:
            st = self._durable.get(link)
            return None if st is None else st.head(link)

    def links(self) -> list[str]:
        with self._lock:
            return list(self._heads)

    # --- delivery bookkeeping (poll thread or inside flush) --------------------------------

    def _on_durable(self, records: list[LinkRecord], pos: Position) -> None:
        """Book `records`, all in the Kafka record at `pos`."""
        with self._book:
            durable = self._durable
            for record in records:
                st = durable.get(record.link)
                if st is None:
                    st = durable[record.link] = _State(
                        record.ordinal, record.epoch, record.epoch_start, record.bits,
                        record.owner)
                self._book_record(st, record, pos)
            self._checkpoints.durable(pos.partition, pos.offset)
            self._checkpoints.changed_many({r.link for r in records}, len(records))

    def _book_record(self, st: _State, record: LinkRecord, pos: Position) -> None:
        if record.ordinal >= st.ordinal:
            st.ordinal, st.epoch, st.epoch_start = record.ordinal, record.epoch, record.epoch_start
            st.bits, st.position, st.writer = record.bits, pos, record.writer
            if record.kind is LinkKind.RESET and record.owner is not None:
                st.owner = record.owner
        self._checkpoints.index(record.link, record.ordinal // LINK_BUCKET, pos.offset,
                                self._encode, record.link, st, pos, at=record.recorded_at)

    def _on_failed(self, record: LinkRecord, error: JournalUnavailable) -> None:
        log.warning("link record failed; the link begins a new epoch", link=record.link,
                    ordinal=record.ordinal, error=str(error))
        self._broken.add(record.link)

    def _encode(self, link: str, st: _State, pos: Position) -> bytes:
        return self._codec.encode(CHECKPOINT_SCHEMA, {
            "link": link, "ordinal": st.ordinal, "epoch": st.epoch,
            "epoch_start": st.epoch_start, "bits": st.bits, "owner": st.owner,
            "partition": pos.partition, "offset": pos.offset, "writer": st.writer,
            "updated_at": self._clock(),
        })

    def _encode_link(self, link: str) -> bytes | None:
        st = self._durable.get(link)
        if st is None or st.position is None:
            return None
        return self._encode(link, st, st.position)

    def _encode_marker(self, partition: int, offset: int) -> bytes:
        return self._encode("", _MARKER, Position(partition, offset))

    def _decode_marker(self, value: bytes) -> int:
        offset: int = self._codec.decode(value, expect=CHECKPOINT_SCHEMA)[1]["offset"]
        return offset

    def _load_link(self, link: str, value: bytes | None) -> None:
        if value is None:
            return
        _, cp = self._codec.decode(value, expect=CHECKPOINT_SCHEMA)
        st = self._durable.get(link)
        if st is None:
            st = self._durable[link] = _State(cp["ordinal"], cp["epoch"], cp["epoch_start"],
                                              cp["bits"], cp["owner"])
        if cp["ordinal"] >= st.ordinal:
            st.ordinal, st.epoch, st.epoch_start = cp["ordinal"], cp["epoch"], cp["epoch_start"]
            st.bits, st.owner, st.writer = cp["bits"], cp["owner"], cp["writer"]
            st.position = Position(cp["partition"], cp["offset"])
        self._loaded_writer = max(self._loaded_writer, cp["writer"])

    def _load_bucket(self, value: bytes) -> tuple[int, int]:
        _, cp = self._codec.decode(value, expect=CHECKPOINT_SCHEMA)
        self._loaded_writer = max(self._loaded_writer, cp["writer"])
        return cp["offset"], to_ms(cp["updated_at"]) or 0

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued record has its outcome, then write the checkpoints and wait
        until Kafka holds them."""
        if self._producer.flush(timeout_s):
            raise JournalUnavailable("kafka did not take every queued link record in time")
        self._checkpoints.settle(timeout_s)

    # --- recovery -------------------------------------------------------------------------

    def recover(self) -> LinkRecoveryReport:
        """Rebuild every link's newest durable record from Kafka; ready for appends."""
        started = time.monotonic()
        report = LinkRecoveryReport()
        book = self._checkpoints
        self._partitions = book.port.partitions()
        self._loaded_writer = 0
        with self._book:
            loaded: Loaded = book.load(self._load_link, bucket_at=self._load_bucket)
            writer = self._loaded_writer
            for part in range(self._partitions):
                for rec in book.tail(loaded, part):
                    report.scanned += 1
                    if rec.value is None:
                        continue
                    for record in self._decode(rec.value):
                        st = self._durable.get(record.link)
                        if st is None:
                            st = self._durable[record.link] = _State(
                                record.ordinal, record.epoch, record.epoch_start, record.bits,
                                record.owner)
                        self._book_record(st, record, rec.position)
                        book.changed(record.link)
                        writer = max(writer, record.writer)
            self.last_writer = writer
            self._writer = max(self._clock(), writer + 1)
            with self._lock:
                for link, st in self._durable.items():
                    self._heads[link] = _Head(st.ordinal, st.epoch, st.epoch_start, st.bits,
                                              st.owner)
                    if st.bits != self.space.bits:
                        self._broken.add(link)
        book.flush()
        if not book.wait(30):
            log.warning("link checkpoints not durable after recovery; the next start rescans"
                        " further")
        report.links = len(self._durable)
        report.writer = self._writer
        report.seconds = time.monotonic() - started
        log.info("link log recovered", links=report.links, scanned=report.scanned,
                 seconds=round(report.seconds, 2))
        return report

    # --- reads ----------------------------------------------------------------------------

    def carried_since(self, since_ms: int) -> set[tuple[str, Position]]:
        """(link, journal position) of every DATA record Kafka timestamped at or after
        `since_ms`: what a restarted fan-out must not put on its link again
        (broker/robust/fanout.py)."""
        out: set[tuple[str, Position]] = set()
        for part in range(partition_count(self.config, self.topic)):
            start = offset_for_time(self.config, self.topic, part, since_ms)
            for rec in read_partition(self.config, self.topic, part, start):
                if rec.value is None:
                    continue
                for record in self._decode(rec.value):
                    if record.kind is LinkKind.DATA and record.position is not None:
                        out.add((record.link, record.position))
        return out

    def _decode(self, value: bytes) -> list[LinkRecord]:
        return [LinkRecord.from_avro(r) for r in self._decode_avro(value)]

    def _decode_avro(self, value: bytes) -> list[dict[str, Any]]:
        """The link records (Avro values) of one Kafka record: a link_batch, or one link_record
        (what apexps wrote before link records were packed)."""
        name, rec = self._codec.decode(value)
        if name == BATCH_SCHEMA:
            records: list[dict[str, Any]] = rec["records"]
            return records
        if name == SCHEMA:
            return [rec]
        raise RecordSchemaError(f"expected a {BATCH_SCHEMA} or {SCHEMA} record, found {name}")

    def read_range(self, link: str, lo: int, hi: int | None = None, *,
                   epoch: int | None = None) -> list[LinkRecord]:
        """The records of link seqs `lo..hi` (inclusive, forward through the wrap; `hi` None:
        through the newest durable one), in link order.

        Raises:
            BadGapRange: 553, a bad range (see `LinkSeqSpace.check_range`), or seqs the link
                has not carried yet (or more than half the space ago: indistinguishable).
            RebuildRefused: 570, more than `max_gap` seqs.
            LinkContextGone: 569, the link is unknown, `epoch` is not its current epoch, or
                part of the range lies before the epoch's reset, past the retention window, or
                was never durable.
        """
        validate_link_id(link)
        with self._book:
            st = self._durable.get(link)
            head = None if st is None else st.head(link)
        if head is None:
            raise LinkContextGone(f"link {link!r} is unknown here: never used, or its records"
                                  " have expired; repair by source")
        if epoch is not None and epoch != head.epoch:
            raise LinkContextGone(f"epoch {epoch} of link {link!r} is over; the link is at epoch"
                                  f" {head.epoch}; repair by source")
        space = LinkSeqSpace(head.bits)
        first = space.check(lo, "linkfrom")
        if hi is None:
            if first == space.next(head.link_seq):
                return []  # nothing after the newest: a returning subscriber missed nothing
            hi = head.link_seq
        if head.link_seq == 0:
            raise BadGapRange(f"link {link!r} has carried nothing since its reset began epoch"
                              f" {head.epoch}")
        count = space.check_range(first, hi, self.max_gap)
        behind = space.distance(hi, head.link_seq)
        if behind < 0:
            raise BadGapRange(f"link seq {hi} is not among the link seqs link {link!r} has"
                              f" carried in epoch {head.epoch} (the newest is {head.link_seq})")
        b = head.ordinal - behind
        a = b - count + 1
        if a <= head.epoch_start:
            raise LinkContextGone(f"link seqs {first}..{hi} reach back before the reset that"
                                  f" began epoch {head.epoch}; repair by source")
        records = self._scan(link, a, b)
        cutoff = self._clock() - self.retention_ms
        if len(records) != count or records[0].recorded_at < cutoff:
            raise LinkContextGone(f"link seqs {first}..{hi} of link {link!r} are past the link"
                                  " retention window; repair by source")
        return records

    def _scan(self, link: str, a: int, b: int) -> list[LinkRecord]:
        """The link's records with ordinals a..b, newest writer first for a shared ordinal."""
        key = link.encode()
        buckets = self._checkpoints.buckets(link)
        want = a // LINK_BUCKET
        start = None
        best = -1
        for bucket, (offset, _) in buckets.items():
            if best < bucket <= want:
                best, start = bucket, offset
        found: dict[int, LinkRecord] = {}
        count = b - a + 1
        for rec in read_partition(self.config, self.topic, self.partition_for(link), start):
            if rec.value is None or (rec.key is not None and rec.key != key):
                continue  # a tombstone, or another link's pack
            past = False
            for value in self._decode_avro(rec.value):
                if value["link"] != link:
                    continue  # a pack's record of another link: not worth a LinkRecord
                ordinal = value["ordinal"]
                if a <= ordinal <= b:
                    old = found.get(ordinal)
                    if old is None or value["writer"] > old.writer:
                        found[ordinal] = LinkRecord.from_avro(value)
                elif ordinal > b and len(found) == count:
                    past = True
                    break
            if past:
                break
        return [found[o] for o in range(a, b + 1) if o in found]


#: The checkpoint fields a partition marker leaves unused.
_MARKER = _State(-1, -1, -1, 16, None)


