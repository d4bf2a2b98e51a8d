"""Source repair on the live pubsub path (docs/robust-binding.md §5.2): real Kafka, real BEEP
over TCP. After a gap the broker can no longer fill (569), a repair starts a new epoch whose
reset carries the request's transID, resends every missed message once in per-source order,
and goes on into live data with no gap and no duplicate — also while publishers keep
publishing; `since` brings back unnamed sources; refused repairs (570, 537, 553) change
nothing; and the real subscriber stub (adapters/client/resequencer.py) rides through a forced loss
of link context on its own.

The subscriber side is a bare `ApexClient` here, so every item is seen in the order the broker
sent it (data, resets and linkreplies alike)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass

import pytest

from adapters.apex.batch_codec import decode_batch
from adapters.apex.codec import BEEP_XML
from adapters.apex.endpoint import Endpoint
from adapters.apex.robust_codec import (
    GapRequest,
    LinkReply,
    RepairRequest,
    RobustDocument,
    SourcePosition,
    decode_robust,
    encode_robust,
)
from adapters.apex.robust_stamp import Stamp, StampKind, find_stamp
from adapters.app import BrokerApp
from adapters.client.client import ApexClient
from adapters.client.pubsub_client import PubsubClient
from adapters.client.resequencer import Deliver, RequestGap, RequestRepair, Resequencer, Reset
from broker.kafka_io import KafkaConfig
from broker.robust.config import RobustConfig

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)
FRED, PA, PB = "fred@example.com", "pa@example.com", "pb@example.com"
LINK = "fred-desk"


@dataclass(frozen=True)
class Got:
    """One thing the broker sent the subscriber: stamped data (content), or a linkreply."""

    stamp: Stamp | None = None
    content: bytes = b""
    reply: LinkReply | None = None


class Wire:
    """A subscriber endpoint on a bare ApexClient: what arrives, in arrival order."""

    def __init__(self, client: ApexClient, me: Endpoint) -> None:
        self.client, self.me = client, me
        self.service = Endpoint("apex=pubsub", me.domain)
        self.inbox: asyncio.Queue[Got] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, port: int, who: str) -> Wire:
        client = await ApexClient.connect("127.0.0.1", port)
        await client.attach(who)
        return cls(client, Endpoint.parse(who))

    async def _read(self) -> None:
        async for data in self.client.receive():
            if data.originator.address != "apex=pubsub":
                continue
            if data.originator.subaddress is None and data.content.startswith(b"<linkreply"):
                doc = decode_robust(data.content)
                assert isinstance(doc, LinkReply)
                self.inbox.put_nowait(Got(reply=doc))
                continue
            if data.originator.subaddress is None and data.content.startswith(b"<batch"):
                for item in decode_batch(data.content).items:  # asked for with batch= (§5.4)
                    self.inbox.put_nowait(Got(item.stamp, item.content))
                continue
            mine = data.recipients.index(self.me) if self.me in data.recipients else 0
            stamp = find_stamp(data.options_of(mine))
            if stamp is not None:
                self.inbox.put_nowait(Got(stamp, data.content))

    async def ask(self, doc: RobustDocument) -> None:
        await self.client.send(self.me, [self.service], encode_robust(doc), BEEP_XML)

    async def next(self, timeout: float = 30) -> Got:
        return await asyncio.wait_for(self.inbox.get(), timeout)

    async def until_reply(self, trans_id: int) -> tuple[list[Got], LinkReply]:
        """Everything up to the linkreply to `trans_id`, and that reply."""
        got: list[Got] = []
        while True:
            item = await self.next()
            if item.reply is not None and item.reply.trans_id == trans_id:
                return got, item.reply
            got.append(item)

    async def data(self, count: int) -> list[Stamp]:
        """The stamps of the next `count` data (resets, heartbeats and replies are skipped)."""
        out: list[Stamp] = []
        while len(out) < count:
            item = await self.next()
            if item.stamp is not None and item.stamp.kind is StampKind.DATA:
                out.append(item.stamp)
        return out

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.client.close()


def key(stamp: Stamp) -> tuple[str, int]:
    assert stamp.source is not None and stamp.source_seq is not None
    return stamp.source, stamp.source_seq


def last_seqs(stamps: list[Stamp]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in stamps:
        source, seq = key(s)
        out[source] = max(out.get(source, 0), seq)
    return out


async def _link_at(app: BrokerApp, link_seq: int) -> None:
    """Wait until the link log holds link seq `link_seq` of the link durably."""
    assert app.handler.sequenced is not None
    await asyncio.wait_for(app.handler.sequenced.sent_through(LINK, link_seq), 10)


async def _setup(app: BrokerApp, *, take_reset: bool = True,
                 ) -> tuple[PubsubClient, PubsubClient, Wire]:
    """Two publishers on q.a and q.b, and fred subscribed to both on LINK (by pa, on fred's
    behalf: fred's own connection is the bare wire). The link's first reset is the first thing
    fred gets; `take_reset` checks and takes it."""
    pa = await PubsubClient.connect("127.0.0.1", app.port, PA)
    pb = await PubsubClient.connect("127.0.0.1", app.port, PB)
    fred = await Wire.connect(app.port, FRED)
    for topic in ("q.a", "q.b"):
        await pa.create_topic(topic)
        await pa.subscribe(topic, 600, subscriber=FRED, link=LINK)
    if take_reset:
        first = await fred.next()
        assert first.stamp is not None and first.stamp.kind is StampKind.RESET
        assert (first.stamp.epoch, first.stamp.link_seq, first.stamp.repair) == (0, 0, None)
    return pa, pb, fred


async def _publish(pa: PubsubClient, pb: PubsubClient, count: int, tag: str) -> None:
    for k in range(count):
        await pa.publish("q.a", f"{tag}-a{k}".encode())
        await pb.publish("q.b", f"{tag}-b{k}".encode())


async def _out_of_window(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pa, pb, fred = await _setup(app)
        await _publish(pa, pb, 3, "seen")
        seen = await fred.data(6)
        assert [s.link_seq for s in seen] == list(range(1, 7))
        await fred.close()
        await _publish(pa, pb, 4, "missed")  # fred is away: 8 messages it never gets
        await _link_at(app, 14)
        fred = await Wire.connect(app.port, FRED)
        # the link log keeps 1 ms: the gap is out of the window
        await fred.ask(GapRequest(LINK, 7, 7, epoch=0))
        _, refused = await fred.until_reply(7)
        assert refused.code == 569
        positions = last_seqs(seen)
        # publishers keep going before, during and after the repair
        stop = asyncio.Event()

        async def keep_publishing() -> None:
            k = 0
            while not stop.is_set() or k < 6:
                await _publish(pa, pb, 1, f"live{k}")
                k += 1

        publishing = asyncio.create_task(keep_publishing())
        await fred.data(1)  # live traffic on the old epoch has begun
        await fred.ask(RepairRequest(LINK, 9, tuple(SourcePosition(s, n)
                                                    for s, n in sorted(positions.items()))))
        before, done = await fred.until_reply(9)
        stop.set()
        await publishing
        # up to the reset: old epoch only; then the reset answering transID 9
        at = next(i for i, g in enumerate(before)
                  if g.stamp is not None and g.stamp.kind is StampKind.RESET)
        assert all(g.stamp is not None and g.stamp.epoch == 0 for g in before[:at])
        reset = before[at].stamp
        assert reset is not None
        assert (reset.epoch, reset.link_seq, reset.repair) == (1, 0, 9)
        after = [g.stamp for g in before[at + 1:] if g.stamp is not None]
        assert all(s.epoch == 1 and s.kind is StampKind.DATA for s in after)
        # the reply names the catch-up's last item; it comes once the link log holds it, so
        # live items may precede it on the wire (robust-binding §2.5)
        assert (done.code, done.epoch) == (250, 1) and done.link_seq <= len(after)
        catch_up = after[:done.link_seq]
        assert [s.link_seq for s in catch_up] == list(range(1, len(catch_up) + 1))
        # every message published after fred's positions arrives once in the new epoch
        journal = app.core.journal
        expected = {(e.source, e.source_seq) for src in (PA, PB)
                    for e in journal.read_source(src, positions[src])}
        epoch1 = list(after)
        while {key(s) for s in epoch1} != expected:
            item = await fred.next()
            assert item.reply is None and item.stamp is not None
            epoch1.append(item.stamp)
        assert [s.link_seq for s in epoch1] == list(range(1, len(epoch1) + 1))  # no gap
        assert len({key(s) for s in epoch1}) == len(epoch1)  # no duplicate
        for src in (PA, PB):  # per-source order
            seqs = [key(s)[1] for s in epoch1 if key(s)[0] == src]
            assert seqs == sorted(seqs)
        missed = {(src, positions[src] + k) for src in (PA, PB) for k in range(1, 5)}
        assert missed <= {key(s) for s in catch_up}
        head = app.core.links.last(LINK)
        assert head is not None and head.epoch == 1
        # and live goes on in the new epoch
        await _publish(pa, pb, 1, "after")
        later = await fred.data(2)
        assert [s.link_seq for s in later] == [len(epoch1) + 1, len(epoch1) + 2]
        assert {s.epoch for s in later} == {1}
        for c in (pa, pb, fred):
            await c.close()


def test_repair_after_an_out_of_window_gap_resends_everything_once(
        kafka_config: KafkaConfig) -> None:
    asyncio.run(_out_of_window(dataclasses.replace(kafka_config, link_retention_ms=1)))


async def _since(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pa, pb, fred = await _setup(app)
        await _publish(pa, pb, 3, "seen")
        seen = await fred.data(6)
        await fred.close()
        await _publish(pa, pb, 3, "missed")
        await _link_at(app, 12)
        fred = await Wire.connect(app.port, FRED)
        # pa named; pb unnamed: what the journal accepted since the last stamp fred holds
        since = seen[-1].time
        assert since is not None
        pa_last = last_seqs(seen)[PA]
        await fred.ask(RepairRequest(LINK, 4, (SourcePosition(PA, pa_last),), since=since))
        got, done = await fred.until_reply(4)
        assert done.code == 250
        assert got[0].stamp is not None and got[0].stamp.repair == 4
        assert got[0].stamp.time is not None and got[0].stamp.time <= since
        journal = app.core.journal
        expected = [(e.source, e.source_seq) for e in journal.read_source(PA, pa_last)]
        expected += [(e.source, e.source_seq) for e in journal.read_source(PB)
                     if e.appended_at >= since]
        assert [key(g.stamp) for g in got[1:] if g.stamp is not None] == expected
        assert [g.content for g in got[1:4]] == [f"missed-a{k}".encode() for k in range(3)]
        # no sources and no since: a new epoch from live data
        await fred.ask(RepairRequest(LINK, 5))
        got, done = await fred.until_reply(5)
        assert len(got) == 1 and got[0].stamp is not None
        assert (got[0].stamp.epoch, got[0].stamp.repair) == (2, 5)
        assert (done.code, done.epoch, done.link_seq) == (250, 2, 0)
        await _publish(pa, pb, 1, "live")
        live = await fred.data(2)
        assert [(s.epoch, s.link_seq) for s in live] == [(2, 1), (2, 2)]
        for c in (pa, pb, fred):
            await c.close()


def test_repair_since_brings_back_unnamed_sources(kafka_config: KafkaConfig) -> None:
    asyncio.run(_since(kafka_config))


async def _refused(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=dataclasses.replace(QUIET, max_repair=5)) as app:
        pa, pb, fred = await _setup(app)
        await _publish(pa, pb, 1, "seen")
        await fred.data(2)
        await fred.close()
        await _publish(pa, pb, 4, "missed")
        await _link_at(app, 10)
        head = app.core.links.last(LINK)
        fred = await Wire.connect(app.port, FRED)
        jade = await Wire.connect(app.port, "jade@example.com")
        # 8 to resend, 5 allowed
        await fred.ask(RepairRequest(LINK, 3, (SourcePosition(PA, 1), SourcePosition(PB, 1))))
        got, refused = await fred.until_reply(3)
        assert got == [] and refused.code == 570
        assert (refused.epoch, refused.link_seq) == (0, 10)
        # someone else's link
        await jade.ask(RepairRequest(LINK, 4))
        got, other = await jade.until_reply(4)
        assert got == [] and other.code == 537
        # a link the broker never had
        await fred.ask(RepairRequest("no-such-link", 5))
        _, unknown = await fred.until_reply(5)
        assert unknown.code == 553
        # nothing changed: same epoch and head, and live data go on in epoch 0
        assert app.core.links.last(LINK) == head
        await _publish(pa, pb, 1, "after")
        live = await fred.data(2)
        assert [(s.epoch, s.link_seq) for s in live] == [(0, 11), (0, 12)]
        # within the limit it is served
        await fred.ask(RepairRequest(LINK, 6, (SourcePosition(PA, 4), SourcePosition(PB, 4))))
        got, done = await fred.until_reply(6)
        assert (done.code, done.epoch, done.link_seq) == (250, 1, 4)
        assert [key(g.stamp) for g in got[1:] if g.stamp is not None] == [
            (PA, 5), (PA, 6), (PB, 5), (PB, 6)]
        for c in (pa, pb, fred, jade):
            await c.close()


def test_refused_repairs_change_nothing(kafka_config: KafkaConfig) -> None:
    asyncio.run(_refused(kafka_config))


async def _stub(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        pa, pb, wire = await _setup(app, take_reset=False)
        caps = await pa.capabilities()  # what the stub is told to expect
        stub = Resequencer(LINK, caps.seq_bits, caps.heartbeat_ms / 1000, max_gap=caps.max_gap)
        loop = asyncio.get_running_loop()
        delivered: list[Stamp] = []
        asked: list[RequestGap | RequestRepair] = []
        resets: list[Reset] = []
        lose = 0  # data items the "network" loses before they reach the stub

        async def pump(until: int) -> None:
            """Feed the stub what arrives, and send what it asks, until `until` delivered."""
            nonlocal lose
            while len(delivered) < until or not stub.idle:
                item = await wire.next()
                now = loop.time()
                if item.reply is not None:
                    actions = stub.on_reply(item.reply, now)
                else:
                    assert item.stamp is not None
                    if lose and item.stamp.kind is StampKind.DATA:
                        lose -= 1
                        continue
                    actions = stub.receive(item.stamp, item.content, now)
                for action in actions:
                    if isinstance(action, Deliver):
                        delivered.append(action.stamp)
                    elif isinstance(action, RequestGap | RequestRepair):
                        asked.append(action)
                        await wire.ask(action.document())
                    elif isinstance(action, Reset):
                        resets.append(action)

        await _publish(pa, pb, 2, "one")
        await pump(4)
        assert stub.positions().epoch == 0 and not asked
        # three data are lost on the way: the stub asks for the hole, the broker's 1 ms link
        # retention makes that 569, and the stub repairs by source on its own
        lose = 3
        await _publish(pa, pb, 3, "two")
        await pump(10)
        assert [type(a) for a in asked] == [RequestGap, RequestRepair]
        assert len(resets) == 1 and "569" in resets[0].reason
        repair = asked[1]
        assert isinstance(repair, RequestRepair)
        assert {p.source: p.after for p in repair.sources} == {PA: 2, PB: 2}
        assert stub.positions().epoch == 1
        await _publish(pa, pb, 2, "three")
        await pump(14)
        # every message once, per source in order, and the stub is at rest in the new epoch
        journal = app.core.journal
        published = [(e.source, e.source_seq) for src in (PA, PB) for e in journal.read_source(src)]
        assert sorted(key(s) for s in delivered) == sorted(published)
        for src in (PA, PB):
            assert [key(s)[1] for s in delivered if key(s)[0] == src] == list(range(1, 8))
        assert (stub.counters.resets, stub.counters.repairs, stub.counters.lost) == (1, 1, 0)
        assert stub.idle and stub.positions().sources == {PA: 7, PB: 7}
        for c in (pa, pb, wire):
            await c.close()


def test_the_subscriber_stub_repairs_a_lost_link_context(kafka_config: KafkaConfig) -> None:
    asyncio.run(_stub(dataclasses.replace(kafka_config, link_retention_ms=1)))
