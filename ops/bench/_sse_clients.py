"""The benchmark's browsers: SSE clients of the gateway, in the benchmark's own process or
spread over processes of their own (`bench_gateway --client-procs N`).

Why processes of their own. Browsers are separate machines; 1,000 clients in one Python
process are one event loop, and a stall of that loop (a collection, the scheduler taking its
core away on a loaded machine) delays every Notify in flight at once: at 1,000 Notifies a
second a 100 ms stall alone puts 100 of them, half the slowest 1 % of a 20 s window, into the
p99. Measured on the shared 2-core machine at load 7-16: the single process's loop lag p99
63-98 ms, max 321-538 ms, while its CPU was 0.06-0.14 of a core -- so it was no CPU
bottleneck, but one of three processes whose stalls make up the tail. With N processes a
client stall reaches 1/N of the clients, as it would for browsers.

A client records every event it receives as send time -> receipt time (one clock: one
machine); the caller cuts its measured window out of that afterwards, so a client process
needs no signal when the window starts. Each process also records its loop's lag (a 10 ms
timer's lateness) and its collections over 1 ms, timestamped the same way.

A child (`python -m ops.bench._sse_clients`) reads one JSON line on stdin (the gateway's URL
and its clients' topics and items), opens every stream, freezes its heap as the servers do,
says `ready`, and on the line `stop` writes one JSON line of what it saw and exits.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from adapters.cli import heap

__all__ = ["Client", "Readers", "Seen", "loop_lag", "pct"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Client:
    topic: str
    #: the message-id this client watches (--resources), None for a topic subscription
    item: str | None = None
    last: int = 0
    broken: int = 0
    #: send time (the key) -> receipt time, ns
    received: dict[str, int] = field(default_factory=dict)


@dataclass
class Seen:
    """What the clients saw, all processes together."""

    received: dict[str, int] = field(default_factory=dict)
    broken: int = 0
    #: (time ns, loop lag ms) and (time ns, collection ms) of the clients' processes
    lags: list[tuple[int, float]] = field(default_factory=list)
    gc: list[tuple[int, float]] = field(default_factory=list)


def pct(xs: list[float], p: int) -> float:
    return sorted(xs)[min(len(xs) - 1, len(xs) * p // 100)] if xs else float("nan")


async def loop_lag(lags: list[tuple[int, float]]) -> None:
    """How late a 10 ms timer fires on this process's loop: a late loop reads the clients'
    streams late, and its lag is added to every latency it measures."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append((time.time_ns(), (time.perf_counter() - t - 0.01) * 1e3))


class _Pauses:
    def __init__(self) -> None:
        self.over_1ms: list[tuple[int, float]] = []
        self._started = 0.0

    def timed(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif (took := time.perf_counter() - self._started) > 1e-3:
            self.over_1ms.append((time.time_ns(), took * 1e3))


async def _follow(http: aiohttp.ClientSession, url: str, client: Client,
                  ready: asyncio.Event) -> None:
    body: dict[str, object] = {"topic": client.topic}
    if client.item is not None:
        body = {"resource": f"{client.topic}/{client.item}", "events": ["modified"],
                "expires": 3600}
    async with http.post(f"{url}/subscriptions", json=body) as r:
        sub = await r.json()
        assert r.status == 201, sub
    async with http.get(sub["events"], timeout=aiohttp.ClientTimeout(total=None)) as r:
        ready.set()
        async for raw in r.content:
            line = raw.decode()
            if line.startswith("id: "):
                seq = int(line[4:])
                if seq <= client.last:  # heartbeats leave holes; a repeat is a bug
                    client.broken += 1
                client.last = seq
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if "versions" in data:  # a Notify: the newest version is what was sent
                    if data["current"] or not data["versions"]:
                        continue  # the watch's current state, not a change
                    sent = int(data["versions"][-1]["content"])
                else:
                    sent = int(data["content"])
                client.received[str(sent)] = time.time_ns()


async def _all_ready(readies: list[asyncio.Event], followers: list[asyncio.Task[None]]) -> None:
    """Until every client's stream is open; a client that failed before (its POST refused,
    its connection lost) fails the run with its error, rather than leave it waiting."""
    waiting = [asyncio.ensure_future(r.wait()) for r in readies]
    try:
        pending: set[asyncio.Future[Any]] = {*waiting, *followers}
        deadline = asyncio.get_running_loop().time() + 300
        while any(not w.done() for w in waiting):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise TimeoutError(f"{sum(not w.done() for w in waiting)} clients not ready")
            done, pending = await asyncio.wait(pending, timeout=left,
                                               return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task in followers:
                    task.result()  # raises what the client met
                    raise RuntimeError("a client's stream ended before the run")
    finally:
        for w in waiting:
            w.cancel()


class _InProcess:
    """The clients on this process's loop."""

    def __init__(self, url: str, clients: list[Client]) -> None:
        self.url, self.clients = url, clients
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.followers: list[asyncio.Task[None]] = []
        self.lags: list[tuple[int, float]] = []
        self.pauses = _Pauses()
        self.lagging: asyncio.Task[None] | None = None

    async def start(self) -> None:
        readies = [asyncio.Event() for _ in self.clients]
        self.followers = [asyncio.create_task(_follow(self.http, self.url, c, r))
                          for c, r in zip(self.clients, readies, strict=True)]
        try:
            await _all_ready(readies, self.followers)
        except BaseException:
            await self.stop()
            raise
        # what stands for 1,000 browsers must not stall them all at once: its heap is
        # frozen as the servers' are (adapters/cli/heap.py), and its pauses are recorded
        heap.settle()
        gc.callbacks.append(self.pauses.timed)
        self.lagging = asyncio.create_task(loop_lag(self.lags))

    async def stop(self) -> Seen:
        if self.pauses.timed in gc.callbacks:
            gc.callbacks.remove(self.pauses.timed)
        for task in [*self.followers, *([self.lagging] if self.lagging else [])]:
            task.cancel()
        await asyncio.gather(*self.followers, return_exceptions=True)
        await self.http.close()
        seen = Seen(lags=self.lags, gc=self.pauses.over_1ms)
        for c in self.clients:
            seen.received.update(c.received)
            seen.broken += c.broken
        return seen


class Readers:
    """The clients, in this process (`procs` 0) or spread round robin over `procs` children."""

    def __init__(self) -> None:
        self._local: _InProcess | None = None
        self._children: list[asyncio.subprocess.Process] = []

    @classmethod
    async def start(cls, url: str, clients: list[Client], procs: int) -> Readers:
        readers = cls()
        if not procs:
            readers._local = _InProcess(url, clients)
            await readers._local.start()
            return readers
        try:
            for k in range(procs):
                child = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "ops.bench._sse_clients", cwd=ROOT,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    limit=1 << 26)
                readers._children.append(child)
                assert child.stdin is not None
                mine = [[c.topic, c.item] for c in clients[k::procs]]
                child.stdin.write(json.dumps({"url": url, "clients": mine}).encode() + b"\n")
                await child.stdin.drain()
            for child in readers._children:
                assert child.stdout is not None
                line = await child.stdout.readline()
                if line.strip() != b"ready":
                    raise RuntimeError(f"a client process did not start: {line!r}")
        except BaseException:
            for child in readers._children:  # some may still be opening streams
                if child.returncode is None:
                    child.kill()
                await child.wait()
            raise
        return readers

    def cpu(self) -> float:
        """CPU seconds of this process and the client processes so far."""
        own = time.process_time()
        for child in self._children:
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            own += (int(fields[11]) + int(fields[12])) / 100  # SC_CLK_TCK on Linux
        return own

    async def stop(self) -> Seen:
        if self._local is not None:
            return await self._local.stop()
        seen = Seen()
        for child in self._children:
            assert child.stdin is not None and child.stdout is not None
            if child.returncode is None:
                child.stdin.write(b"stop\n")
                await child.stdin.drain()
                line = await child.stdout.readline()
                if line:
                    got = json.loads(line)
                    seen.received.update(got["received"])
                    seen.broken += got["broken"]
                    seen.lags += [(t, ms) for t, ms in got["lags"]]
                    seen.gc += [(t, ms) for t, ms in got["gc"]]
            await child.wait()
        return seen


async def _child() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    config = json.loads(await reader.readline())
    local = _InProcess(config["url"], [Client(t, i) for t, i in config["clients"]])
    try:
        await local.start()
        print("ready", flush=True)
        while (await reader.readline()).strip() not in (b"stop", b""):
            pass
    finally:
        seen = await local.stop()
    print(json.dumps({"received": seen.received, "broken": seen.broken, "lags": seen.lags,
                      "gc": seen.gc}), flush=True)


if __name__ == "__main__":
    asyncio.run(_child())
