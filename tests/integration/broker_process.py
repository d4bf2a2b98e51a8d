"""`apexps broker` as a separate process, for tests that kill, restart or link brokers."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

__all__ = ["logged", "start_broker"]


async def start_broker(bootstrap: str, *args: str, namespace: str | None = None,
                       logs: bool = True, port: int = 0) -> tuple[asyncio.subprocess.Process, int]:
    """Start `apexps broker` on `port` (0: any free one); return it and its APEX port once it
    listens. With `logs`, its JSON log lines are on the process's stderr (see `logged`);
    otherwise it logs only warnings, to nowhere."""
    level = ["--log-json"] if logs else ["--log-level", "warning"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "adapters.cli.main", *level, "broker", "--bootstrap", bootstrap,
        "--namespace", namespace or f"t{uuid.uuid4().hex[:12]}", "--listen", f"127.0.0.1:{port}",
        *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE if logs else asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
    assert line.startswith("apex: 127.0.0.1:"), line
    return proc, int(line.split()[1].rpartition(":")[2])


async def logged(proc: asyncio.subprocess.Process, event: str, timeout: float = 90,
                 **fields: object) -> dict[str, object]:
    """The first log record of `event` (with these field values) the broker writes from now."""
    return await asyncio.wait_for(_logged(proc, event, fields), timeout)


async def _logged(proc: asyncio.subprocess.Process, event: str,
                  fields: dict[str, object]) -> dict[str, object]:
    assert proc.stderr is not None
    while True:
        line = await proc.stderr.readline()
        assert line, f"the broker exited before logging {event!r}"
        record = json.loads(line) if line.startswith(b"{") else {}
        if record.get("event") == event and all(record.get(k) == v for k, v in fields.items()):
            return dict(record)
