"""Distributed subscription management (draft-schwartz-apex-pubsub §2.4, §4.5 step 4, §4.6 step 3)
with two `apexps broker` processes of different domains over a relay-relay link: redistr.com
redistributes example.com's music.jazz; wilma@redistr.com's subscribe sent to example.com is
forwarded to redistr.com, whose reply comes back to her, and example.com's data reach her
through redistr.com's own journal."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from adapters.client.pubsub_client import Delivered, PubsubClient
from tests.integration.broker_process import logged, start_broker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ORIGIN_ACCESS = """<access domain='example.com'>
  <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
  <allow id='redistributor' originator='apex=pubsub/music.jazz@redistr.com'
         tokens='pubsub:subscribe pubsub:cancel' topic='music.jazz' />
  <allow id='remote-subscribers' originator='*@redistr.com'
         tokens='pubsub:subscribe pubsub:cancel' topic='music.jazz' />
</access>
"""


async def _scenario(bootstrap: str, access: Path) -> tuple[bytes, list[str]]:
    origin, origin_port = await start_broker(bootstrap, "--domain", "example.com", "--access",
                                        str(access), "--accept-peer", "redistr.com")
    admin = await PubsubClient.connect("127.0.0.1", origin_port, "admin@example.com")
    await admin.create_topic("music.jazz")
    redistr, redistr_port = await start_broker(
        bootstrap, "--domain", "redistr.com", "--peer", f"example.com=127.0.0.1:{origin_port}",
        "--redistribute", "music.jazz@example.com")
    try:
        answered = await logged(redistr, "redistribution subscribe answered")
        assert answered["code"] == 250
        # wilma asks example.com's service; it forwards to redistr.com, which subscribes her
        wilma = await PubsubClient.connect("127.0.0.1", redistr_port, "wilma@redistr.com",
                                           service_domain="example.com")
        await wilma.subscribe("music.jazz", 600)  # raises unless the passed-on reply is 250
        await admin.publish("music.jazz", b"So What")
        got = await asyncio.wait_for(anext(wilma.events()), 30)
        assert isinstance(got, Delivered)
        assert got.originator == "apex=pubsub/music.jazz@redistr.com"
        local = await PubsubClient.connect("127.0.0.1", redistr_port, "barney@redistr.com")
        topics = await local.list_topics()
        await wilma.cancel("music.jazz")  # forwarded the same way (§4.6 step 3)
        for client in (wilma, local, admin):
            await client.close()
        return got.content, topics
    finally:
        for proc in (origin, redistr):
            proc.send_signal(signal.SIGINT)
        for proc in (origin, redistr):
            await asyncio.wait_for(proc.communicate(), 60)


def test_redistributor_takes_subscriptions_for_its_domain(kafka_bootstrap: str,
                                                          tmp_path: Path) -> None:
    access = tmp_path / "origin-access.xml"
    access.write_text(ORIGIN_ACCESS)
    content, topics = asyncio.run(_scenario(kafka_bootstrap, access))
    assert content == b"So What"
    assert topics == ["music.jazz"]
