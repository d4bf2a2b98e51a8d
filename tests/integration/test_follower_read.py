"""`JournalFollower.when_read`: read-your-writes for what forwarding builds (a snapshot reads the
item state that `deliver` advances), against the real Kafka. The follower's `deliver` is held
shut here, as a follower lagging behind an acknowledged append is (right after a start, or on a
loaded machine); the callback must wait for it, and come after it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from broker.core import BrokerCore
from broker.pubsub import JournalFollower
from broker.records import JournalEntry, Publication

pytestmark = pytest.mark.kafka


class _Gated:
    """A `deliver` that blocks until let through, and a log of what happened in which order."""

    def __init__(self, *, shut: bool = True) -> None:
        self.gate = threading.Event()
        if not shut:
            self.gate.set()
        self.log: list[str] = []
        self.entered = threading.Event()

    def deliver(self, entries: list[JournalEntry], reached: dict[int, int]) -> None:
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.log.extend(f"deliver {e.source_seq}" for e in entries)


@contextlib.contextmanager
def _follower(core: BrokerCore, sink: _Gated) -> Iterator[JournalFollower]:
    """A follower from the start of every journal partition, stopped at the end."""
    follower = JournalFollower(core.config, core.codec, sink.deliver,
                               start=dict.fromkeys(range(core.config.journal_partitions), 0))
    follower.start()
    try:
        yield follower
    finally:
        sink.gate.set()
        follower.stop()


def _read_all(follower: JournalFollower) -> None:
    called = threading.Event()
    follower.when_read(called.set)
    assert called.wait(30), "the follower never read what the journal held"


def _publish(core: BrokerCore, n: int) -> None:
    for _ in range(n):
        core.journal.append_sync(Publication(topic="q.read", source="fred@example.com",
                                             content=b"<q />"))


def test_the_callback_waits_for_deliver_and_comes_after_it(core: BrokerCore) -> None:
    _publish(core, 3)  # acknowledged: durable in Kafka before the follower has read any
    sink = _Gated()
    with _follower(core, sink) as follower:
        assert sink.entered.wait(30)  # the follower has the records, deliver is held
        called = threading.Event()

        def read() -> None:
            sink.log.append("read")
            called.set()
        follower.when_read(read)
        assert not called.is_set() and sink.log == []  # behind: the callback waits
        sink.gate.set()
        assert called.wait(30)
        assert sink.log == ["deliver 1", "deliver 2", "deliver 3", "read"]


def test_caught_up_calls_back_at_once_in_the_callers_thread(core: BrokerCore) -> None:
    _publish(core, 2)
    with _follower(core, _Gated(shut=False)) as follower:
        _read_all(follower)  # through when_read itself; then ask again
        threads: list[threading.Thread] = []
        follower.when_read(lambda: threads.append(threading.current_thread()))
        assert threads == [threading.current_thread()]


def test_a_record_that_forwards_nothing_still_counts_as_read(core: BrokerCore) -> None:
    """The journal's last record is not a publication (here: not even decodable); reading it
    completes the wait although `deliver` hears nothing of it."""
    _publish(core, 1)
    producer = Producer({"bootstrap.servers": core.config.bootstrap})
    producer.produce(core.config.topic("journal"), b"not avro", key=b"fred@example.com")
    assert producer.flush(30) == 0
    sink = _Gated(shut=False)
    with _follower(core, sink) as follower:
        _read_all(follower)
        assert sink.log == ["deliver 1"]
