"""Link seq wrap at 16-bit resolution, end to end (docs/robust-binding.md §1, §5.1): a link's
seqs go 65535 → 1 (never 0, which is only a reset), and a gap that straddles the wrap is refilled
exactly by one wrap-around range request. Real Kafka, real BEEP over TCP.

The link is brought near the wrap the cheap way a real idle link gets there: heartbeats (65,525
of them, written to the links topic in a few batches before the broker starts, as the broker's
own heartbeat path writes them). The broker then recovers the link from Kafka, and published
messages carry it across the wrap."""

from __future__ import annotations

import asyncio

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, PubsubClient
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.robust.config import RobustConfig
from broker.robust.link_records import LinkItem
from common.errors import InvalidParameter

pytestmark = pytest.mark.kafka

WRAP = 65_535
LINK, WHO = "jade-wrap", "jade@example.com"
#: heartbeats before the first message: the messages take seqs 65526..65535, 1, 2, …
HEARTBEATS = WRAP - 10
MESSAGES = 30
#: the deliveries the subscriber pretends it lost: the last 6 before the wrap, the first 3 after
LOST_FROM, LOST_TO = WRAP - 5, 3


def _near_the_wrap(config: KafkaConfig, robust: RobustConfig) -> None:
    core = BrokerCore(config, robust=robust)
    core.open()
    try:
        core.links.claim(LINK, WHO)
        for start in range(0, HEARTBEATS, 10_000):
            core.links.append_sync([LinkItem.heartbeat(LINK)]
                                   * min(10_000, HEARTBEATS - start), timeout_s=120)
        head = core.links.last(LINK)
        assert head is not None and head.link_seq == HEARTBEATS
        # every record durable: a clean stop, so the broker keeps the link's epoch
        # (robust-binding §2.5)
        core.fanout.stopped_clean(core.links.writer)
    finally:
        core.close()


async def _wrap(config: KafkaConfig) -> None:
    robust = RobustConfig(seq_bits=16, heartbeat_ms=600_000, max_gap=1_000)
    await asyncio.to_thread(_near_the_wrap, config, robust)
    async with BrokerApp(config, robust=robust) as app:
        pub = await PubsubClient.connect("127.0.0.1", app.port, "pub@example.com")
        jade = await PubsubClient.connect("127.0.0.1", app.port, WHO)
        await pub.create_topic("q.wrap")
        await jade.subscribe("q.wrap", 3600, link=LINK)
        for k in range(MESSAGES):
            await pub.publish("q.wrap", f"m{k}".encode())

        got: list[Delivered] = []
        events = jade.events()
        while len(got) < MESSAGES:
            event = await asyncio.wait_for(anext(events), 30)
            if isinstance(event, Delivered):
                got.append(event)
        stamps = [d.stamp for d in got]
        # the link wraps to 1, never through 0
        expected = [(HEARTBEATS + n) % WRAP + 1 for n in range(MESSAGES)]
        assert [s.link_seq for s in stamps if s is not None] == expected
        assert {s.epoch for s in stamps if s is not None} == {0}  # no reset on the way
        gone = {*range(LOST_FROM, WRAP + 1), *range(1, LOST_TO + 1)}
        lost = [i for i, seq in enumerate(expected) if seq in gone]
        assert [expected[i] for i in lost] == [*range(LOST_FROM, WRAP + 1),
                                               *range(1, LOST_TO + 1)]

        # one wrap-around range fills exactly the lost deliveries: same link and source seqs
        reply = await jade.gap(LINK, LOST_FROM, LOST_TO)
        assert (reply.code, reply.link_seq) == (250, LOST_TO)
        refilled: list[Delivered] = []
        while len(refilled) < len(lost):
            event = await asyncio.wait_for(anext(events), 30)
            if isinstance(event, Delivered) and event.stamp is not None and event.stamp.refill:
                refilled.append(event)
        for i, item in zip(lost, refilled, strict=True):
            live, again = got[i].stamp, item.stamp
            assert live is not None and again is not None
            assert (again.link, again.epoch, again.link_seq, again.source, again.source_seq) \
                == (live.link, live.epoch, live.link_seq, live.source, live.source_seq)
            assert item.content == got[i].content == f"m{i}".encode()
        # and a backwards range that is not a wrap-around one is refused
        with pytest.raises(InvalidParameter):  # 553
            await jade.gap(LINK, 20, 10)
        for c in (pub, jade):
            await c.close()


def test_link_seq_wraps_at_16_bits_and_a_straddling_gap_is_refilled(
        kafka_config: KafkaConfig) -> None:
    asyncio.run(_wrap(kafka_config))
