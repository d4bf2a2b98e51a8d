"""Publishing without duplicates (docs/robust-binding.md §8) on real Kafka and real BEEP: a copy
of a publication is answered ok without a second journal record; `pubstatus` tells a publisher
where to resume, also after a restart; a failed pubseq is remembered across restarts; and a
`ReliablePublisher` or `apexps publish --lines` streaming through a broker kill -9 and restart
leaves every message in the journal exactly once, in order."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable

import pytest

from adapters.app import BrokerApp
from adapters.client.publisher import ReliablePublisher
from adapters.client.pubsub_client import Delivered, PubsubClient
from adapters.client.reconnect import ReconnectPolicy
from broker.core import BrokerCore
from broker.journal import Appended, PublisherPosition
from broker.kafka_io import KafkaConfig
from broker.publish_gate import AlreadyDurable, Outcome, PublishGate
from broker.records import JournalEntry, Publication, RecordKind
from broker.robust.config import RobustConfig
from common.errors import JournalUnavailable, NotTaken, ServiceNotAvailable
from tests.integration.broker_process import start_broker

pytestmark = pytest.mark.kafka

TOPIC = "q.items"
QUIET = RobustConfig(heartbeat_ms=600_000)
FAST = ReconnectPolicy(max_attempts=None, wait=0.05, wait_max=0.5)
APEXPS = [sys.executable, "-m", "adapters.cli.main", "--log-level", "warning"]
TIMEOUT = 120.0


def _data(core: BrokerCore, source: str) -> list[JournalEntry]:
    return [e for e in core.journal.read_source(source) if e.kind is RecordKind.DATA]


async def _journal(config: KafkaConfig, source: str) -> list[JournalEntry]:
    """The source's DATA records as a freshly recovered core reads them."""
    def read() -> list[JournalEntry]:
        core = BrokerCore(config)
        core.open()
        try:
            return _data(core, source)
        finally:
            core.close()
    return await asyncio.to_thread(read)


# --- (a) a resend after a lost ok -----------------------------------------------------------


def test_the_same_pubseq_twice_is_one_record_and_two_oks(kafka_config: KafkaConfig) -> None:
    """A resend of a durable pubseq, and copies arriving together with their original, are all
    answered ok; the journal holds each pubseq once."""
    async def body() -> None:
        async with BrokerApp(kafka_config, robust=QUIET) as app:
            async with await PubsubClient.connect("127.0.0.1", app.port,
                                                  "fred@example.com") as fred:
                await fred.create_topic(TOPIC)
                await fred.publish(TOPIC, b"one", publisher_seq=1)
                await fred.publish(TOPIC, b"one again", publisher_seq=1)  # its ok was "lost"
                # original and copies in one event-loop turn: the copies wait for it
                await asyncio.gather(*(fred.publish(TOPIC, b"two", publisher_seq=2)
                                       for _ in range(3)))
                await fred.publish(TOPIC, b"three", publisher_seq=3)
                assert app.handler.gate.copies == 3
            data = _data(app.core, "fred@example.com")
            assert [(e.publisher_seq, e.content) for e in data] == [
                (1, b"one"), (2, b"two"), (3, b"three")]
            assert [e.source_seq for e in data] == [1, 2, 3]
    asyncio.run(asyncio.wait_for(body(), TIMEOUT))


# --- (d) pubstatus --------------------------------------------------------------------------


def test_pubstatus_answers_the_resume_point_also_after_restart(
        kafka_config: KafkaConfig) -> None:
    """pubstatus gives the highest durable pubseq and source seq; a restarted broker gives
    the same; a ReliablePublisher continues after it."""
    async def body() -> None:
        async with (BrokerApp(kafka_config, robust=QUIET) as app,
                    await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com") as fred):
            await fred.create_topic(TOPIC)
            first = await fred.pubstatus()
            assert (first.source, first.pubseq, first.source_seq) == ("fred@example.com", 0, 0)
            publisher = await ReliablePublisher.start(fred)
            assert publisher.next_seq == 1
            for n in range(3):
                assert await publisher.publish(TOPIC, f"m{n}".encode()) == n + 1
            await fred.publish(TOPIC, b"without a pubseq")
            status = await fred.pubstatus()
            assert (status.pubseq, status.source_seq) == (3, 4)
        async with BrokerApp(kafka_config, robust=QUIET) as app:
            async with await PubsubClient.connect("127.0.0.1", app.port,
                                                  "fred@example.com") as fred:
                status = await fred.pubstatus()
                assert (status.pubseq, status.source_seq) == (3, 4)
                publisher = await ReliablePublisher.start(fred)
                assert await publisher.publish(TOPIC, b"m3") == 4
                await publisher.publish(TOPIC, b"copy", publish_type="image", message_id="X")
            data = _data(app.core, "fred@example.com")
            assert [e.publisher_seq for e in data] == [1, 2, 3, None, 4, 5]
            assert (data[-1].publish_type, data[-1].message_id) == ("image", "X")
    asyncio.run(asyncio.wait_for(body(), TIMEOUT))


# --- a failed pubseq below the mark ---------------------------------------------------------


def _append(gate: PublishGate, pubs: list[Publication]) -> list[Outcome]:
    """Append through the gate and wait (its callbacks run on Kafka's poll thread; the test
    thread only waits meanwhile, so the gate is used from one thread at a time)."""
    done = threading.Event()
    out: list[Outcome] = []

    def settled(outcomes: list[Outcome]) -> None:
        out.extend(outcomes)
        done.set()

    gate.append_many(pubs, settled)
    assert done.wait(60)
    return out


def _position(gate: PublishGate, source: str) -> PublisherPosition:
    got: list[PublisherPosition] = []
    gate.position(source, got.append)
    assert got
    return got[0]


def _settle(core: BrokerCore, checkpointed: bool) -> None:
    """Wait for what is queued; with `checkpointed`, also for checkpoints covering it all."""
    if checkpointed:
        core.journal.checkpoint()
    else:
        core.journal.flush()


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_failed_pubseq_is_remembered_across_restarts(kafka_config: KafkaConfig,
                                                       checkpointed: bool) -> None:
    """Kafka refuses pubseq 2 (too large) while 1 and 3 become durable: 2 is recorded as failed
    (in its GAP record and the source checkpoint), so after a restart a resend of 2 is
    journaled while a resend of 3 is a duplicate — whether recovery finds that in the
    checkpoint or in the tail it scans."""
    src = "fred@example.com"

    def pub(pubseq: int, size: int = 10) -> Publication:
        return Publication(topic=TOPIC, source=src, content=b"x" * size, publisher_seq=pubseq)

    core = BrokerCore(kafka_config)
    core.open()
    try:
        outcomes = _append(PublishGate(core.journal), [pub(1), pub(2, 2_000_000), pub(3)])
        assert [type(o) for o in outcomes] == [Appended, JournalUnavailable, Appended]
        _settle(core, checkpointed)
        assert core.journal.publisher_position(src) == PublisherPosition(3, 3, frozenset({2}))
    finally:
        core.close()
    core = BrokerCore(kafka_config)
    core.open()
    try:
        gate = PublishGate(core.journal)
        assert _position(gate, src) == PublisherPosition(3, 3, frozenset({2}))
        gaps = [e for e in core.journal.read_source(src) if e.kind is RecordKind.GAP]
        assert [(g.source_seq, g.publisher_seq) for g in gaps] == [(2, 2)]
        again = _append(gate, [pub(2), pub(3)])
        assert isinstance(again[0], Appended) and again[1] == AlreadyDurable(src, 3)
        _settle(core, checkpointed)
        assert _position(gate, src) == PublisherPosition(3, 4, frozenset())
    finally:
        core.close()
    core = BrokerCore(kafka_config)
    core.open()
    try:
        assert core.journal.publisher_position(src) == PublisherPosition(3, 4, frozenset())
        assert [e.publisher_seq for e in _data(core, src)] == [1, 3, 2]
    finally:
        core.close()


# --- (b) and (c): kill -9 mid-stream ---------------------------------------------------------


async def _kill(proc: asyncio.subprocess.Process) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()


def _exactly_once(entries: list[JournalEntry], n: int,
                  content: Callable[[int], bytes]) -> None:
    assert [e.publisher_seq for e in entries] == list(range(1, n + 1))
    assert [e.content for e in entries] == [content(i) for i in range(1, n + 1)]


@pytest.mark.slow
def test_reliable_publisher_streams_through_kill_9(kafka_config: KafkaConfig) -> None:
    """A ReliablePublisher streams N messages; the broker is killed with SIGKILL while many are
    unacknowledged and restarted on the same port; the publisher reconnects and resends, and
    the journal holds pubseqs 1..N exactly once, in order, with their content."""
    n = 3000

    def content(i: int) -> bytes:
        return f"<m n='{i}' />".encode()

    async def body() -> None:
        proc, port = await start_broker(kafka_config.bootstrap,
                                        namespace=kafka_config.namespace, logs=False)
        restarted: asyncio.subprocess.Process | None = None
        try:
            async with await PubsubClient.connect("127.0.0.1", port,
                                                  "admin@example.com") as admin:
                await admin.create_topic(TOPIC)
            feed = await PubsubClient.connect("127.0.0.1", port, "feed@example.com",
                                              reconnect=FAST)
            publisher = await ReliablePublisher.start(feed, window=400)
            first = [await publisher.send(TOPIC, content(i)) for i in range(1, n // 3 + 1)]
            await first[n // 6]  # acknowledged; many after it are not yet
            await _kill(proc)
            rest = asyncio.create_task(_send_range(publisher, n // 3 + 1, n, content))
            restarted, _ = await start_broker(
                kafka_config.bootstrap, "--listen", f"127.0.0.1:{port}",
                namespace=kafka_config.namespace, logs=False)
            await rest
            await publisher.flush()
            assert publisher.stats.acked == n and publisher.stats.disconnects == 1
            assert publisher.stats.resent > 0
            status = await feed.pubstatus()
            assert status.pubseq == n
            await feed.close()
        finally:
            for p in (proc, restarted):
                if p is not None and p.returncode is None:
                    await _kill(p)
        _exactly_once(await _journal(kafka_config, "feed@example.com"), n, content)

    asyncio.run(asyncio.wait_for(body(), 4 * TIMEOUT))


async def _send_range(publisher: ReliablePublisher, lo: int, hi: int,
                      content: Callable[[int], bytes]) -> None:
    for i in range(lo, hi + 1):
        await publisher.send(TOPIC, content(i))


@pytest.mark.slow
def test_cli_publish_lines_survives_kill_9_and_restart(kafka_config: KafkaConfig) -> None:
    """`apexps publish --lines` fed N lines while the broker is killed and restarted: it
    exits 0 having published N, and the journal holds each line exactly once, in order."""
    n = 3000

    def line(i: int) -> bytes:
        return f"tick {i}".encode()

    async def body() -> None:
        proc, port = await start_broker(kafka_config.bootstrap,
                                        namespace=kafka_config.namespace, logs=False)
        restarted: asyncio.subprocess.Process | None = None
        try:
            async with await PubsubClient.connect("127.0.0.1", port,
                                                  "admin@example.com") as admin:
                await admin.create_topic(TOPIC)
            watch = await PubsubClient.connect("127.0.0.1", port, "watch@example.com")
            await watch.subscribe(TOPIC)
            cli = await asyncio.create_subprocess_exec(
                *APEXPS, "publish", "--topic", TOPIC, "--lines", "--as", "feed@example.com",
                "--server", f"127.0.0.1:{port}", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
            assert cli.stdin is not None
            cli.stdin.write(b"".join(line(i) + b"\n" for i in range(1, n // 2 + 1)))
            await cli.stdin.drain()
            seen = 0
            async for event in watch.events():  # the publisher is well under way
                seen += isinstance(event, Delivered)
                if seen == n // 10:
                    break
            await _kill(proc)
            await watch.close()
            cli.stdin.write(b"".join(line(i) + b"\n" for i in range(n // 2 + 1, n + 1)))
            cli.stdin.close()
            restarted, _ = await start_broker(
                kafka_config.bootstrap, "--listen", f"127.0.0.1:{port}",
                namespace=kafka_config.namespace, logs=False)
            _, err = await asyncio.wait_for(cli.communicate(), TIMEOUT)
            assert cli.returncode == 0, err.decode()
            assert f"published {n} messages" in err.decode()
            assert "reconnected" in err.decode()
        finally:
            for p in (proc, restarted):
                if p is not None and p.returncode is None:
                    await _kill(p)
        _exactly_once(await _journal(kafka_config, "feed@example.com"), n, line)

    asyncio.run(asyncio.wait_for(body(), 4 * TIMEOUT))


def test_reliable_publisher_reports_refusals(kafka_config: KafkaConfig) -> None:
    """A refusal for good (550: no such topic) fails that publication at once; a retriable one
    (421: Kafka refuses a record too large) is tried max_attempts times, then fails; the rest
    are published, and flush raises the first error."""
    async def body() -> None:
        async with (BrokerApp(kafka_config, robust=QUIET) as app,
                    await PubsubClient.connect("127.0.0.1", app.port, "fred@example.com") as fred):
            await fred.create_topic(TOPIC)
            publisher = await ReliablePublisher.start(fred, max_attempts=2)
            missing = await publisher.send("no.such", b"x")
            huge = await publisher.send(TOPIC, b"x" * 2_000_000)
            fine = await publisher.send(TOPIC, b"fine")
            assert await fine == 3
            with pytest.raises(NotTaken):
                await missing
            with pytest.raises(ServiceNotAvailable):
                await huge
            with pytest.raises(NotTaken):
                await publisher.flush()
            await publisher.flush()  # each error is raised once
            assert (publisher.stats.acked, publisher.stats.failed) == (1, 2)
            assert (await fred.pubstatus()).pubseq == 3
            await publisher.close()
            assert app.core.journal.publisher_position("fred@example.com").failed == {2}
            assert [e.publisher_seq for e in _data(app.core, "fred@example.com")] == [3]
    asyncio.run(asyncio.wait_for(body(), TIMEOUT))
