"""End to end: `apexps listen` and `apexps send` processes talking through an in-process relay."""

from __future__ import annotations

import asyncio
import json
import sys

from adapters.apex.relay import Relay
from adapters.apex.server import ApexServer

APEXPS = [sys.executable, "-m", "adapters.cli.main", "--log-level", "warning"]


async def _run() -> tuple[dict[str, object], int, int, bytes]:
    async with ApexServer(Relay("example.com")) as server:
        where = f"127.0.0.1:{server.port}"
        listener = await asyncio.create_subprocess_exec(
            *APEXPS, "listen", "--server", where, "--as", "barney@example.com", "--count", "1",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert listener.stderr is not None and listener.stdout is not None
        while b"attached as" not in await asyncio.wait_for(listener.stderr.readline(), 30):
            pass
        sender = await asyncio.create_subprocess_exec(
            *APEXPS, "send", "--server", where, "--as", "fred@example.com",
            "--to", "barney@example.com", "-", stdin=asyncio.subprocess.PIPE)
        await asyncio.wait_for(sender.communicate("yabba dabba doo \u2603".encode()), 30)
        line = await asyncio.wait_for(listener.stdout.readline(), 30)
        await asyncio.wait_for(listener.wait(), 30)
        refused = await asyncio.create_subprocess_exec(
            *APEXPS, "send", "--server", where, "--as", "fred@example.com",
            "--to", "wilma@example.com", "-", stdin=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(refused.communicate(b"x"), 30)
        assert sender.returncode is not None and refused.returncode is not None
        return json.loads(line), sender.returncode, refused.returncode, err


def test_send_and_listen_processes_exchange_data() -> None:
    """barney's listener prints fred's data as JSON; a send to nobody exits 1 with code 550."""
    record, sent, refused, err = asyncio.run(_run())
    assert record == {"originator": "fred@example.com", "recipients": ["barney@example.com"],
                      "content_type": "application/octet-stream",
                      "content": "yabba dabba doo \u2603"}
    assert sent == 0
    assert refused == 1 and b"error 550" in err
