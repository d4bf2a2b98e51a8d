"""The journal follower takes what the ack road built instead of decoding it again
(broker/pubsub/follower.py), against the real Kafka: an acknowledged entry handed over with
`acked` is what the follower delivers and keeps in the recent journal for that record; a record
nobody handed over is decoded; an entry left behind (acknowledged after the follower had read
its record) does not stay."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import PubsubClient
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.pubsub import JournalFollower
from broker.pubsub import follower as follower_module
from broker.recent import RecentJournal
from broker.records import JournalEntry, Publication

pytestmark = pytest.mark.kafka


def _publish(core: BrokerCore, n: int) -> list[JournalEntry]:
    """`n` publications, and the entries the ack road builds for them, each with content
    `<taken/>`: only an entry the follower took, never one it decoded, can carry that."""
    out = []
    for i in range(n):
        pub = Publication(topic="q.acked", source="fred@example.com", content=b"<q n='%d'/>" % i)
        ok = core.journal.append_sync(pub)
        out.append(JournalEntry.of_publication(dataclasses.replace(pub, content=b"<taken/>"),
                                               ok.source_seq, ok.appended_at, ok.position))
    return out


def _read_all(follower: JournalFollower) -> None:
    called = threading.Event()
    follower.when_read(called.set)
    assert called.wait(30), "the follower never read what the journal held"


def _follower(core: BrokerCore, got: list[JournalEntry],
              recent: RecentJournal | None = None) -> JournalFollower:
    return JournalFollower(core.config, core.codec, lambda entries, _reached: got.extend(entries),
                           start=dict.fromkeys(range(core.config.journal_partitions), 0),
                           recent=recent)


def test_an_acknowledged_entry_is_taken_not_decoded(core: BrokerCore) -> None:
    acked = _publish(core, 3)
    got: list[JournalEntry] = []
    recent = RecentJournal()
    follower = _follower(core, got, recent)
    follower.acked(acked[:2])  # the third was not acknowledged to this broker: decoded
    follower.start()
    try:
        _read_all(follower)
    finally:
        follower.stop()
    assert [e.content for e in got] == [b"<taken/>", b"<taken/>", b"<q n='2'/>"]
    assert [e.source_seq for e in got] == [1, 2, 3]
    assert follower.undecoded == 2
    first = recent.get(*acked[0].position)
    assert first is not None and first.content == b"<taken/>"
    assert recent.get(*got[2].position) == got[2]


def test_an_entry_below_what_the_follower_reads_is_dropped(
        core: BrokerCore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry the follower will never take (its record read already, as when the
    acknowledgement came late, or here: before where it began) is dropped once the follower
    reads past it in that partition (at once: the threshold set to 0)."""
    monkeypatch.setattr(follower_module, "_ACKED_PRUNE", 0)
    before, after = _publish(core, 2)
    part, offset = after.position
    got: list[JournalEntry] = []
    follower = JournalFollower(
        core.config, core.codec, lambda entries, _reached: got.extend(entries),
        start={**dict.fromkeys(range(core.config.journal_partitions), 0), part: offset})
    follower.acked([before, after])
    assert follower.acked_held() == 2
    follower.start()
    try:
        _read_all(follower)
    finally:
        follower.stop()
    assert [e.content for e in got] == [b"<taken/>"]
    assert follower.acked_held() == 0


def test_the_broker_hands_its_follower_what_kafka_acknowledged(kafka_config: KafkaConfig) -> None:
    """Wired in BrokerApp: the broker's own publications reach its follower from the ack
    road. (At least one of five: a record the follower fetched in the instant before its
    acknowledgement reached the event loop is decoded, which is correct too.)"""

    async def run() -> None:
        async with BrokerApp(kafka_config, sequenced=False) as app:
            pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
            await pub.create_topic("q.acked")
            for k in range(5):
                await pub.publish("q.acked", f"a{k}".encode())
            read = asyncio.Event()
            loop = asyncio.get_running_loop()
            await asyncio.to_thread(app.follower.when_read,
                                    lambda: loop.call_soon_threadsafe(read.set))
            await read.wait()
            assert app.follower.undecoded >= 1
            await pub.close()

    asyncio.run(run())
