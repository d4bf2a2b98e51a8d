"""A feed's rules on fakes (no broker, no HTTP): fan-out to bounded streams, a slow stream cut
alone, the gap fill that takes its refilled items out of the link's traffic and passes the
rest to the robust subscriber, and a link reset that ends every stream with an event whose id
(0) brings the browser back to the new epoch's start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from adapters.apex.robust_stamp import Stamp
from adapters.client.pubsub_client import Delivered, LinkListener, LinkTraffic
from adapters.client.robust_client import Message
from adapters.gateway._api import ReplayBuffer, SubscribeRequest
from adapters.gateway._feeds import Feed
from adapters.gateway._upstream import Upstream
from broker.records import PublishType

LINK = "web/gw-1@example.com"


def _stamp(seq: int, epoch: int = 0, *, refill: bool = False) -> Stamp:
    return Stamp(LINK, seq, epoch=epoch, source="pub@example.com", source_seq=seq,
                 publish_type=PublishType.UPDATE, topic="q", refill=refill)


@dataclass
class _Caps:
    max_gap: int


@dataclass
class _Client:
    """What a feed uses of `PubsubClient`; `gap` plays the broker's refill through the link
    listener, as the real one does, before it answers."""

    passed: list[LinkTraffic] = field(default_factory=list)
    listener: LinkListener | None = None
    gaps: list[tuple[int, int | None]] = field(default_factory=list)

    async def events(self) -> AsyncIterator[object]:
        """The client's events: none here (the feed watches them for the broker's end)."""
        await asyncio.Event().wait()
        yield None

    def link_listener(self, link: str) -> LinkListener | None:
        return self.listener or self.passed.append

    def listen_link(self, link: str, listener: LinkListener) -> None:
        self.listener = listener

    async def capabilities(self) -> _Caps:
        return _Caps(max_gap=3)

    async def gap(self, link: str, lo: int, hi: int | None = None,
                  epoch: int | None = None) -> None:
        self.gaps.append((lo, hi) if epoch == 0 else (epoch, lo, hi))
        assert self.listener is not None and hi is not None
        for seq in range(lo, hi + 1):
            self.listener(Delivered("q", "x", f"r{seq}".encode(), "text/plain",
                                    _stamp(seq, epoch or 0, refill=True)))
        # meanwhile, the stub's own refill of a later hole and a live delivery
        self.listener(Delivered("q", "x", b"stub", "text/plain", _stamp(50, refill=True)))
        self.listener(Delivered("q", "x", b"live", "text/plain", _stamp(60)))


class _Robust:
    def __init__(self) -> None:
        self.link = LINK
        self.queue: asyncio.Queue[Message] = asyncio.Queue()

    async def messages(self) -> AsyncIterator[Message]:
        while True:
            yield await self.queue.get()


def _feed(replay: int = 8, stream_limit: int = 4) -> tuple[Feed, _Client, _Robust]:
    client, robust = _Client(), _Robust()
    feed = Feed("f1", "web", SubscribeRequest("q"),
                Upstream(client, robust),  # type: ignore[arg-type]
                ReplayBuffer(replay), stream_limit)
    feed.start()
    return feed, client, robust


async def _settle(robust: _Robust) -> None:
    while not robust.queue.empty():
        await asyncio.sleep(0)
    await asyncio.sleep(0)


def _send(robust: _Robust, *seqs: int, epoch: int = 0) -> None:
    for seq in seqs:
        robust.queue.put_nowait(Message(_stamp(seq, epoch), f"m{seq}".encode(), "text/plain"))


async def _drain(stream: Any) -> list[int]:
    out = []
    while stream._items:
        item = await stream.get()
        out.append(item[0])
    return out


def test_fan_out_and_a_slow_stream_is_cut_alone() -> None:
    """Two streams get every delivery; one that does not read is closed at its bound (4)
    and dropped, the other goes on."""
    async def body() -> None:
        feed, _, robust = _feed()
        fast, _ = feed.open_stream(None)
        slow, _ = feed.open_stream(None)
        got = []
        for seq in range(1, 8):
            _send(robust, seq)
            await _settle(robust)
            got += await _drain(fast)
        assert got == list(range(1, 8))
        assert slow.closed == "slow reader" and slow not in feed.streams
        assert fast in feed.streams and len(slow._items) == 4
    asyncio.run(body())


def test_gap_fill_takes_its_refills_and_passes_the_rest() -> None:
    """Deliveries 2..8 again: their link range (link seqs 2..8 of epoch 0), chunked by the
    service's max gap (3), comes back to the feed under the same delivery numbers; a refill
    outside it and live traffic go to the robust subscriber."""
    async def body() -> None:
        feed, client, robust = _feed(replay=2)
        _send(robust, *range(1, 11))
        await _settle(robust)
        got = await feed.refill(2, 8)
        assert [seq for seq, _ in got] == list(range(2, 9))
        assert client.gaps == [(2, 4), (5, 7), (8, 8)]
        assert b'"content":"r5"' in got[3][1] and got[3][1].startswith(b"id: 5\n")
        # what came meanwhile and was not asked for went on to the robust subscriber
        assert [d.stamp.link_seq for d in client.passed] == [50, 60] * 3  # type: ignore[union-attr]
        assert feed.refilled == 7
        client.passed.clear()
        assert client.listener is not None
        other = Delivered("q", "x", b"s", "text/plain", _stamp(9, refill=True))
        live = Delivered("q", "x", b"l", "text/plain", _stamp(3))
        client.listener(other)
        client.listener(live)
        assert client.passed == [other, live]  # nobody asked: the stub's business
    asyncio.run(body())


def test_a_link_reset_changes_nothing_for_the_streams() -> None:
    """Link seqs 1..3 of epoch 0, then the link is reset (a broker killed with -9: epoch 1,
    seqs from 1 again) and the robust subscriber goes on: the stream's ids go on 4, 5 (the
    feed's own delivery numbers), each event names its link seq and epoch, and a stream that
    comes back after 2, once the buffer no longer holds it, is refilled across the reset
    from the right link ranges."""
    async def body() -> None:
        feed, client, robust = _feed(replay=2, stream_limit=16)
        old, _ = feed.open_stream(None)
        _send(robust, 1, 2, 3)
        _send(robust, 1, 2, epoch=1)
        await _settle(robust)
        items = [await old.get() for _ in range(5)]
        assert [seq for seq, _ in items] == [1, 2, 3, 4, 5]  # type: ignore[misc]
        assert old.closed is None and b'"seq":2,"epoch":1' in items[4][1]  # type: ignore[index]
        new, gap = feed.open_stream(2)
        assert gap == (3, 3) and await _drain(new) == [4, 5]
        got = await feed.refill(*gap)
        assert [seq for seq, _ in got] == [3] and client.gaps == [(3, 3)]
        got = await feed.refill(2, 4)  # 2..3 of epoch 0, then 1 of epoch 1
        assert [seq for seq, _ in got] == [2, 3, 4]
        assert client.gaps[1:] == [(2, 3), (1, 1, 1)]
    asyncio.run(body())


def test_replay_buffer_epochs() -> None:
    buf = ReplayBuffer(2)
    assert buf.next_epoch(0) is False and buf.epoch == 0
    for seq in (1, 2, 3):
        buf.add(seq, b"")
    assert buf.next_epoch(0) is False and buf.evicted == 1
    assert buf.next_epoch(1) is True
    assert len(buf) == 0 and buf.evicted == 0 and buf.last == 0
    buf.add(1, b"")  # seqs start again
    # a first delivery in a later epoch (the feed started after a reset) is no reset
    fresh = ReplayBuffer(2)
    assert fresh.next_epoch(5) is False and fresh.epoch == 5


def test_a_shared_link_refill_asks_for_its_own_seqs_and_keeps_only_them() -> None:
    """On a user's shared link a watch's deliveries are not consecutive (link seqs 1, 3, 5 …
    here; the even ones are other watches'): a refill groups them into gap requests that span
    at most the max gap (3), skips the seqs between groups, and keeps only the feed's own seqs
    of what comes back, under their delivery numbers."""
    async def body() -> None:
        feed, client, robust = _feed(replay=2)
        _send(robust, 1, 3, 5, 7, 9, 11, 20, 40)
        await _settle(robust)
        got = await feed.refill(1, 8)
        assert [seq for seq, _ in got] == list(range(1, 9))
        assert client.gaps == [(1, 3), (5, 7), (9, 11), (20, 20), (40, 40)]
        assert [e.split(b'"seq":')[1].split(b",")[0] for _, e in got] == [
            b"1", b"3", b"5", b"7", b"9", b"11", b"20", b"40"]
        assert feed.refilled == 8
    asyncio.run(body())


def test_an_ended_feed_serves_what_it_held_and_no_more() -> None:
    """Once the broker ended the subscription (here before anyone read it: a watch's
    terminated Notify may come before the gateway's answer to the POST), a stream opened on
    the feed gets what the buffer holds and is closed, not left waiting; later deliveries are
    not taken."""
    async def body() -> None:
        feed, _, robust = _feed()
        _send(robust, 1, 2)
        await _settle(robust)
        feed._ended_by_broker("gone")
        assert feed.ended
        stream, gap = feed.open_stream(0)
        assert gap is None and await _drain(stream) == [1, 2]
        assert stream.closed == "ended" and await stream.get() is None
        assert stream not in feed.streams
        feed.deliver(Message(_stamp(3), b"m3", "text/plain"))
        assert feed.buffer.last == 2
    asyncio.run(body())
