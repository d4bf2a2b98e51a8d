"""The pure parts of the robust client: the positions file (atomic, round trip, bad input), the
routing of a link's traffic and transIDs in `PubsubClient`, and what `RobustSubscriber` commits
as processed. The transport is a fake that answers the capability query; everything above it
(PubsubClient, the stub, the subscriber) is the real code. The live path over Kafka and TCP is
tests/integration/test_robust_subscriber.py."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

import pytest

from adapters.apex.codec import BEEP_XML, Data, Option
from adapters.apex.endpoint import Endpoint
from adapters.apex.robust_codec import (
    MAX_TRANS_ID,
    Capabilities,
    CapabilityQuery,
    GapRequest,
    Heartbeat,
    LinkReply,
    decode_robust,
    encode_robust,
)
from adapters.apex.robust_stamp import Stamp, StampKind, stamp_option
from adapters.client.pubsub_client import Delivered, LinkEvent, LinkTraffic, PubsubClient
from adapters.client.reconnect import (
    ConnectionEvent,
    Reconnected,
    ReconnectingApexClient,
    ReconnectPolicy,
)
from adapters.client.resequencer import Positions, RequestGap, Resequencer
from adapters.client.robust_client import Message, PositionsFile, RobustSubscriber
from broker.records import PublishType
from common.errors import ConfigError, InvalidParameter, ParameterSyntaxError

ME = Endpoint.parse("jade@example.com")
SERVICE = Endpoint("apex=pubsub", "example.com")
A = "a@example.com"
L = "desk-1"


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


# --- the positions file -------------------------------------------------------------------


def test_positions_round_trip_through_the_file(tmp_path: Path) -> None:
    """What `save` wrote, `load` reads back; before the first save there is nothing."""
    file = PositionsFile(tmp_path / "p.json")
    assert file.load() is None
    saved = Positions(L, 16, 3, 65_000, 1_712_345_678_901, {A: 7, "b@example.com": 2**40})
    file.save(saved)
    assert file.load() == saved
    file.save(Positions(L, 16, 4, 1, None, {}))
    assert file.load() == Positions(L, 16, 4, 1, None, {})
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary file left


def test_a_failed_save_leaves_the_old_positions(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """If the rename fails, the file still holds the old positions and no temporary file is
    left behind; the error says which file."""
    file = PositionsFile(tmp_path / "p.json")
    old = Positions(L, 32, 0, 5, None, {A: 5})
    file.save(old)

    def broken(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(ConfigError, match=r"p\.json"):
        file.save(Positions(L, 32, 0, 6, None, {A: 6}))
    monkeypatch.undo()
    assert file.load() == old
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]
    with pytest.raises(ConfigError, match="cannot write"):
        PositionsFile(tmp_path / "no" / "such" / "dir.json").save(old)


def test_a_file_that_is_not_positions_is_refused(tmp_path: Path) -> None:
    """Garbage is 501, a path that cannot be read is a ConfigError; neither changes the file."""
    path = tmp_path / "p.json"
    path.write_bytes(b"\x00not json")
    with pytest.raises(ParameterSyntaxError):
        PositionsFile(path).load()
    assert path.read_bytes() == b"\x00not json"
    with pytest.raises(ConfigError, match="cannot read"):
        PositionsFile(tmp_path).load()  # a directory


# --- a fake transport under the real PubsubClient -------------------------------------------


class FakeApex:
    """Stands in for ApexClient: `deliver` puts data in front of the client; `send` records
    what the client sends and answers a capability query as a broker would."""

    timeout = 5.0

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Data | None] = asyncio.Queue()
        self.consumer: Callable[[Data | None], None] | None = None
        self.sent: list[object] = []
        self.posted = asyncio.Event()

    async def receive(self) -> AsyncIterator[Data]:
        while (data := await self.inbox.get()) is not None:
            yield data

    def deliver_to(self, callback: Callable[[Data | None], None]) -> None:
        while not self.inbox.empty():
            callback(self.inbox.get_nowait())
        self.consumer = callback

    def _put(self, data: Data | None) -> None:
        # as ApexClient does: to the consumer, from the event loop (as a read would)
        if self.consumer is None:
            self.inbox.put_nowait(data)
        else:
            asyncio.get_running_loop().call_soon(self.consumer, data)

    async def send(self, originator: Endpoint, recipients: Iterable[Endpoint], content: bytes,
                   content_type: str = "application/octet-stream", *,
                   options: Iterable[Option] = ()) -> None:
        doc = decode_robust(content)
        self.sent.append(doc)
        self.posted.set()
        if isinstance(doc, CapabilityQuery):
            self.reply(Capabilities(16, 5_000, 60_000, 100, 1_000, -1, trans_id=doc.trans_id))

    async def close(self) -> None:
        self._put(None)

    def reply(self, doc: Capabilities | LinkReply) -> None:
        self._put(Data(SERVICE, (ME,), encode_robust(doc), BEEP_XML, content_ref="#Content"))

    def stamped(self, stamp: Stamp, content: bytes = b"", content_type: str = "text/plain",
                ) -> None:
        if stamp.kind is StampKind.DATA:
            origin = Endpoint("apex=pubsub", "example.com", stamp.topic)
            body, kind, ref = content, content_type, None
        else:
            origin, body, kind, ref = SERVICE, encode_robust(Heartbeat(5_000)), BEEP_XML, \
                "#Content"
        self._put(Data(origin, (ME,), body, kind, recipient_options=((stamp_option(stamp),),),
                       content_ref=ref))

    async def next_posted(self) -> object:
        while not self.sent:
            self.posted.clear()
            await asyncio.wait_for(self.posted.wait(), 5)
        return self.sent.pop(0)


def data(seq: int, sseq: int, link: str = L, refill: bool = False) -> Stamp:
    return Stamp(link, seq, StampKind.DATA, 0, A, sseq, PublishType.UPDATE, "q.t",
                 time=1_000 + seq, refill=refill)


def reset(link: str = L) -> Stamp:
    return Stamp(link, 0, StampKind.RESET, 0, time=1_000)


def client_over(fake: FakeApex) -> PubsubClient:
    return PubsubClient(fake, ME)  # type: ignore[arg-type]


async def settle() -> None:
    """Let the client route what the fake put in front of it."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_links_traffic_goes_to_its_listener_and_the_rest_to_events() -> None:
    """Stamped data, heartbeats and unclaimed linkreplies of a listened link go to its listener;
    a reply some request awaits resolves that request; other links' data go to events()."""
    async def body() -> None:
        fake = FakeApex()
        client = client_over(fake)
        heard: list[LinkTraffic] = []
        client.listen_link(L, heard.append)
        fake.stamped(data(1, 1), b"m1")
        fake.stamped(Stamp(L, 2, StampKind.HEARTBEAT, 0))
        fake.stamped(data(1, 1, link="other"), b"x")
        fake.reply(LinkReply(250, L, 99))  # nobody waits for 99: the listener's
        await settle()
        assert [type(x) for x in heard] == [Delivered, LinkEvent, LinkReply]
        assert isinstance(heard[0], Delivered) and heard[0].content == b"m1"
        events = client.events()
        other = await asyncio.wait_for(anext(events), 5)
        assert isinstance(other, Delivered) and other.stamp is not None
        assert other.stamp.link == "other"
        # a reply to the client's own gap request resolves it, and only it
        asking = asyncio.create_task(client.gap(L, 1, 1))
        request = await fake.next_posted()
        assert isinstance(request, GapRequest)
        fake.reply(LinkReply(250, L, request.trans_id, 0, 1))
        assert (await asking).link_seq == 1
        assert len(heard) == 3
        client.unlisten_link(L)
        fake.stamped(data(2, 2), b"m2")
        assert isinstance(await asyncio.wait_for(anext(events), 5), Delivered)
        await fake.close()
        await settle()
        await client.close()
    run(body)


def test_the_listener_is_told_when_the_connection_is_gone_for_good() -> None:
    """When the transport's data end (no reconnection), the link listener gets None."""
    async def body() -> None:
        fake = FakeApex()
        client = client_over(fake)
        heard: list[LinkTraffic] = []
        client.listen_link(L, heard.append)
        await fake.close()
        await settle()
        assert heard == [None]
        await client.close()
    run(body)


def test_stub_and_client_draw_transids_from_one_counter() -> None:
    """A stub built on the client's counter never reuses a transID of the client's own
    requests; the counter wraps from 2^31-1 to 1 (RFC 3340's range)."""
    async def body() -> None:
        client = client_over(FakeApex())
        stub = Resequencer(L, 16, 1.0, request_ids=client.new_trans_id)
        stub.receive(reset(), b"", 0.0)
        mine = [client.new_trans_id() for _ in range(3)]
        asked = stub.receive(data(5, 5), b"", 0.0)  # a hole 1..4: one gap request
        theirs = [a.request_id for a in asked if isinstance(a, RequestGap)]
        assert theirs and not set(mine) & set(theirs)
        assert theirs[0] == mine[-1] + 1
        client._trans_ids = itertools.count(MAX_TRANS_ID)
        assert [client.new_trans_id() for _ in range(2)] == [MAX_TRANS_ID, 1]
        await client.close()
    run(body)


# --- what counts as processed ---------------------------------------------------------------


def test_close_commits_what_was_handed_out_and_a_restart_resumes_after_it(tmp_path: Path,
                                                                         ) -> None:
    """Three messages arrive, the application takes two and closes: the file holds the
    position after the second. A new subscriber from that file asks for everything after it
    and hands out the third once, although the broker sends the second again too."""
    async def body() -> None:
        state = tmp_path / "p.json"
        fake = FakeApex()
        client = client_over(fake)
        robust = await RobustSubscriber.open(client, L, state=state)
        assert robust.stub.space.bits == 16 and robust.stub.max_gap == 100
        fake.stamped(reset())
        for n in (1, 2, 3):
            fake.stamped(data(n, n), f"m{n}".encode(), "text/x-quote")
        messages = robust.messages()
        took = [await asyncio.wait_for(anext(messages), 5) for _ in range(2)]
        assert [(m.content, m.content_type, m.topic) for m in took] == [
            (b"m1", "text/x-quote", "q.t"), (b"m2", "text/x-quote", "q.t")]
        assert robust.positions().link_seq == 1  # m2 is out, not yet processed
        await robust.close()
        saved = PositionsFile(state).load()
        assert saved == Positions(L, 16, 0, 2, 1_002, {A: 2})
        with pytest.raises(StopAsyncIteration):  # closed: m3 is not handed out
            await anext(messages)
        await client.close()

        fake = FakeApex()
        client = client_over(fake)
        robust = await RobustSubscriber.open(client, state=state)
        assert isinstance(await fake.next_posted(), CapabilityQuery)
        resume = await fake.next_posted()
        assert isinstance(resume, GapRequest)
        assert (resume.link, resume.epoch, resume.link_from, resume.link_to) == (L, 0, 3, None)
        fake.stamped(data(2, 2, refill=True), b"m2")
        fake.stamped(data(3, 3, refill=True), b"m3")
        fake.reply(LinkReply(250, L, resume.trans_id, 0, 3))
        fake.stamped(data(4, 4), b"m4")
        messages = robust.messages()
        again = [await asyncio.wait_for(anext(messages), 5) for _ in range(2)]
        assert [m.content for m in again] == [b"m3", b"m4"]
        assert robust.refilled == 1 and robust.counters.duplicates == 1
        await robust.close()
        assert PositionsFile(state).load() == Positions(L, 16, 0, 4, 1_004, {A: 4})
        await client.close()
    run(body)


def test_a_state_file_of_another_link_is_refused(tmp_path: Path) -> None:
    """Positions of another link are a 553 and leave the file as it was."""
    async def body() -> None:
        file = PositionsFile(tmp_path / "p.json")
        file.save(Positions("elsewhere", 16, 0, 3, None, {}))
        client = client_over(FakeApex())
        with pytest.raises(InvalidParameter, match="elsewhere"):
            await RobustSubscriber.open(client, L, state=file)
        assert file.load() == Positions("elsewhere", 16, 0, 3, None, {})
        await client.close()
    run(body)


def test_notices_reach_the_callback_and_the_events_stream() -> None:
    """A hole is a gap request; its refill is a `Repaired` notice, given to `on_notice` and
    placed in `events()` between the messages, where it happened."""
    async def body() -> None:
        fake = FakeApex()
        client = client_over(fake)
        notices: list[object] = []
        robust = await RobustSubscriber.open(client, L, on_notice=notices.append)
        assert isinstance(await fake.next_posted(), CapabilityQuery)
        fake.stamped(reset())
        fake.stamped(data(1, 1), b"m1")
        fake.stamped(data(3, 3), b"m3")
        gap = await fake.next_posted()
        assert isinstance(gap, GapRequest) and (gap.link_from, gap.link_to) == (2, 2)
        fake.stamped(data(2, 2, refill=True), b"m2")
        events = robust.events()
        seen = [await asyncio.wait_for(anext(events), 5) for _ in range(4)]
        assert [type(e).__name__ for e in seen] == ["Message", "Repaired", "Message", "Message"]
        assert [e.content for e in seen if isinstance(e, Message)] == [b"m1", b"m2", b"m3"]
        assert notices == [seen[1]]
        assert robust.counters.holes == 1 and robust.counters.repaired == 1
        await robust.close()
        await client.close()
    run(body)


def test_every_reconnection_resumes_the_link_until_close() -> None:
    """On a reconnecting client each `Reconnected` makes the stub ask for everything after its
    frontier (an open-ended gap) on the new connection; after `close` nothing is asked."""
    async def body() -> None:
        first, second, third = FakeApex(), FakeApex(), FakeApex()
        dials = iter([second, third])

        async def dial() -> FakeApex:
            return next(dials)

        reconnecting = ReconnectingApexClient(
            dial, first, ReconnectPolicy(wait=0, wait_max=0))  # type: ignore[arg-type]
        reconnected: asyncio.Queue[ConnectionEvent] = asyncio.Queue()
        reconnecting.add_listener(reconnected.put_nowait)
        client = PubsubClient(reconnecting, ME)
        robust = await RobustSubscriber.open(client, L)
        assert isinstance(await first.next_posted(), CapabilityQuery)
        first.stamped(reset())
        first.stamped(data(1, 1), b"m1")
        messages = robust.messages()
        assert (await asyncio.wait_for(anext(messages), 5)).content == b"m1"
        await first.close()  # the connection is lost
        resume = await second.next_posted()
        assert isinstance(resume, GapRequest)
        assert (resume.link_from, resume.link_to, resume.epoch) == (2, None, 0)
        assert robust.resumes == 1
        second.reply(LinkReply(250, L, resume.trans_id, 0, 1))
        second.stamped(data(2, 2), b"m2")
        assert (await asyncio.wait_for(anext(messages), 5)).content == b"m2"
        await robust.close()
        await second.close()
        while not isinstance(await asyncio.wait_for(reconnected.get(), 5), Reconnected):
            pass
        while not isinstance(await asyncio.wait_for(reconnected.get(), 5), Reconnected):
            pass
        assert third.sent == [] and robust.resumes == 1
        await client.close()
    run(body)
