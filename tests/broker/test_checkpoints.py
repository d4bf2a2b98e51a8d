"""The checkpoint book (broker/checkpoints.py) on an in-memory "Kafka": its ordering rule (states
first, markers last; never a marker past a failed append), the recovery read, pruning, and a
stateful model of appends, outcomes, flushes and crashes whose recovery must equal the truth."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker import checkpoints
from broker.checkpoints import (
    CheckpointBook,
    marker_key,
    parse_key,
    state_key,
    sub_key,
)
from broker.kafka_io import Position, StoredRecord
from common.errors import JournalUnavailable

BUCKET = 4  # seqs per index bucket: small, so the model crosses buckets


@dataclass
class FakeKafka:
    """The checkpoint topic and a partitioned data log. Records are in flight until the test
    resolves them, first in first out per partition, as an idempotent producer keeps order;
    a crash loses what is in flight."""

    partitions: int = 2
    book: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    book_flight: list[tuple[bytes, bytes | None, Callable[[Exception | None], None]]] = \
        field(default_factory=list)
    logs: dict[int, list[tuple[bytes, bytes]]] = field(default_factory=dict)
    log_flight: dict[int, list[tuple[bytes, bytes, Callable[[Position | None], None]]]] = \
        field(default_factory=dict)

    #: set by each write; `auto`: writes are durable at once
    wrote: threading.Event = field(default_factory=threading.Event)
    auto: bool = False

    # the port
    def write(self, key: bytes, value: bytes | None,
              done: Callable[[Exception | None], None]) -> None:
        if self.auto:
            self.book.append((key, value))
            done(None)
            return
        self.book_flight.append((key, value, done))
        self.wrote.set()

    def later(self, step: Callable[[], None]) -> bool:
        return False

    def read_checkpoints(self) -> list[tuple[bytes, bytes | None]]:
        return list(self.book)

    def read_tail(self, partition: int, start: int | None,
                  end: int | None = None) -> Iterator[StoredRecord]:
        records = self.logs.get(partition, [])
        stop = len(records) if end is None else min(end, len(records))
        for offset in range(start or 0, stop):
            key, value = records[offset]
            yield StoredRecord(Position(partition, offset), key, value, 0)

    # the test's side
    def resolve_book(self, ok: bool = True) -> None:
        key, value, done = self.book_flight.pop(0)
        if ok:
            self.book.append((key, value))
            done(None)
        else:
            done(JournalUnavailable("refused"))

    def settle_book(self) -> None:
        while self.book_flight:
            self.resolve_book()

    def produce(self, partition: int, key: bytes, value: bytes,
                done: Callable[[Position | None], None]) -> None:
        self.log_flight.setdefault(partition, []).append((key, value, done))

    def resolve_log(self, partition: int, ok: bool) -> None:
        key, value, done = self.log_flight[partition].pop(0)
        if not ok:
            done(None)
            return
        records = self.logs.setdefault(partition, [])
        records.append((key, value))
        done(Position(partition, len(records) - 1))

    def crash(self) -> None:
        self.book_flight.clear()
        self.log_flight.clear()


def _book(kafka: FakeKafka, states: dict[str, int], **kwargs: object) -> CheckpointBook:
    return CheckpointBook(
        kafka, encode_state=lambda k: str(states[k]).encode() if k in states else None,
        encode_marker=lambda p, o: str(o).encode(), decode_marker=int,
        **kwargs)  # type: ignore[arg-type]


def _kinds(writes: list[tuple[bytes, bytes | None, object]]) -> list[str]:
    out = []
    for key, value, _ in writes:
        _, n, partition = parse_key(key)
        out.append("marker" if partition is not None else "sub" if n is not None
                   else "state" if value is not None else "tombstone")
    return out


def test_keys_keep_todays_scheme() -> None:
    """State, sub-record and marker keys are what the journal, the link log and the item store
    wrote before the book, and parse back."""
    assert state_key("fred@example.com") == b"fred@example.com"
    assert sub_key("fred@example.com", 3) == b"fred@example.com\x003"
    assert marker_key(7) == b"\x00partition\x007"
    assert parse_key(b"fred@example.com") == ("fred@example.com", None, None)
    assert parse_key(b"fred@example.com\x003") == ("fred@example.com", 3, None)
    assert parse_key(b"\x00partition\x007") == ("", None, 7)
    # the item store's keys have two parts; a message-id of digits is no sub number
    assert parse_key(b"topic\x0042", 2) == ("topic\x0042", None, None)
    assert parse_key(b"topic\x0042\x005", 2) == ("topic\x0042", 5, None)


def test_states_go_out_first_and_markers_only_once_kafka_holds_them() -> None:
    """A round writes the dirty states; the markers follow only when every state is durable."""
    kafka, states = FakeKafka(), {"a": 1, "b": 2}
    book = _book(kafka, states)
    book.changed("a")
    book.changed("b")
    book.durable(0, 5)
    book.durable(1, 9)
    assert book.flush() is not None
    assert _kinds(kafka.book_flight) == ["state", "state"]
    kafka.resolve_book()
    assert _kinds(kafka.book_flight) == ["state"]  # no marker while one state is out
    kafka.resolve_book()
    assert _kinds(kafka.book_flight) == ["marker", "marker"]
    kafka.settle_book()
    assert book.wait(0)
    assert book.flush() is None  # nothing new: nothing written


@dataclass
class TurningKafka(FakeKafka):
    """A FakeKafka whose book runs on an event loop that the test turns: `later` queues the
    book's next step for the loop's next turn, as the Kafka port does on the loop's thread."""

    turns: list[Callable[[], None]] = field(default_factory=list)

    def later(self, step: Callable[[], None]) -> bool:
        self.turns.append(step)
        return True

    def turn(self) -> None:
        for step in self.turns[:]:
            self.turns.remove(step)
            step()


def _stepped_book(kafka: FakeKafka, keys: list[str], encoded: list[str]) -> CheckpointBook:
    """A book whose one phase is a generator that notes each record as it encodes it."""

    def plan(dirty: set[str], _number: int) -> list[checkpoints.Phase]:
        def phase() -> Iterator[tuple[bytes, bytes]]:
            for key in sorted(dirty):
                encoded.append(key)
                yield state_key(key), key.encode()
        return [phase]

    book = CheckpointBook(kafka, encode_state=lambda _: None,
                          encode_marker=lambda p, o: str(o).encode(), decode_marker=int,
                          plan=plan)
    for key in keys:
        book.changed(key)
    book.durable(0, 5)
    return book


def test_a_large_phase_goes_out_a_step_at_a_time_encoding_as_it_goes() -> None:
    """A phase of more than `STEP` records is encoded and sent `STEP` at a time, each step at
    the loop's next turn, so that no turn holds the loop for the whole round; the markers still
    wait until Kafka holds every state."""
    step = checkpoints.STEP
    keys = [f"k{i:05d}" for i in range(2 * step + 5)]
    kafka, encoded = TurningKafka(), []
    book = _stepped_book(kafka, keys, encoded)
    assert book.flush() is not None
    # One step, no more: the rest is neither encoded nor sent until the loop turns.
    assert (len(encoded), len(kafka.book_flight), len(kafka.turns)) == (step, step, 1)
    kafka.turn()
    assert (len(encoded), len(kafka.book_flight), len(kafka.turns)) == (2 * step, 2 * step, 1)
    kafka.turn()
    assert (len(encoded), len(kafka.book_flight), len(kafka.turns)) == (len(keys), len(keys), 0)
    assert set(_kinds(kafka.book_flight)) == {"state"}
    kafka.settle_book()  # the last report ends the phase: the markers' phase waits its turn
    assert kafka.book_flight == [] and len(kafka.turns) == 1
    kafka.turn()
    assert _kinds(kafka.book_flight) == ["marker"]
    kafka.settle_book()
    kafka.turn()
    assert book.wait(0)
    assert [k for k, _ in kafka.book[:len(keys)]] == [state_key(k) for k in keys]


def test_a_wait_runs_the_steps_a_loop_that_does_not_turn_left_pending() -> None:
    """Whoever waits for a round (`settle` at close, on the loop's own thread perhaps) runs
    the steps queued for the loop, so the wait never depends on the loop turning."""
    keys = [f"k{i:05d}" for i in range(3 * checkpoints.STEP)]
    kafka, encoded = TurningKafka(auto=True), []
    book = _stepped_book(kafka, keys, encoded)
    book.flush()
    assert kafka.turns  # queued for a loop nobody turns
    assert book.wait(5)
    assert {k for k, _ in kafka.book} >= {state_key(k) for k in keys} | {marker_key(0)}


def test_a_failed_state_write_writes_no_marker_and_keeps_its_key_dirty() -> None:
    """A round that loses a state record ends without markers; the next round writes it again,
    then the markers."""
    kafka, states = FakeKafka(), {"a": 1}
    book = _book(kafka, states)
    book.changed("a")
    book.durable(0, 5)
    first = book.flush()
    assert first is not None
    kafka.resolve_book(ok=False)
    assert first.done.is_set() and first.failed
    assert kafka.book_flight == [] and kafka.book == []
    book.flush()
    assert _kinds(kafka.book_flight) == ["state"]
    kafka.settle_book()
    assert [parse_key(k) for k, _ in kafka.book] == [("a", None, None), ("", None, 0)]


def test_no_marker_moves_while_a_failed_append_is_held() -> None:
    """Past a failed append whose explanation is not durable, no marker is written, nor the
    held key's state (other keys' are); once it is released the next round writes both."""
    kafka, states = FakeKafka(), {"a": 2}
    book = _book(kafka, {**states, "b": 1})
    book.hold("a")
    book.changed("a")
    book.changed("b")
    book.durable(0, 5)
    book.flush()
    kafka.settle_book()
    assert [k for k, _ in kafka.book] == [b"b"]  # neither a's state nor a marker
    book.write_now("a")
    assert kafka.book_flight == []
    book.release("a")
    book.flush()
    kafka.settle_book()
    assert [k for k, _ in kafka.book] == [b"b", b"a", marker_key(0)]
    assert kafka.book[-1][1] == b"5"


def test_only_one_round_at_a_time() -> None:
    """A flush while a round is in flight begins none; what changed meanwhile waits for the
    next."""
    kafka, states = FakeKafka(), {"a": 1, "b": 1}
    book = _book(kafka, states)
    book.changed("a")
    book.flush()
    book.changed("b")
    assert book.flush() is None
    kafka.settle_book()
    assert book.flush() is not None
    kafka.settle_book()
    assert [k for k, _ in kafka.book] == [b"a", b"b"]


def test_recovery_is_the_checkpoints_plus_the_tail_after_each_marker() -> None:
    """load() hands over the states, markers and index; tail() yields exactly the records past
    each partition's marker (all of a partition without one)."""
    kafka, states = FakeKafka(), {"a": 3}
    for p, n in ((0, 6), (1, 2)):
        for i in range(n):
            kafka.logs.setdefault(p, []).append((b"a", str(i).encode()))
    book = _book(kafka, states)
    book.index("a", 0, 1, lambda: b"1")
    book.changed("a")
    book.durable(0, 3)
    book.flush()
    kafka.settle_book()

    seen: list[tuple[str, bytes]] = []
    again = _book(kafka, {}, )
    loaded = again.load(lambda k, v: seen.append((k, v)), bucket_at=lambda v: (int(v), 0))
    assert seen == [("a", b"3")]
    assert loaded.markers == {0: 3}
    assert again.buckets("a") == {0: (1, 0)}
    assert [r.position.offset for r in again.tail(loaded, 0)] == [4, 5]
    assert [r.position.offset for r in again.tail(loaded, 1)] == [0, 1]


def test_pruning_drops_old_buckets_and_keeps_each_keys_newest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Buckets indexed before the retention window are tombstoned with a round's states, the
    newest bucket of a key always kept; a recovery no longer sees them."""
    monkeypatch.setattr(checkpoints, "PRUNE_INTERVAL_S", 0.0)
    now = [1_000]
    kafka, states = FakeKafka(), {"a": 1}
    book = _book(kafka, states, retention_ms=100, clock=lambda: now[0])
    for bucket in range(3):
        book.index("a", bucket, bucket * 10, lambda b=bucket: str(b * 10).encode())
    book.index("b", 0, 0, lambda: b"0")
    now[0] = 2_000
    book.index("a", 3, 30, lambda: b"30")  # recent: kept
    kafka.settle_book()
    book.changed("a")
    book.flush()
    kafka.settle_book()
    assert book.buckets("a") == {3: (30, 2_000)}
    assert book.buckets("b") == {0: (0, 1_000)}  # old, but b's newest
    again = _book(kafka, {})
    again.load(lambda k, v: None, bucket_at=lambda v: (int(v), 0))
    assert set(again.buckets("a")) == {3}
    assert set(again.buckets("b")) == {0}


def test_the_index_keeps_each_buckets_lowest_offset_whatever_the_report_order() -> None:
    """A later record's report booked first does not hide the bucket's first record."""
    kafka = FakeKafka()
    book = _book(kafka, {})
    assert book.index("a", 0, 7, lambda: b"7") == 7
    assert book.index("a", 0, 3, lambda: b"3") == 3
    assert book.index("a", 0, 5, lambda: b"5") == 3
    assert book.buckets("a")[0][0] == 3
    assert [v for _, v, _ in kafka.book_flight] == [b"7", b"3"]


# --- the model ------------------------------------------------------------------------------

KEYS = ("a", "b")


class Ledger:
    """A miniature journal on the book: per key a seq, each record DATA or GAP with its seq;
    a failed append is held until its GAP is durable; recovery folds the tail and explains the
    holes it finds with GAPs of its own."""

    def __init__(self, kafka: FakeKafka) -> None:
        self.kafka = kafka
        self.last: dict[str, int] = {}
        self.next: dict[str, int] = {}
        self.book = CheckpointBook(
            kafka, encode_state=self._encode, encode_marker=lambda p, o: str(o).encode(),
            decode_marker=int)

    def _encode(self, key: str) -> bytes | None:
        return str(self.last[key]).encode() if key in self.last else None

    @staticmethod
    def partition(key: str) -> int:
        return KEYS.index(key) % 2

    def append(self, key: str) -> None:
        seq = self.next.get(key, 1)
        self.next[key] = seq + 1
        self._produce(key, seq, b"D")

    def _produce(self, key: str, seq: int, kind: bytes) -> None:
        def done(pos: Position | None) -> None:
            if pos is not None:
                self._durable(key, seq, pos)
                if kind == b"G":
                    self.book.release(key)
            elif kind == b"G":
                self._produce(key, seq, b"G")  # keep trying, still held
            else:
                self.book.hold(key)
                self._produce(key, seq, b"G")

        self.kafka.produce(self.partition(key), key.encode(), kind + str(seq).encode(), done)

    def _durable(self, key: str, seq: int, pos: Position) -> None:
        self.last[key] = max(self.last.get(key, 0), seq)
        self.book.index(key, seq // BUCKET, pos.offset, lambda: str(pos.offset).encode())
        self.book.durable(pos.partition, pos.offset)
        self.book.changed(key)

    def recover(self) -> None:
        def on_state(key: str, value: bytes) -> None:
            self.last[key] = max(self.last.get(key, 0), int(value))

        loaded = self.book.load(on_state, bucket_at=lambda v: (int(v), 0))
        holes: list[tuple[str, int]] = []
        for part in range(self.kafka.partitions):
            for rec in self.book.tail(loaded, part):
                assert rec.key is not None and rec.value is not None
                key, seq = rec.key.decode(), int(rec.value[1:])
                have = self.last.get(key, 0)
                if seq <= have:
                    continue
                holes.extend((key, s) for s in range(have + 1, seq))
                self._durable(key, seq, rec.position)
        for key, seq in holes:  # explained at once (the journal: produce_sync)
            records = self.kafka.logs.setdefault(self.partition(key), [])
            records.append((key.encode(), b"G" + str(seq).encode()))
            self.book.durable(self.partition(key), len(records) - 1)
        self.next = {k: s + 1 for k, s in self.last.items()}


class BookMachine(RuleBasedStateMachine):
    """Appends, their outcomes, checkpoint writes and their outcomes, flushes and crashes in
    any order: after each crash the recovered state is what Kafka durably holds."""

    def __init__(self) -> None:
        super().__init__()
        self.kafka = FakeKafka()
        self.ledger = Ledger(self.kafka)

    @rule(key=st.sampled_from(KEYS))
    def append(self, key: str) -> None:
        self.ledger.append(key)

    @precondition(lambda self: any(self.kafka.log_flight.values()))
    @rule(data=st.data(), ok=st.booleans())
    def log_outcome(self, data: st.DataObject, ok: bool) -> None:
        part = data.draw(st.sampled_from(sorted(p for p, f in self.kafka.log_flight.items()
                                                if f)))
        self.kafka.resolve_log(part, ok)

    @precondition(lambda self: bool(self.kafka.book_flight))
    @rule(ok=st.booleans())
    def book_outcome(self, ok: bool) -> None:
        self.kafka.resolve_book(ok)

    @rule()
    def flush(self) -> None:
        self.ledger.book.flush()

    @rule()
    def crash(self) -> None:
        self.kafka.crash()
        self.ledger = Ledger(self.kafka)
        self.ledger.recover()
        truth: dict[str, set[int]] = {}
        for records in self.kafka.logs.values():
            for key, value in records:
                truth.setdefault(key.decode(), set()).add(int(value[1:]))
        # the same last seq per key as Kafka holds, and every seq up to it DATA or GAP
        assert self.ledger.last == {k: max(s) for k, s in truth.items()}
        for key, seqs in truth.items():
            assert seqs == set(range(1, max(seqs) + 1)), (key, sorted(seqs))

    @invariant()
    def index_points_at_a_record_of_its_bucket(self) -> None:
        for key in KEYS:
            records = self.kafka.logs.get(Ledger.partition(key), [])
            for bucket, (offset, _) in self.ledger.book.buckets(key).items():
                k, value = records[offset]
                assert k == key.encode() and int(value[1:]) // BUCKET == bucket


TestBookMachine = BookMachine.TestCase
TestBookMachine.settings = settings(max_examples=1000, stateful_step_count=60, deadline=None)


def test_planned_phases_go_out_in_order_each_once_the_one_before_is_durable() -> None:
    """An owner's phases (the item store: versions, then headers) are made when they go out
    and sent one after the other, the markers after the last; the round's outcome reaches the
    owner before another round can begin."""
    kafka = FakeKafka()
    made: list[str] = []
    over: list[tuple[int, bool]] = []

    def phase(name: str) -> Callable[[], list[tuple[bytes, bytes | None]]]:
        def make() -> list[tuple[bytes, bytes | None]]:
            made.append(name)
            return [(sub_key("t\x00m", len(made)), name.encode())]
        return make

    book = CheckpointBook(
        kafka, encode_state=lambda _: None, encode_marker=lambda p, o: str(o).encode(),
        decode_marker=int, key_parts=2,
        plan=lambda keys, number: [phase("versions"), phase("headers")],
        on_round=lambda r: over.append((r.number, r.failed)))
    book.changed("t\x00m")
    book.durable(0, 3)
    book.flush()
    assert made == ["versions"]
    kafka.resolve_book()
    assert made == ["versions", "headers"]
    assert _kinds(kafka.book_flight) == ["sub"]
    kafka.resolve_book()
    assert _kinds(kafka.book_flight) == ["marker"]
    kafka.resolve_book()
    assert over == [(1, False)]
    assert [v for _, v in kafka.book] == [b"versions", b"headers", b"3"]


def test_a_phase_that_cannot_be_made_fails_the_round() -> None:
    """An encoding error in a planned phase ends the round as failed: no marker, keys dirty."""
    kafka = FakeKafka()
    over: list[bool] = []

    def broken() -> list[tuple[bytes, bytes | None]]:
        raise ValueError("cannot encode")

    book = CheckpointBook(
        kafka, encode_state=lambda _: None, encode_marker=lambda p, o: str(o).encode(),
        decode_marker=int, plan=lambda keys, number: [broken],
        on_round=lambda r: over.append(r.failed))
    book.changed("a")
    book.durable(0, 1)
    round_ = book.flush()
    assert round_ is not None and round_.failed and over == [True]
    assert kafka.book_flight == []
    assert book.flush() is not None  # the key is dirty again


def test_settle_waits_out_a_failed_round_in_flight_and_writes_its_own() -> None:
    """A round that was in flight when settle() began and then fails is not settle's failure:
    it writes the keys again and returns once Kafka holds them and the markers."""
    kafka, states = FakeKafka(), {"a": 1}
    book = _book(kafka, states)
    book.changed("a")
    book.durable(0, 2)
    book.flush()

    def deliver() -> None:
        kafka.wrote.clear()
        kafka.resolve_book(ok=False)
        assert kafka.wrote.wait(30)  # settle's own round
        kafka.auto = True
        kafka.settle_book()

    worker = threading.Thread(target=deliver)
    worker.start()
    book.settle(timeout_s=30)
    worker.join()
    assert [parse_key(k) for k, _ in kafka.book] == [("a", None, None), ("", None, 0)]
