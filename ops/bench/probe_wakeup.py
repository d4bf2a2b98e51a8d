"""What an idle→wake cycle costs this machine: the price of a paced load, before any apexps code.

Run: `.venv/bin/python -m ops.bench.probe_wakeup [--cycles 2000]`

An event loop (the one the commands use: uvloop where installed) sleeps, wakes and writes 600
octets to a TCP socket whose reader is another process, again and again; it prints the loop's CPU
per cycle for several sleeps, and the same writes back to back. On bare metal or an ordinary VM a
cycle costs a few µs more than a write. On a guest whose idle and wake-ups exit to the host (a
nested VM without a cpuidle driver, say) each cycle that lets the CPU go idle costs tens of µs
more, and so does every message of a paced benchmark, once per thread it wakes: compare
bench_pubsub's paced and flat-out CPU per message with this before reading them as apexps's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import time

from adapters.cli import loop as event_loop

MESSAGE = b"x" * 600


def _reader(server: socket.socket) -> None:
    conn, _ = server.accept()
    while True:
        data = conn.recv(65536)
        if not data or data.endswith(b"!"):
            os._exit(0)


async def _cycles(port: int, cycles: int, gaps: list[float]) -> list[tuple[float, float]]:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    transport = writer.transport
    out = []
    for gap in gaps:
        began = time.process_time()
        for _ in range(cycles):
            transport.write(MESSAGE)
            if gap:
                await asyncio.sleep(gap)
            else:
                await asyncio.sleep(0)
        out.append((gap, (time.process_time() - began) / cycles * 1e6))
    transport.write(b"!")
    await writer.drain()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000, help="cycles per sleep (default: 2000)")
    args = ap.parse_args(argv)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    pid = os.fork()
    if pid == 0:
        _reader(server)
    port = server.getsockname()[1]
    server.close()
    try:
        results = event_loop.run(_cycles(port, args.cycles, [0.0, 0.0002, 0.001, 0.005]))
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.waitpid(pid, 0)
    busy = results[0][1]
    for gap, us in results:
        what = "back to back" if not gap else f"sleep {gap * 1e3:g} ms"
        extra = "" if not gap else f" ({us - busy:+,.1f} µs for going idle and waking)"
        print(f"{what:>16}: {us:,.1f} µs of CPU per write{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
