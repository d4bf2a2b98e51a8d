"""dataHopping stops a forwarding loop between two brokers (RFC 3342 §4, pubsub draft §3): each
redistributes the other's topic of the same name, so a publication circles between them; every
crossing spends a hop, and when none is left the relay drops it and reports 550."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import pytest

from adapters.client.pubsub_client import PubsubClient
from broker.codec import default_codec
from broker.journal import SCHEMA as JOURNAL_SCHEMA
from broker.kafka_io import KafkaConfig, read_partition
from broker.names import DEFAULT_HOPS
from tests.integration.broker_process import logged, start_broker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Each domain lets its own endpoints do everything and the other's redistributor subscribe.
ACCESS = """<access domain='{me}'>
  <allow id='locals' originator='*@{me}' tokens='pubsub:all core:data' />
  <allow id='peer-redistributor' originator='apex=pubsub/loop.t@{other}'
         tokens='pubsub:subscribe pubsub:cancel' topic='loop.t' />
</access>
"""


async def _loop(bootstrap: str, ns_a: str, ns_b: str, tmp: Path) -> None:
    for me, other in (("a.example", "b.example"), ("b.example", "a.example")):
        (tmp / f"{me}.xml").write_text(ACCESS.format(me=me, other=other))
    one = ("--journal-partitions", "1")  # the copies are counted on partition 0
    b, b_port = await start_broker(
        bootstrap, *one, "--domain", "b.example", "--accept-peer", "a.example",
        "--redistribute", "loop.t@a.example", "--access", str(tmp / "b.example.xml"),
        namespace=ns_b)
    a, a_port = await start_broker(
        bootstrap, *one, "--domain", "a.example", "--peer", f"b.example=127.0.0.1:{b_port}",
        "--redistribute", "loop.t@b.example", "--access", str(tmp / "a.example.xml"),
        namespace=ns_a)
    try:
        await asyncio.gather(
            logged(a, "redistribution subscribe answered", code=250),
            logged(b, "redistribution subscribe answered", code=250))
        fred = await PubsubClient.connect("127.0.0.1", a_port, "fred@a.example")
        await fred.publish("loop.t", b"round and round")
        # the relay that runs out of hops reports to the service that forwarded last
        done, pending = await asyncio.wait(
            [asyncio.create_task(logged(p, "delivery report")) for p in (a, b)],
            return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            task.result()
        await fred.close()
    finally:
        for proc in (a, b):
            proc.send_signal(signal.SIGINT)
        for proc in (a, b):
            await asyncio.wait_for(proc.communicate(), 60)


def _copies(config: KafkaConfig) -> int:
    """Journal records of loop.t (not the well-known topics' records the service writes)."""
    codec = default_codec()
    return sum(1 for rec in read_partition(config, config.topic("journal"), 0)
               if rec.value is not None
               and codec.decode(rec.value, expect=JOURNAL_SCHEMA)[1]["topic"] == "loop.t")


def test_data_hopping_stops_a_loop_between_two_brokers(kafka_bootstrap: str,
                                                       tmp_path: Path) -> None:
    ns_a, ns_b = f"t{uuid.uuid4().hex[:12]}", f"t{uuid.uuid4().hex[:12]}"
    asyncio.run(_loop(kafka_bootstrap, ns_a, ns_b, tmp_path))
    copies = [_copies(KafkaConfig(bootstrap=kafka_bootstrap, namespace=ns))
              for ns in (ns_a, ns_b)]
    # The first publication plus one copy per crossing, and a crossing costs a hop.
    assert 2 <= sum(copies) <= DEFAULT_HOPS + 1, copies
    assert abs(copies[0] - copies[1]) <= 1, copies
