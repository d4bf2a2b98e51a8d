"""A data over the relay's BEEP message cap, over real loopback TCP: the ERR the BEEP layer
answers with reaches the sender as a clear `TransactionFailed` (554), the relay logs one line,
and the same connection then sends data that is delivered (DESIGN invariant 7). The cap is
lowered to 64 KiB so the test moves little; tests/integration/test_schemas_wire.py sends 10 MB
to the real broker under its default cap.
"""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from adapters.apex.relay import Relay
from adapters.apex.server import APEX_WINDOW, ApexServer
from adapters.beep import BeepConfig
from adapters.client.client import ApexClient
from common.errors import TransactionFailed

CAP = 64 * 1024
#: Seconds a test waits for what must happen at once; never slept, only awaited.
PROMPT = 10.0


async def _oversized_then_small() -> tuple[TransactionFailed, bytes, list[dict[str, object]]]:
    config = BeepConfig(window_size=APEX_WINDOW, max_message_size=CAP)
    with capture_logs() as logs:
        async with ApexServer(Relay("example.com"), config=config) as server:
            fred = await ApexClient.connect("127.0.0.1", server.port, PROMPT)
            bob = await ApexClient.connect("127.0.0.1", server.port, PROMPT)
            try:
                await fred.attach("fred@example.com")
                await bob.attach("bob@example.com")
                with pytest.raises(TransactionFailed) as refused:
                    await fred.send("fred@example.com", ["bob@example.com"], b"x" * (3 * CAP))
                await fred.send("fred@example.com", ["bob@example.com"], b"small")
                delivered = await asyncio.wait_for(anext(aiter(bob.receive())), PROMPT)
            finally:
                await fred.close()
                await bob.close()
    return refused.value, delivered.content, logs


def test_an_oversized_data_is_refused_and_the_connection_goes_on() -> None:
    """Three times the cap: 554 naming the limit, one `message refused` line (no violation), nothing
    delivered of it; the next data on the same connection is delivered."""
    refused, delivered, logs = asyncio.run(_oversized_then_small())
    assert int(refused.code) == 554
    assert f"exceeds the limit of {CAP} octets" in str(refused)
    assert delivered == b"small"
    [line] = [e for e in logs if e["event"] == "message refused"]
    assert (line["code"], line["limit"]) == (554, CAP) and line["size"] > 3 * CAP
    assert not [e for e in logs if e["event"] == "protocol violation"]
