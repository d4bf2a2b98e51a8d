"""Data items: the state XEP-0040's publish types build from a topic's messages, durable in Kafka.

Theory of operation
-------------------
Items. A message published with a message-id acts on the data item (topic, message-id)
(docs/robust-binding.md §2.3, §9): `image` and `add` replace the item (the deltas before them no
longer matter), `update` and `correction` add a delta on top of the current image, `drop`
deletes the item. An update to an item that has no image yet is kept as a delta all the same:
a late joiner is better served with the deltas than with nothing. A message without a
message-id belongs to the topic's stream, not to any item. `reduce(state, version)` is that rule
and nothing else (tests/robust/test_items.py checks it against a model with hypothesis).

Revisions and the cache (content-based draft §5.2.1, §5.8 `cached`). The cached messages of a
topic are this same state, not a second store: a cached message is a message-id's latest
revision, and "the latest message per (topic, message-id), rebuilt from Kafka, served with no
gap and no duplicate against the live stream" is exactly what the item state already is for
images. A second store would need its own checkpoints and recovery and its own meeting point
with the live stream, and two stores could disagree about one message-id. So a message with a
revision-id acts as an image of its item (whatever its publish type; a drop still deletes) when
its revision is strictly higher than the item's image's, and changes nothing otherwise: a lower
or equal revision after a higher one is ignored (broker/expiry.py `supersedes`). A message
whose expiration-date is `0` never enters the state. Expiry is applied when the state is read
(`snapshot(..., now=...)`, `unexpired`): an item whose image has expired is not cached or
snapshotted, nor is an expired delta; expired items stay in memory until they are replaced,
dropped or their topic is deleted (a known cost: publishers that use expiring message-ids
should reuse them). Message-ids are keyed per topic, not per publisher (the draft scopes them
per publisher and topic): two publishers using one message-id on one topic share the item.

Where state advances. `apply(entries)` runs on the live path with what the journal follower
read back, in the order the follower hands it to the fan-out, just before the fan-out: the
state at any moment is exactly the state of what has been forwarded. A snapshot taken in the
same event-loop step in which a subscription becomes visible to the fan-out therefore meets
the live stream with no gap and no duplicate (adapters/pubsub/handler.py does that step).

Order. Every applied version takes the next *order*, a store-wide counter that never repeats,
also across restarts. `snapshot` lists versions by it, which is apply order: per item the image
before its deltas, per source rising source seqs.

Durability (the compacted `NS.items`, one partition, written only by the process that called
`recover`: the broker):
- `TOPIC NUL MESSAGEID` → the item's header: the orders of its versions, whether it was
  dropped, and `covers`, per journal partition the last offset applied when it was written;
- `TOPIC NUL MESSAGEID NUL ORDER` → one version: the journal record as the journal holds it, and
  where it is there. Versions are immutable and written once, so an update costs one record of
  its own size plus a small header, however many deltas the item holds, and no record is ever
  larger than the journal's own;
- `NUL partition NUL p` → every header covers journal partition p up to this offset.
A checkpoint (on the thread that serves the producer's reports, every second or after 1000
applied messages; one at a time) captures under the lock which items changed and the positions
applied, then writes in three phases, each once Kafka holds the one before: the new versions,
the headers naming them, the markers. (Kafka may refuse one batch and take the next; a header
whose versions were refused would make a recovery skip what it could not hold.) Keys that no
longer matter (a replaced image and its deltas, a dropped item's header) are tombstoned one
checkpoint later, once a marker covering the change is durable: until then a recovery may still
need them. A failed checkpoint leaves its items dirty and writes no marker. The key scheme
(headers are the checkpoint book's states, versions its sub-records), the rounds and their phase
order, the flush rule and the recovery read are broker/checkpoints.py's; the store plans each
round's versions and headers and undoes what a failed round assumed.

Recovery (`recover`, by the broker at start, before its journal follower). Load the compacted
topic, rebuild every item from its header and versions, then replay the journal from just after
each marker to its end, merged across partitions by journal time as the follower would have
delivered it. A record an item's header already covers (offset ≤ covers[partition]) is skipped,
so nothing is applied twice, and nothing the journal holds is lost to a kill -9. The follower
then starts exactly where the replay ended (`resume_positions`).

Topics. A deleted topic's items go with it (`forget_topic`, on the live path after the
deletion). A deletion is not in the journal, so a recovery is told which topics exist and since
when (`recover(created)`) and drops versions of deleted topics and of earlier incarnations of
re-created ones.

Known limit: across journal partitions the live order is whatever the follower's polls return,
and a replay can only approximate it by journal time. Within a source (one partition) the two
agree exactly; an item that two sources updated within a poll of each other, in the tail a
recovery replays (about the last second before a crash), may end up with their two messages in
the other order. Items with one publisher, the usual case, are exact.

Bounds (`ItemLimits`). The store never drops a journaled version: a snapshot that silently
lost deltas would hand a late joiner the wrong state. It holds the image plus *all* deltas
since, so publishers must send images: `check_publish` refuses (553) an update or correction to
an item that already holds `max_deltas` deltas or whose image and deltas would exceed
`max_bytes`, and an image larger than `max_bytes`. The check reads the applied state, so an item
can overshoot by what was accepted but not yet forwarded when it reached the cap (milliseconds
of traffic); the store keeps that overshoot too. Nothing bounds the number of items but the
publishers, as for the journal itself: the store holds every live item's state in memory.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import structlog

from broker.checkpoints import CheckpointBook, Loaded, Phase, Round, Write, state_key, sub_key
from broker.codec import Codec, default_codec
from broker.flush import FlushPolicy
from broker.journal import SCHEMA as JOURNAL_SCHEMA
from broker.kafka_io import KafkaConfig, Position, watermarks
from broker.kafka_producer import KafkaCheckpoints, KafkaProducer
from broker.records import JournalEntry, PublishType, RecordKind, now_ms
from broker.robust._item_rules import (
    DELTAS,
    REPLACES,
    ItemKey,
    ItemState,
    ItemVersion,
    reduce,
    unexpired,
)
from common.errors import ApexpsError, InvalidParameter

__all__ = [
    "DEFAULT_MAX_DELTAS",
    "DEFAULT_MAX_ITEM_BYTES",
    "ItemLimits",
    "ItemRecoveryReport",
    "ItemState",
    "ItemStore",
    "ItemVersion",
    "reduce",
    "unexpired",
]

log = structlog.get_logger(__name__)

#: Deltas an item may hold since its image before updates are refused (553: send an image). A
#: snapshot sends them all, and a busy quote takes thousands of updates between images.
DEFAULT_MAX_DELTAS = 10_000
#: Content octets (image and deltas) an item may hold: what one snapshot of it may cost.
DEFAULT_MAX_ITEM_BYTES = 16 * 1024 * 1024
#: Checkpoint at least this often, or after this many applied messages.
CHECKPOINT_INTERVAL_S = 1.0
CHECKPOINT_EVERY = 1000

HEADER_SCHEMA = "item_header"
VERSION_SCHEMA = "item_version"
MARKER_SCHEMA = "item_marker"




@dataclass(frozen=True, slots=True)
class ItemLimits:
    """max_deltas: deltas an item may hold since its image; max_bytes: content octets of its
    image and deltas together (see the module docstring: past them updates are refused)."""

    max_deltas: int = DEFAULT_MAX_DELTAS
    max_bytes: int = DEFAULT_MAX_ITEM_BYTES


@dataclass
class ItemRecoveryReport:
    items: int = 0
    #: journal records read after the markers, and how many of them changed an item
    scanned: int = 0
    replayed: int = 0
    #: versions a header names that the topic no longer holds (never expected; logged)
    missing: int = 0
    seconds: float = 0.0


def _joined(key: ItemKey) -> str:
    """The checkpoint book's key of an item (its header's key)."""
    return f"{key[0]}\x00{key[1]}"


def _split(key: str) -> ItemKey:
    topic, _, mid = key.partition("\x00")
    return (topic, mid)


def _header_key(key: ItemKey) -> bytes:
    return state_key(_joined(key))


def _version_key(key: ItemKey, order: int) -> bytes:
    return sub_key(_joined(key), order)


def _journal_avro(e: JournalEntry) -> dict[str, Any]:
    return {
        "kind": e.kind.value, "topic": e.topic, "source": e.source, "source_seq": e.source_seq,
        "publisher_seq": e.publisher_seq, "gap_to": e.gap_to, "gap_reason": e.gap_reason,
        "publish_type": str(e.publish_type), "message_id": e.message_id,
        "revision_id": e.revision_id, "publication_date": e.publication_date,
        "expiration_date": e.expiration_date, "permission_token": e.permission_token,
        "content_type": e.content_type, "content": e.content, "fields": e.fields,
        "options": e.options, "appended_at": e.appended_at,
    }


@dataclass
class _Garbage:
    """A key to tombstone once checkpoint `after` is complete; `order` None: the header."""

    after: int
    key: ItemKey
    order: int | None


@dataclass
class _Undo:
    """What to restore should round `number` fail."""

    #: item -> the versions its durable header named before the round (None: no header)
    previous: dict[ItemKey, tuple[int, ...] | None]
    collected: list[_Garbage]


class ItemStore:
    """The current state of every data item; see the module docstring.

    Args:
        limits: what `check_publish` allows (see `ItemLimits`).
        clock: epoch milliseconds, for the records' `updated_at`.
    """

    def __init__(self, config: KafkaConfig, producer: KafkaProducer, codec: Codec | None = None,
                 *, limits: ItemLimits | None = None,
                 clock: Callable[[], int] = now_ms) -> None:
        self.config = config
        self.topic = config.topic("items")
        self.journal_topic = config.topic("journal")
        self.limits = limits or ItemLimits()
        self._producer = producer
        self._codec = codec or default_codec()
        self._clock = clock
        # Guards everything below and the checkpoint book; apply and snapshot take it on the
        # event loop, a checkpoint on the poll thread, only long enough to capture references.
        self._lock = threading.RLock()
        self._items: dict[str, dict[str, ItemState]] = {}
        #: journal partition -> last offset applied
        self._applied: dict[int, int] = {}
        self._partitions = 0
        self._order = 0
        #: item -> the orders its newest written header names
        self._stored: dict[ItemKey, tuple[int, ...]] = {}
        self._garbage: list[_Garbage] = []
        self._complete = 0  # the newest checkpoint whose markers are durable
        self._undo: dict[int, _Undo] = {}
        self._loaded_order = 0  # the highest order the markers name (recovery)
        self._enabled = False  # only the broker that recovered the store writes it
        self._resume: dict[int, int] = {}
        # The headers are the book's states, the versions its sub-records; the markers cover
        # the journal positions applied (broker/checkpoints.py).
        self._book = CheckpointBook(
            KafkaCheckpoints(config, producer, self.topic, self.journal_topic),
            encode_state=lambda _: None, encode_marker=self._encode_marker,
            decode_marker=self._decode_marker, plan=self._plan, extra=self._garbage_due,
            key_parts=2, lock=self._lock,
            policy=FlushPolicy(CHECKPOINT_EVERY, CHECKPOINT_INTERVAL_S), clock=clock,
            on_round=self._round_over)
        producer.add_after_poll(self._maybe_checkpoint)

    # --- the live path (event loop) -------------------------------------------------------

    def unapplied(self, entries: Sequence[JournalEntry]) -> Sequence[JournalEntry]:
        """Those of `entries` that `apply` would not skip: above what was applied already in
        their partition (after a restart, recovery applied the journal's tail without the
        live path, and the follower may hand it over again)."""
        with self._lock:
            applied = self._applied
            if all(e.position.offset > applied.get(e.position.partition, -1) for e in entries):
                return entries
            return [e for e in entries
                    if e.position.offset > applied.get(e.position.partition, -1)]

    def apply(self, entries: Iterable[JournalEntry]) -> None:
        """Advance the state by `entries`, in the order given (what the fan-out forwards).
        An entry at or below what was applied already in its partition is skipped: after a
        restart the follower may start before where recovery ended (broker/robust/fanout.py)."""
        with self._lock:
            applied = self._applied
            moved: set[int] = set()
            for entry in entries:
                pos = entry.position
                if pos.offset <= applied.get(pos.partition, -1):
                    continue
                applied[pos.partition] = pos.offset
                moved.add(pos.partition)
                mid = entry.message_id
                if mid is not None and entry.kind is RecordKind.DATA:
                    self._apply_one(entry, mid)
            for part in moved:
                self._book.durable(part, applied[part])

    def _apply_one(self, entry: JournalEntry, mid: str) -> None:
        if "\x00" in mid:  # cannot be keyed; the codecs never let one through
            return
        by_id = self._items.get(entry.topic)
        state = None if by_id is None else by_id.get(mid)
        self._order += 1
        new = reduce(state, ItemVersion(self._order, entry))
        if new is state:
            return
        if new is not None:
            self._items.setdefault(entry.topic, {})[mid] = new
        elif by_id is not None and by_id.pop(mid, None) is not None and not by_id:
            del self._items[entry.topic]
        self._book.changed(f"{entry.topic}\x00{mid}")

    def forget_topic(self, topic: str) -> int:
        """The topic was deleted: its items go with it (returns how many)."""
        with self._lock:
            gone = self._items.pop(topic, {})
            self._book.changed_many((f"{topic}\x00{mid}" for mid in gone), len(gone))
        return len(gone)

    def snapshot(self, topic: str, message_id: str | None = None, *,
                 now: int | None = None) -> list[JournalEntry]:
        """Every image and delta of `topic`'s items (or of one item), in apply order; with
        `now`, only what has not expired by then (`unexpired`): the cached messages."""
        with self._lock:
            by_id = self._items.get(topic, {})
            states = list(by_id.values()) if message_id is None else [
                s for s in (by_id.get(message_id),) if s is not None]
            versions = [v for s in states
                        for v in (s.versions if now is None else unexpired(s, now))]
        versions.sort(key=attrgetter("order"))
        return [v.entry for v in versions]

    def get(self, topic: str, message_id: str) -> ItemState | None:
        with self._lock:
            return self._items.get(topic, {}).get(message_id)

    def states(self) -> dict[ItemKey, ItemState]:
        """Every item now (for tests and tools)."""
        with self._lock:
            return {s.key: s for by_id in self._items.values() for s in by_id.values()}

    def check_publish(self, topic: str, message_id: str, publish_type: PublishType,
                      size: int) -> None:
        """553 if a message of `size` octets would take its item past the limits (see the
        module docstring): the publisher should send an image."""
        lim = self.limits
        if publish_type in REPLACES:
            if size > lim.max_bytes:
                raise InvalidParameter(f"an image of {size} octets exceeds the {lim.max_bytes}"
                                       " an item may hold")
            return
        if publish_type not in DELTAS:
            return
        state = self._items.get(topic, {}).get(message_id)
        if state is None:
            return
        if len(state.deltas) >= lim.max_deltas or state.size + size > lim.max_bytes:
            raise InvalidParameter(
                f"item {message_id!r} of {topic!r} holds {len(state.deltas)} deltas"
                f" ({state.size} octets) since its image; the limit is {lim.max_deltas}"
                f" deltas or {lim.max_bytes} octets: publish an image")

    def resume_positions(self) -> dict[int, int]:
        """Per journal partition the offset the follower starts at: where `recover` ended."""
        return dict(self._resume)

    # --- checkpoints (poll thread) --------------------------------------------------------

    def _maybe_checkpoint(self) -> None:
        if self._enabled:
            self._book.maybe_flush()

    def checkpoint(self, timeout_s: float = 30.0) -> None:
        """Write everything applied so far and wait until Kafka holds it (close, tests)."""
        if self._enabled:
            self._book.settle(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """A last checkpoint, then no more: the producer is about to close."""
        try:
            self.checkpoint(timeout_s)
        finally:
            with self._lock:
                self._enabled = False

    def _garbage_due(self) -> bool:
        return any(g.after <= self._complete for g in self._garbage)

    def _plan(self, keys: set[str], number: int) -> list[Phase]:
        """Round `number`'s phases for the items `keys` (under the lock, as the book calls it:
        references only; the records are encoded when their phase goes out). A header only
        once every version it names is durable (Kafka may refuse one batch and take the next):
        a header whose covers skip a message it could not hold loses it. Tombstones go first:
        a header written after the tombstone of its own key stands."""
        ready = [g for g in self._garbage if g.after <= self._complete]
        self._garbage = [g for g in self._garbage if g.after > self._complete]
        # A dropped item's header key is in use again once the item lives again.
        collected = [g for g in ready if g.order is not None
                     or g.key[1] not in self._items.get(g.key[0], {})]
        covers = [self._applied.get(p, -1) for p in range(self._partitions)]
        undo = self._undo[number] = _Undo({}, collected)
        #: (item, its state (None: dropped), the versions to write, the orders it names)
        plan: list[tuple[ItemKey, ItemState | None, list[ItemVersion], tuple[int, ...]]] = []
        for key in map(_split, keys):
            state = self._items.get(key[0], {}).get(key[1])
            stored = self._stored.get(key)
            undo.previous[key] = stored
            if state is None:
                if stored is None:
                    continue  # born and dropped between two checkpoints: nothing written
                del self._stored[key]
                self._garbage.append(_Garbage(number, key, None))
                self._garbage.extend(_Garbage(number, key, o) for o in stored)
                plan.append((key, None, [], ()))
                continue
            orders = tuple(v.order for v in state.versions)
            had = set(stored or ())
            self._garbage.extend(_Garbage(number, key, o) for o in had - set(orders))
            self._stored[key] = orders
            plan.append((key, state, [v for v in state.versions if v.order not in had], orders))
        now = self._clock()

        # Generators: the book reads a phase a step at a time and each record is encoded as
        # it is read, so a round of many items never holds the event loop in one piece.
        def versions() -> Iterator[Write]:
            for g in collected:
                yield (_header_key(g.key) if g.order is None
                       else _version_key(g.key, g.order), None)
            for key, _, new, _ in plan:
                for v in new:
                    yield _version_key(key, v.order), self._version(key, v)

        def headers() -> Iterator[Write]:
            for key, state, _, orders in plan:
                yield _header_key(key), self._header(key, orders, state is None, covers, now)

        return [versions, headers]

    def _round_over(self, round_: Round) -> None:
        """Book the outcome of a round (lock held): complete, or undo what it assumed."""
        undo = self._undo.pop(round_.number)
        if not round_.failed:
            self._complete = round_.number
            return
        for key, stored in undo.previous.items():
            if stored is None:
                self._stored.pop(key, None)
            else:
                self._stored[key] = stored
        # Tombstones that were due stay due; this round's garbage waits for the next.
        self._garbage.extend(_Garbage(0, g.key, g.order) for g in undo.collected)
        for g in self._garbage:
            if g.after == round_.number:
                g.after = round_.number + 1

    def _encode_marker(self, partition: int, offset: int) -> bytes:
        return self._codec.encode(MARKER_SCHEMA, {
            "partition": partition, "offset": offset, "order": self._order,
            "updated_at": self._clock()})

    def _decode_marker(self, value: bytes) -> int:
        _, m = self._codec.decode(value, expect=MARKER_SCHEMA)
        self._loaded_order = max(self._loaded_order, m["order"])
        offset: int = m["offset"]
        return offset

    def _header(self, key: ItemKey, orders: tuple[int, ...], dropped: bool, covers: list[int],
                now: int) -> bytes:
        return self._codec.encode(HEADER_SCHEMA, {
            "topic": key[0], "message_id": key[1], "dropped": dropped,
            "versions": list(orders), "covers": covers, "updated_at": now})

    def _version(self, key: ItemKey, version: ItemVersion) -> bytes:
        entry = version.entry
        return self._codec.encode(VERSION_SCHEMA, {
            "topic": key[0], "message_id": key[1], "order": version.order,
            "journal_partition": entry.position.partition,
            "journal_offset": entry.position.offset,
            "record": self._codec.encode(JOURNAL_SCHEMA, _journal_avro(entry))})

    # --- recovery -------------------------------------------------------------------------

    def recover(self, created: Callable[[str], int | None] | None = None,
                ) -> ItemRecoveryReport:
        """Rebuild every item (see the module docstring); from then on this store writes its
        checkpoints. Call before the journal follower starts, from `resume_positions`.

        `created(topic)`: when the topic was created, None if it does not exist. Versions of a
        deleted topic, or published before the topic was created again, belong to no item
        (a deletion is not in the journal: `forget_topic` may not have been checkpointed)."""
        started = time.monotonic()
        report = ItemRecoveryReport()
        headers: dict[ItemKey, dict[str, Any]] = {}

        def on_header(key: str, value: bytes | None) -> None:
            if value is None:
                headers.pop(_split(key), None)
            else:
                headers[_split(key)] = self._codec.decode(value, expect=HEADER_SCHEMA)[1]

        book = self._book
        loaded: Loaded = book.load(on_header)
        versions = {_split(k): v for k, v in loaded.subs.items()}
        top = max(loaded.top_sub, self._loaded_order)
        covers: dict[ItemKey, list[int]] = {}
        with self._lock:
            for key, header in headers.items():
                covers[key] = header["covers"]
                have = versions.pop(key, {})
                state: ItemState | None = None
                if header["dropped"]:
                    self._garbage.append(_Garbage(1, key, None))
                else:
                    for order in header["versions"]:
                        raw = have.pop(order, None)
                        if raw is None:
                            report.missing += 1
                            log.error("item version missing from the items topic", topic=key[0],
                                      message_id=key[1], order=order)
                            continue
                        state = reduce(state, ItemVersion(order, self._decode_version(raw)))
                    if state is not None:
                        self._items.setdefault(key[0], {})[key[1]] = state
                        self._stored[key] = tuple(header["versions"])
                self._garbage.extend(_Garbage(1, key, o) for o in have)
            if created is not None:
                self._forget_stale(created)
            for key, left in versions.items():  # written by a checkpoint that never finished
                self._garbage.extend(_Garbage(1, key, o) for o in left)
            self._order = top
            self._partitions = book.port.partitions()
            ends = {p: watermarks(self.config, self.journal_topic, p)[1]
                    for p in range(self._partitions)}
            tails = [self._journal_tail(loaded, p, ends[p]) for p in range(self._partitions)]
            for entry in heapq.merge(*tails, key=attrgetter("appended_at")):
                report.scanned += 1
                mid = entry.message_id
                if mid is None or entry.kind is not RecordKind.DATA:
                    continue
                born = 0 if created is None else created(entry.topic)
                if born is None or born > entry.appended_at:
                    continue  # a deleted topic's, or an earlier incarnation's
                done = covers.get((entry.topic, mid))
                pos = entry.position
                if done is not None and pos.partition < len(done) \
                        and pos.offset <= done[pos.partition]:
                    continue
                self._apply_one(entry, mid)
                report.replayed += 1
            for p, end in ends.items():
                self._applied[p] = max(self._applied.get(p, -1), end - 1)
                book.durable(p, self._applied[p])
            self._resume = ends
            self._enabled = True
            report.items = sum(len(by_id) for by_id in self._items.values())
        report.seconds = time.monotonic() - started
        log.info("items recovered", items=report.items, scanned=report.scanned,
                 replayed=report.replayed, missing=report.missing,
                 seconds=round(report.seconds, 2))
        return report

    def _forget_stale(self, created: Callable[[str], int | None]) -> None:
        """Drop the loaded items of deleted topics and of earlier incarnations (lock held)."""
        for topic, by_id in list(self._items.items()):
            born = created(topic)
            for mid, state in list(by_id.items()):
                first = state.versions[0].entry.appended_at
                if born is None or first < born:
                    del by_id[mid]
                    self._book.changed(f"{topic}\x00{mid}")
            if not by_id:
                del self._items[topic]

    def _decode_version(self, raw: bytes) -> JournalEntry:
        _, v = self._codec.decode(raw, expect=VERSION_SCHEMA)
        _, rec = self._codec.decode(v["record"], expect=JOURNAL_SCHEMA)
        return JournalEntry.from_avro(Position(v["journal_partition"], v["journal_offset"]), rec)

    def _journal_tail(self, loaded: Loaded, partition: int, end: int,
                      ) -> Iterator[JournalEntry]:
        for rec in self._book.tail(loaded, partition, end):
            if rec.value is None:
                continue
            try:
                _, value = self._codec.decode(rec.value, expect=JOURNAL_SCHEMA)
            except ApexpsError as exc:
                log.error("undecodable journal record skipped", position=str(rec.position),
                          error=str(exc))
                continue
            yield JournalEntry.from_avro(rec.position, value)
