"""One checkpoint book: how a Kafka-backed log remembers where it stands, and finds it again.

Theory of operation
-------------------
The journal, the link log and the item store each keep a per-key state derived from a log of
their own in Kafka (a source's last seq, a link's newest record, an item's versions). Replaying
that whole log on every start would take as long as the log is old, so each writes checkpoints
to a compacted topic of one partition, and all three use the same three kinds of key:

- `KEY` → the key's state, as of some moment (the owner's schema; the book never decodes it);
- `KEY NUL n` → a sub-record of the key: for the journal and the link log the sparse index
  entry of bucket n (the lowest log offset of a record in it, so a read seeks instead of
  scanning the partition); for the item store one version of the item;
- `NUL partition NUL p` → the partition marker: every state checkpoint covers log partition p
  up to this offset.

A recovery loads the checkpoints, then reads each log partition from just after its marker to
the end: that tail is exactly what no checkpoint covers, and the owner folds it into the states
it loaded. So everything hangs on one ordering rule, which this module keeps and nothing else
does:

    States first, markers last; never a marker past a failed append.

*States first.* A flush is a *round*: it captures the dirty keys and the partition high-water
marks together (under the owner's lock, so no delivery report falls between them), writes the
states, and only once Kafka holds every one of them writes the markers. Producing them in
that order on one partition is not enough: Kafka may refuse one batch and take the next, and a
marker that outlived the state it vouches for would make a recovery skip the tail that state
was built from. An owner may need more phases (the item store writes versions, then the headers
naming them); each phase goes out once the one before is durable, the markers after the last.
A round that loses any record writes no marker and puts its keys back among the dirty ones.
One round at a time.

*Never a marker past a failed append.* The high-water mark only moves on a durable append
(`durable`). An append that failed and whose explanation is not yet durable (the journal's GAP
record) is a *hold* on its key: while any hold is open no marker moves, so a crash leaves the
hole in the tail, where recovery finds it and explains it itself. Nor is a held key's state
written: recovery finds a hole by comparing the tail with the loaded state, and a state that
already counts the seqs after the hole would hide it (tests/broker/test_checkpoints.py's
stateful model found that one).

*In steps.* A phase goes out `STEP` records at a time, each step encoding its records just
before it sends them, and where the port says so (`later`: the Kafka port, when the step would
run on the event loop that serves the delivery reports) the next step waits for the loop's next
turn. A round of 1,000 changed items is tens of ms of Python; in one piece on the loop it
stalled every connection that long, once a second (the slowest 1-3 % of
ops/bench/bench_gateway.py's Notifies). A step the loop has not run yet is the round's
`pending`; whoever waits for a round (`wait`, `settle`, maybe on a thread the loop waits for)
runs it itself, so a wait never depends on the loop turning.

When to flush is `FlushPolicy`'s rule: once something changed and either `every` changes piled
up or `interval_s` passed. Bucket entries are written as they are found (a read by bucket is
only ever slower without one: it starts at an earlier bucket); old ones are pruned, the newest
of each key always kept, by tombstones written with a round's states.

The book is pure but for its port (`CheckpointPort`: write a record, read the checkpoints back,
read a log partition's tail), whose Kafka implementation is
`broker.kafka_producer.KafkaCheckpoints`; tests drive it on an in-memory fake
(tests/broker/test_checkpoints.py).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from broker.flush import FlushPolicy
from broker.kafka_io import StoredRecord
from common.errors import JournalUnavailable

__all__ = [
    "MARKER_PREFIX",
    "CheckpointBook",
    "CheckpointPort",
    "Loaded",
    "Phase",
    "Round",
    "Write",
    "marker_key",
    "parse_key",
    "state_key",
    "sub_key",
]

log = structlog.get_logger(__name__)

MARKER_PREFIX = "\x00partition\x00"
#: Drop expired buckets at most this often.
PRUNE_INTERVAL_S = 60.0
#: Records a phase encodes and sends in one step (module docstring): 64 item versions are
#: about 1.5 ms of Python, a pause the loop's connections do not notice.
STEP = 64
#: How often a wait for a round looks for a step the loop has not run.
AWAIT_TICK_S = 0.05

#: One checkpoint record: key, value (None: a tombstone).
Write = tuple[bytes, bytes | None]
#: A round's phase: its records, or a function making them when the phase goes out.
Phase = list[Write] | Callable[[], Iterable[Write]]
#: Outcome of one write: None, or why Kafka does not hold it.
WriteDone = Callable[[Exception | None], None]


def state_key(key: str) -> bytes:
    return key.encode()


def sub_key(key: str, n: int) -> bytes:
    return f"{key}\x00{n}".encode()


def marker_key(partition: int) -> bytes:
    return f"{MARKER_PREFIX}{partition}".encode()


def parse_key(raw: bytes, parts: int = 1) -> tuple[str, int | None, int | None]:
    """(key, sub number, marker partition) of a checkpoint key whose state keys have `parts`
    NUL-separated parts (the item store's: topic NUL message-id): a marker has key "" and its
    partition; a sub-record its key and number; a state its key alone."""
    text = raw.decode()
    if text.startswith(MARKER_PREFIX):
        return "", None, int(text[len(MARKER_PREFIX):])
    if text.count("\x00") < parts:
        return text, None, None
    key, _, n = text.rpartition("\x00")
    return key, int(n), None


class CheckpointPort(Protocol):
    """Where the book's records go and come from (Kafka: broker.kafka_producer.KafkaCheckpoints)."""

    def write(self, key: bytes, value: bytes | None, done: WriteDone) -> None:
        """Queue one checkpoint record; `done` runs once with its outcome. Raises
        JournalUnavailable if it is refused outright (then `done` never runs)."""

    def later(self, step: Callable[[], None]) -> bool:
        """Queue `step` (a round's next step) for the event loop's next turn and say True,
        if the caller is that loop; False: the caller runs it now."""

    def read_checkpoints(self) -> Iterable[tuple[bytes, bytes | None]]:
        """Every checkpoint record the topic still holds, in the order written."""

    def partitions(self) -> int:
        """How many partitions the log has."""

    def read_tail(self, partition: int, start: int | None,
                  end: int | None = None) -> Iterable[StoredRecord]:
        """The log partition's records from `start` (None: its beginning) to `end` or its end."""


@dataclass
class Loaded:
    """What the checkpoint topic held: the partition markers and each key's newest sub-records
    (tombstoned ones gone). States went to the owner's `on_state` in the order written."""

    markers: dict[int, int] = field(default_factory=dict)
    subs: dict[str, dict[int, bytes]] = field(default_factory=dict)
    #: the highest sub number any record named, tombstones included (the item store's orders
    #: never repeat)
    top_sub: int = 0


@dataclass
class Round:
    """One flush in flight: its phases (the markers last), and what to restore should it fail."""

    number: int
    keys: set[str]
    phases: list[Phase]
    markers: dict[int, int]
    left: list[int] = field(default_factory=list)
    failed: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    #: the step queued on the loop and not yet run (0 or 1 of them): whoever pops it runs it
    pending: list[Callable[[], None]] = field(default_factory=list)


class CheckpointBook:
    """The key scheme, flush rule, write order, pruning and recovery read of one log's
    checkpoints; see the module docstring.

    Args:
        port: where the records go.
        encode_state: a dirty key's state record, or None if it has none to write (yet).
        encode_marker: the record of partition p's marker at an offset.
        decode_marker: the offset a marker record names.
        plan: the owner's phases for a round's dirty keys and number, if its states are more
            than one record each (default: one phase, `encode_state` of each key). A phase
            may be a function, called (without the lock) when the phase goes out; what it
            returns is read a step at a time (module docstring), so it may be a generator
            that encodes each record as it is read.
        extra: whether the owner has something to write though no key is dirty (the item
            store's due tombstones).
        key_parts: NUL-separated parts of a state key (see `parse_key`).
        lock: the owner's lock over what its delivery reports update: the round's capture
            takes it, so the states and the high-water marks it captures agree.
        policy: when a flush is due.
        retention_ms: buckets indexed longer ago are pruned (None: never).
        clock: epoch milliseconds.
        on_round: called with each round once it is over (failed or complete), under the lock
            and before another round can begin.
    """

    def __init__(self, port: CheckpointPort, *,
                 encode_state: Callable[[str], bytes | None],
                 encode_marker: Callable[[int, int], bytes],
                 decode_marker: Callable[[bytes], int],
                 plan: Callable[[set[str], int], list[Phase]] | None = None,
                 extra: Callable[[], bool] | None = None,
                 key_parts: int = 1,
                 lock: threading.RLock | None = None,
                 policy: FlushPolicy | None = None,
                 retention_ms: int | None = None,
                 clock: Callable[[], int] | None = None,
                 on_round: Callable[[Round], None] | None = None) -> None:
        self.port = port
        self._encode_state = encode_state
        self._encode_marker = encode_marker
        self._decode_marker = decode_marker
        self._plan = plan
        self._extra = extra
        self._parts = key_parts
        self.lock = lock if lock is not None else threading.RLock()
        self.policy = policy or FlushPolicy()
        self.retention_ms = retention_ms
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._on_round = on_round
        self._dirty: set[str] = set()
        self._hw: dict[int, int] = {}  # highest durable offset per log partition
        self._marked: dict[int, int] = {}  # what the durable markers say
        self._holds: dict[str, int] = {}  # key -> its failed appends not yet explained
        #: key -> bucket -> (lowest offset of a record in it, when it was indexed)
        self._buckets: dict[str, dict[int, tuple[int, int]]] = {}
        self._round: Round | None = None
        self._rounds = 0
        self._last_prune = time.monotonic()

    # --- what the owner tells the book (under its lock) ------------------------------------

    def changed(self, key: str, n: int = 1) -> None:
        """`key`'s state changed: it is written by the next round."""
        with self.lock:
            self._dirty.add(key)
            self.policy.changed(n)

    def changed_many(self, keys: Iterable[str], n: int) -> None:
        """`changed` for several keys at once (the journal's batch reports)."""
        with self.lock:
            self._dirty.update(keys)
            self.policy.changed(n)

    def durable(self, partition: int, offset: int) -> None:
        """A log record is durable at `offset`: markers may cover up to it."""
        with self.lock:
            if partition not in self._hw or offset > self._hw[partition]:
                self._hw[partition] = offset

    def hold(self, key: str) -> None:
        """An append of `key` failed and its explanation is not durable yet: no marker moves,
        and `key`'s state is not written (it would vouch for the seqs after the hole)."""
        with self.lock:
            self._holds[key] = self._holds.get(key, 0) + 1

    def release(self, key: str) -> None:
        """The explanation of one held failure of `key` is durable."""
        with self.lock:
            left = self._holds[key] - 1
            if left:
                self._holds[key] = left
            else:
                del self._holds[key]
                self.policy.changed()

    def index(self, key: str, bucket: int, offset: int, encode: Callable[..., bytes],
              *args: Any, at: int | None = None) -> int:
        """A record of `key` in `bucket` is at `offset`: if that is the lowest seen, remember it
        and write the bucket's entry (`encode(*args)`: a record per delivery calls this, so
        nothing is built unless it is written). Returns the bucket's lowest offset. Delivery
        reports can come out of order, so the first report of a bucket need not be its
        lowest. `at`: when the record was made (default: now); pruning goes by it."""
        with self.lock:
            buckets = self._buckets.setdefault(key, {})
            seen = buckets.get(bucket)
            if seen is not None and seen[0] <= offset:
                return seen[0]
            buckets[bucket] = (offset, self._clock() if at is None else at)
            self._send_one(sub_key(key, bucket), encode(*args))
        return offset

    def buckets(self, key: str) -> dict[int, tuple[int, int]]:
        with self.lock:
            return dict(self._buckets.get(key, {}))

    def forget(self, key: str) -> None:
        """Drop what the book knows of `key`'s index (the next durable record rebuilds it)."""
        with self.lock:
            self._buckets.pop(key, None)

    def write_now(self, key: str) -> None:
        """Write `key`'s state at once, outside a round (the journal's failed publisher seqs:
        a restart must not wait a second to know of them), unless it is held. It moves no
        marker."""
        with self.lock:
            if key in self._holds:
                return
        value = self._encode_state(key)
        if value is not None:
            self._send_one(state_key(key), value)

    # --- rounds -----------------------------------------------------------------------------

    def maybe_flush(self) -> None:
        """The producer's after-poll hook: a round if one is due."""
        if self.policy.due():
            self.flush()

    def flush(self) -> Round | None:
        """Begin a round now (unless one is in flight or there is nothing to write)."""
        with self.lock:
            if self._round is not None:
                return None
            keys = self._dirty - self._holds.keys()
            self._dirty -= keys
            markers = {} if self._holds else {
                p: o for p, o in self._hw.items() if self._marked.get(p) != o}
            pruned = self._prune()
            self.policy.flushed()
            if not keys and not markers and not pruned \
                    and (self._extra is None or not self._extra()):
                return None
            number = self._rounds + 1
            phases: list[Phase]
            if self._plan is not None:
                phases = self._plan(keys, number)
            else:
                phases = [[(state_key(k), v) for k in sorted(keys)
                           if (v := self._encode_state(k)) is not None]]
            if pruned:
                phases.insert(0, pruned)
            self._rounds = number
            round_ = self._round = Round(number, keys, [p for p in phases if p], markers)
            if markers:
                round_.phases.append([(marker_key(p), self._encode_marker(p, o))
                                      for p, o in sorted(markers.items())])
        self._next_phase(round_)
        return round_

    def wait(self, timeout_s: float) -> bool:
        """Wait for the round in flight, if any; False if it did not end in time or failed."""
        round_ = self._round
        if round_ is None:
            return True
        return self._await(round_, time.monotonic() + timeout_s) and not round_.failed

    def settle(self, timeout_s: float = 30.0) -> None:
        """Write everything there is now and wait until Kafka holds it (or raise)."""
        deadline = time.monotonic() + timeout_s
        while True:
            busy = self._round
            if busy is not None:  # it may predate the call: wait, then write our own
                if not self._await(busy, deadline):
                    raise JournalUnavailable("checkpoints not durable in time")
                continue
            round_ = self.flush()
            if round_ is None:
                if self._round is None:
                    return
                continue
            if not self._await(round_, deadline):
                raise JournalUnavailable("checkpoints not durable in time")
            if round_.failed:
                raise JournalUnavailable("a checkpoint write failed; its keys stay dirty")
            with self.lock:
                if not self._dirty and (self._holds or all(
                        self._marked.get(p) == o for p, o in self._hw.items())):
                    return

    def _await(self, round_: Round, deadline: float) -> bool:
        """Wait for `round_` to end, running its pending step meanwhile: the loop it was
        queued on may be the very thread that waits, or one that waits for this one."""
        while not round_.done.wait(min(AWAIT_TICK_S, max(0.0, deadline - time.monotonic()))):
            self._run_pending(round_)
            if time.monotonic() >= deadline:
                return round_.done.is_set()
        return True

    def _next_phase(self, round_: Round) -> None:
        if round_.failed or not round_.phases:
            self._end(round_)
            return
        phase = round_.phases.pop(0)
        writes: Iterable[Write]
        if callable(phase):
            try:
                writes = phase()
            except Exception as exc:  # never expected: what the owner held encodes again
                log.error("checkpoint could not be encoded", error=str(exc))
                round_.failed = True
                self._end(round_)
                return
        else:
            writes = phase
        # A token per record sent, and one at the bottom for the sending itself: the last
        # token popped is the bottom one, once every record is sent and has its outcome.
        round_.left = [0]
        self._step(round_, iter(writes))

    def _step(self, round_: Round, writes: Iterator[Write]) -> None:
        """Encode and send the phase's next `STEP` records; the rest at the loop's next turn."""
        try:
            batch = list(itertools.islice(writes, STEP))
        except Exception as exc:  # never expected: what the owner held encodes again
            log.error("checkpoint could not be encoded", error=str(exc))
            round_.failed = True
            batch = []
        done = functools.partial(self._written, round_)
        for key, value in batch:
            round_.left.append(1)
            try:
                self.port.write(key, value, done)
            except JournalUnavailable as exc:
                self._written(round_, exc)
        if len(batch) == STEP and not round_.failed:
            self._then(round_, functools.partial(self._step, round_, writes))
        else:
            self._written(round_, None)

    def _then(self, round_: Round, step: Callable[[], None]) -> None:
        round_.pending.append(step)
        if not self.port.later(functools.partial(self._run_pending, round_)):
            self._run_pending(round_)

    @staticmethod
    def _run_pending(round_: Round) -> None:
        try:
            step = round_.pending.pop()  # atomic: the loop and a waiter may both try
        except IndexError:
            return
        step()

    def _written(self, round_: Round, err: Exception | None) -> None:
        if err is not None:
            if not round_.failed:
                log.warning("checkpoint write failed; its keys stay dirty", error=str(err))
            round_.failed = True
        if not round_.left.pop():  # list.pop is atomic: reports may come on two threads
            self._then(round_, functools.partial(self._next_phase, round_))

    def _end(self, round_: Round) -> None:
        with self.lock:
            if round_.failed:
                self._dirty |= round_.keys
                self.policy.changed(len(round_.keys) or 1)
            else:
                self._marked.update(round_.markers)
            if self._on_round is not None:  # before the next round can begin
                self._on_round(round_)
            self._round = None
        round_.done.set()

    def _send_one(self, key: bytes, value: bytes | None) -> None:
        try:
            self.port.write(key, value, _ignore)
        except JournalUnavailable as exc:
            _ignore(exc)

    def _prune(self) -> list[Write]:
        """Tombstones of buckets indexed before the retention window, each key's newest kept
        (lock held)."""
        if self.retention_ms is None or time.monotonic() - self._last_prune < PRUNE_INTERVAL_S:
            return []
        self._last_prune = time.monotonic()
        cutoff = self._clock() - self.retention_ms
        out: list[Write] = []
        for key, buckets in self._buckets.items():
            newest = max(buckets, default=None)
            for bucket, (_, at) in list(buckets.items()):
                if bucket != newest and at < cutoff:
                    del buckets[bucket]
                    out.append((sub_key(key, bucket), None))
        return out

    # --- recovery ---------------------------------------------------------------------------

    def load(self, on_state: Callable[[str, bytes | None], None], *,
             bucket_at: Callable[[bytes], tuple[int, int]] | None = None) -> Loaded:
        """Read the checkpoint topic: markers, sub-records, and each state record handed to
        `on_state(key, value)` in the order written (None: a tombstone). With `bucket_at` (a
        sub-record's offset and when it was indexed) the sub-records are the sparse index and
        the book keeps it."""
        loaded = Loaded()
        for raw, value in self.port.read_checkpoints():
            key, n, partition = parse_key(raw, self._parts)
            if partition is not None:
                if value is not None:
                    loaded.markers[partition] = self._decode_marker(value)
            elif n is not None:
                loaded.top_sub = max(loaded.top_sub, n)
                if value is None:
                    loaded.subs.get(key, {}).pop(n, None)
                else:
                    loaded.subs.setdefault(key, {})[n] = value
            else:
                on_state(key, value)
        with self.lock:
            self._marked = dict(loaded.markers)
            if bucket_at is not None:
                for key, subs in loaded.subs.items():
                    self._buckets[key] = {n: bucket_at(v) for n, v in subs.items()}
        return loaded

    def tail(self, loaded: Loaded, partition: int,
             end: int | None = None) -> Iterator[StoredRecord]:
        """The records of log `partition` no checkpoint covers: from just after its marker.
        Each one counts as durable (a marker may cover it once its state is written)."""
        marker = loaded.markers.get(partition)
        for rec in self.port.read_tail(partition, None if marker is None else marker + 1, end):
            self.durable(partition, rec.position.offset)
            yield rec


def _ignore(err: Exception | None) -> None:
    if err is not None:
        log.warning("checkpoint write failed; recovery will rescan further", error=str(err))
