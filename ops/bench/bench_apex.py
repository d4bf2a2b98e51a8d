"""APEX data round trips (send `data`, await its `ok`) through a real `ApexServer` over loopback.

Run: `.venv/bin/python -m ops.bench.bench_apex [--seconds 10] [--mode sink|echo]`.

Set-up, so that client and server never share one GIL:

* the server runs in its own process (`--serve`): an `ApexServer` over a `Relay` of domain
  `bench.example`, logging at `--server-log-level` (default warning: the per-operation info line
  is measured separately with `--server-log-level info`);
* the load comes from client processes (`--client`), each an asyncio loop holding several
  `ApexClient` connections (one BEEP session and APEX channel each), each connection doing one
  data at a time: send, await ok, record the latency, repeat. 1 client = 1 process x 1 connection;
  16 clients = 2 processes x 8 connections (both cores of the bench machine). The third case
  runs the same 16 connections with `PIPELINED` such loops each, the way a publisher that does
  not wait for each ok before the next data uses one connection.
* the floor: the same 16 connections doing bare asyncio-streams round trips (a 101-octet line
  out, the server writes it back) against a plain echo server in the server process. No APEX
  implementation on asyncio streams can beat it on this machine; the ratio to it says how much
  BEEP and APEX cost on top.

Modes: `sink` (default) addresses each data to the well-known endpoint `apex=sink@bench.example`,
a service that swallows it: the figure is the relay's full receive/decode/route/reply path.
`echo` addresses each data to the sender itself, so the relay also delivers it (a MSG the client
answers with ok) before the next one: twice the BEEP traffic per operation.

The client processes start at one agreed instant, run `--seconds`, and report their operation
count, every latency and their CPU time over the measured seconds; the table gives the summed
rate, p50/p99 of data->ok, the server process's CPU time per operation (from /proc, so Linux
only; it includes connecting and attaching, a few milliseconds per case), the client processes'
CPU time per operation (all of them together: on a machine whose cores run both halves, server
plus client us/op is what bounds the rate) and the target. "server/core" is the rate the server
process would keep up on one core busy with it alone, at the CPU per operation it was measured
to spend (1 s / server us/op): what the server is worth where the clients run elsewhere, as
they do in deployment; the measured rate stays the figure the verdict is on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from adapters.cli import loop as event_loop

#: The figure the broker has to reach: small data operations per second, 16 clients.
TARGET_16 = 20_000
DOMAIN = "bench.example"
SINK = f"apex=sink@{DOMAIN}"
PAYLOAD = b"x" * 100
#: sends each connection keeps outstanding in the third case (BEEP pipelines MSGs on a channel;
#: the replies come back in order), so the server reads many MSGs per wake-up
PIPELINED = 16


def _serve(args: argparse.Namespace) -> None:
    from adapters.apex import Data, Endpoint, Relay
    from adapters.apex.server import ApexServer
    from adapters.cli import heap, logs

    logs.configure(args.server_log_level, json=True)

    class Sink:
        def on_data(self, data: Data, recipient: Endpoint) -> Iterable[Data]:
            return ()

    async def echo_lines(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line)

    async def run() -> None:
        relay = Relay(DOMAIN)
        relay.register_service("apex=sink", Sink())
        raw = await asyncio.start_server(echo_lines, "127.0.0.1", 0)
        async with ApexServer(relay, "127.0.0.1", 0) as server:
            if not args.no_settle:
                heap.settle()  # as `apexps up` and `apexps broker` do
            print(server.port, raw.sockets[0].getsockname()[1], flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        raw.close()

    if args.profile:
        import cProfile
        import pstats

        # CPU time, not wall time: on a shared machine a send() that lets another process
        # run would otherwise be charged with that process's time slice
        with cProfile.Profile(time.process_time) as prof:
            event_loop.run(run())
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    else:
        event_loop.run(run())


async def _one_connection(port: int, name: str, echo: bool, start_at: float,
                          stop_at: float, in_flight: int = 1) -> list[float]:
    from adapters.client.client import ApexClient

    client = await ApexClient.connect("127.0.0.1", port)
    me = f"{name}@{DOMAIN}"
    await client.attach(me)
    to = [me if echo else SINK]
    drain = asyncio.create_task(_drain(client)) if echo else None
    await asyncio.sleep(max(0.0, start_at - time.time()))
    latencies: list[float] = []
    clock = time.perf_counter

    async def sender() -> None:
        while time.time() < stop_at:
            began = clock()
            await client.send(me, to, PAYLOAD)
            latencies.append(clock() - began)

    # several senders share the connection: BEEP lets MSGs wait for their replies in order
    await asyncio.gather(*(sender() for _ in range(in_flight)))
    await client.close()
    if drain is not None:
        drain.cancel()
    return latencies


async def _raw_connection(port: int, start_at: float, stop_at: float) -> list[float]:
    """The floor: the same round trips as bare asyncio streams, a line out and back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    latencies: list[float] = []
    clock = time.perf_counter
    while time.time() < stop_at:
        began = clock()
        writer.write(PAYLOAD + b"\n")
        await writer.drain()
        await reader.readline()
        latencies.append(clock() - began)
    writer.close()
    return latencies


async def _drain(client: object) -> None:
    async for _ in client.receive():  # type: ignore[attr-defined]
        pass


def _client(args: argparse.Namespace) -> None:
    cpu: list[float] = []

    async def clock_cpu() -> None:
        # the CPU of the measured seconds only: starting the interpreter, importing, connecting
        # and attaching would otherwise weigh on every case by the length of the run
        await asyncio.sleep(max(0.0, args.start_at - time.time()))
        cpu.append(time.process_time())

    async def run() -> list[list[float]]:
        clocked = asyncio.create_task(clock_cpu())
        if args.raw:
            done = await asyncio.gather(*(
                _raw_connection(args.port, args.start_at, args.start_at + args.seconds)
                for _ in range(args.connections)))
        else:
            done = await asyncio.gather(*(
                _one_connection(args.port, f"c{os.getpid()}-{i}", args.mode == "echo",
                                args.start_at, args.start_at + args.seconds, args.in_flight)
                for i in range(args.connections)))
        await clocked
        cpu.append(time.process_time())  # closing counts in, as connecting does for the server
        return done

    per_connection = event_loop.run(run())
    json.dump({"cpu": cpu[1] - cpu[0], "latencies": [x for lat in per_connection for x in lat]},
              sys.stdout)


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _case(port: int, processes: int, connections: int, seconds: float,
          mode: str, in_flight: int = 1, raw: bool = False
          ) -> tuple[float, float, float, float]:
    """(ops/s, p50 ms, p99 ms, client processes' CPU seconds over the measured time)."""
    start_at = time.time() + 1.5 + 0.2 * connections  # time to connect and attach
    cmd = [sys.executable, "-m", "ops.bench.bench_apex", "--client", "--port", str(port),
           "--connections", str(connections), "--seconds", str(seconds),
           "--start-at", repr(start_at), "--mode", mode, "--in-flight", str(in_flight)]
    if raw:
        cmd.append("--raw")
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE) for _ in range(processes)]
    latencies: list[float] = []
    cpu = 0.0
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 120)
        if proc.returncode:
            raise SystemExit(f"client process failed with {proc.returncode}")
        report = json.loads(out)
        latencies += report["latencies"]
        cpu += report["cpu"]
    cuts = statistics.quantiles(latencies, n=100)
    return len(latencies) / seconds, cuts[49] * 1e3, cuts[98] * 1e3, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=10.0, help="per case")
    parser.add_argument("--mode", choices=["sink", "echo"], default="sink")
    parser.add_argument("--server-log-level", default="warning")
    parser.add_argument("--no-settle", action="store_true",
                        help="leave the server's garbage collector as Python sets it (by default"
                             " it is settled as `apexps up` does: adapters/cli/heap.py)")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the server; its top functions go to stderr at the end")
    parser.add_argument("--only", default="1,16,pipelined,floor",
                        help="comma-separated cases to run: 1, 16, pipelined, floor")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--connections", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--in-flight", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args)
        return 0
    if args.client:
        _client(args)
        return 0

    every = {"1": ("1 client", 1, 1, 1, None),
             "16": ("16 clients (2 procs x 8)", 2, 8, 1, TARGET_16),
             "pipelined": (f"16 clients, {PIPELINED} in flight each", 2, 8, PIPELINED, TARGET_16),
             "floor": ("floor: 16 raw echo", 2, 8, 0, None)}
    try:
        cases = [every[name.strip()] for name in args.only.split(",")]
    except KeyError as exc:
        parser.error(f"--only: no case {exc}; say some of {', '.join(every)}")
    server_cmd = [sys.executable, "-m", "ops.bench.bench_apex", "--serve",
                  "--server-log-level", args.server_log_level,
                  *(["--no-settle"] if args.no_settle else [])]
    if args.profile:
        server_cmd.append("--profile")
    server = subprocess.Popen(server_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              cwd=Path(__file__).resolve().parents[2])
    assert server.stdout is not None and server.stdin is not None
    port, raw_port = map(int, server.stdout.readline().split())
    print(f"APEX data->ok round trips, mode={args.mode}, {len(PAYLOAD)}-octet payload,"
          f" {args.seconds:g} s per case, server log level {args.server_log_level},"
          f" {event_loop.loop_name()} loop, {os.cpu_count()} CPUs")
    print(f"{'case':<32} {'ops/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'server us/op':>13}"
          f" {'server/core':>12} {'client us/op':>13} {'target ops/s':>13}  ok?")
    try:
        for label, processes, connections, in_flight, target in cases:
            before = _cpu_seconds(server.pid)
            rate, p50, p99, client_cpu = _case(
                raw_port if not in_flight else port, processes, connections, args.seconds,
                args.mode, max(1, in_flight), not in_flight)
            after = _cpu_seconds(server.pid)
            # the server's CPU over the case (connecting included) per operation measured
            per_op, per_core = ("?", "?") if before is None or after is None else (
                f"{(after - before) / (rate * args.seconds) * 1e6:,.0f}",
                f"{rate * args.seconds / max(after - before, 1e-9):,.0f}")
            # the client processes' CPU over the measured seconds, all of them, per operation
            client_per_op = client_cpu / (rate * args.seconds) * 1e6
            verdict = "" if target is None else ("yes" if rate >= target else "NO")
            print(f"{label:<32} {rate:>10,.0f} {p50:>8.3f} {p99:>8.3f} {per_op:>13}"
                  f" {per_core:>12} {client_per_op:>13,.0f}"
                  f" {'' if target is None else f'>= {target:,}':>13}  {verdict}", flush=True)
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
