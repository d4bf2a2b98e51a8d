"""`ReconnectingApexClient` over real TCP: a relay process killed and restarted on the same port,
a connection cut under a live session (through `TcpProxy`), TLS and SASL redone, giving up."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
import trustme
from hypothesis import given
from hypothesis import strategies as st

from adapters.apex import Endpoint, Option, Relay
from adapters.apex.relay import ATTACH_OVERRIDE
from adapters.apex.server import ApexServer
from adapters.beep import Users
from adapters.client.client import ApexClient
from adapters.client.reconnect import (
    Closed,
    ConnectionEvent,
    Detached,
    Disconnected,
    Reconnected,
    ReconnectingApexClient,
    ReconnectPolicy,
)
from common.errors import AccessDenied, ServiceNotAvailable
from tests.apex.tcp_proxy import TcpProxy

E = TypeVar("E")

#: fast enough for tests, still exercising backoff and jitter
FAST = ReconnectPolicy(wait=0.02, wait_max=0.2)
TIMEOUT = 30.0


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 90))


@dataclass
class Recorder:
    """Collects a client's connection events; `next(kind)` awaits the next one of a kind."""

    events: list[ConnectionEvent] = field(default_factory=list)
    _arrived: asyncio.Queue[ConnectionEvent] = field(default_factory=asyncio.Queue)

    def __call__(self, event: ConnectionEvent) -> None:
        self.events.append(event)
        self._arrived.put_nowait(event)

    async def next(self, kind: type[E]) -> E:
        while True:
            event = await asyncio.wait_for(self._arrived.get(), TIMEOUT)
            if isinstance(event, kind):
                return event


# --- the policy (pure) ----------------------------------------------------------------------

@given(wait=st.floats(0, 10), extra=st.floats(0, 100), jitter=st.floats(0, 1),
       attempt=st.integers(1, 10_000), seed=st.integers())
def test_delay_is_capped_exponential_with_bounded_jitter(wait: float, extra: float,
                                                         jitter: float, attempt: int,
                                                         seed: int) -> None:
    """Attempt n waits between (1-jitter) and 1 times min(wait_max, wait * 2**(n-1))."""
    policy = ReconnectPolicy(wait=wait, wait_max=wait + extra, jitter=jitter)
    ceiling = min(policy.wait_max, wait * 2.0 ** min(attempt - 1, 1000))
    delay = policy.delay(attempt, random.Random(seed))
    assert ceiling * (1 - jitter) - 1e-9 <= delay <= ceiling + 1e-9


def test_delays_grow_then_stay_at_the_cap() -> None:
    """Without jitter the waits double from `wait` and stop at `wait_max`."""
    policy = ReconnectPolicy(wait=0.5, wait_max=3.0, jitter=0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


@pytest.mark.parametrize("bad", [{"max_attempts": 0}, {"wait": -1}, {"wait": 5, "wait_max": 1},
                                 {"jitter": 1.5}])
def test_nonsense_policies_are_refused(bad: dict[str, float]) -> None:
    """A policy that cannot mean anything raises ValueError when made."""
    with pytest.raises(ValueError):
        ReconnectPolicy(**bad)  # type: ignore[arg-type]


# --- a relay in a process of its own, killed and restarted ----------------------------------

@dataclass
class RelayProcess:
    proc: asyncio.subprocess.Process
    port: int

    async def line(self) -> str:
        assert self.proc.stdout is not None
        return (await asyncio.wait_for(self.proc.stdout.readline(), TIMEOUT)).decode().strip()

    async def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> str:
        """Close stdin (it ends itself) and return what it printed since the last line read."""
        out, _ = await asyncio.wait_for(self.proc.communicate(b""), TIMEOUT)
        return out.decode()


async def _relay_process(port: int = 0) -> RelayProcess:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.apex.relay_process", str(port),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    relay = RelayProcess(proc, port)
    first = await relay.line()
    assert first.startswith("port "), first
    relay.port = int(first.split()[1])
    return relay


@asynccontextmanager
async def _relay(port: int = 0) -> AsyncIterator[RelayProcess]:
    relay = await _relay_process(port)
    try:
        yield relay
    finally:
        if relay.proc.returncode is None:
            await relay.kill()


async def _send_to_barney(port: int, content: bytes) -> None:
    fred = await ApexClient.connect("127.0.0.1", port)
    await fred.attach("fred@example.com")
    await fred.send("fred@example.com", ["barney@example.com"], content)
    await fred.close()


def test_relay_process_killed_and_restarted() -> None:
    """After SIGKILL and a restart on the same port, the client re-dials, re-attaches, and the
    `receive()` iterator it had before goes on yielding."""
    async def body() -> None:
        events = Recorder()
        async with _relay() as first:
            barney = await ReconnectingApexClient.connect("127.0.0.1", first.port, TIMEOUT,
                                                          policy=FAST)
            barney.add_listener(events)
            await barney.attach("barney@example.com")
            inbox = barney.receive()
            await _send_to_barney(first.port, b"before")
            assert (await anext(inbox)).content == b"before"
            await first.kill()
            await events.next(Disconnected)
            assert not barney.is_connected
        async with _relay(first.port):
            back = await events.next(Reconnected)
            assert back.attached == (Endpoint.parse("barney@example.com"),)
            assert back.lost == ()
            await _send_to_barney(first.port, b"after")
            assert (await anext(inbox)).content == b"after"
            await barney.close()
        assert isinstance(events.events[-1], Closed) and events.events[-1].error is None
        assert barney.disconnects == 1
    run(body)


def test_send_in_flight_raises_421_and_is_not_sent_again() -> None:
    """A send whose data reached the relay before it died raises ServiceNotAvailable (421,
    retriable); the client does not send it again after reconnecting."""
    async def body() -> None:
        events = Recorder()
        async with _relay() as first:
            fred = await ReconnectingApexClient.connect("127.0.0.1", first.port, TIMEOUT,
                                                        policy=FAST)
            fred.add_listener(events)
            await fred.attach("fred@example.com")
            sending = asyncio.create_task(
                fred.send("fred@example.com", ["apex=taker@example.com"], b"once"))
            assert await first.line() == "took once"  # it is in the relay, unanswered
            await first.kill()
            with pytest.raises(ServiceNotAvailable) as caught:
                await sending
            assert caught.value.retriable and caught.value.code == 421
        async with _relay(first.port) as second:
            await events.next(Reconnected)
            await fred.send("fred@example.com", ["apex=counter@example.com"], b"next")
            await fred.close()
            # BEEP keeps a channel's MSGs in order: a resend would have come before "next"
            assert await second.stop() == "counted next\n"
    run(body)


def test_send_while_reconnecting_waits_for_the_connection() -> None:
    """A send started while the connection is down goes out once it is back (nothing of it was
    written before, so sending it is no resend)."""
    async def body() -> None:
        events = Recorder()
        async with _relay() as first:
            fred = await ReconnectingApexClient.connect(
                "127.0.0.1", first.port, TIMEOUT, policy=FAST)
            fred.add_listener(events)
            await fred.attach("fred@example.com")
            await first.kill()
            await events.next(Disconnected)
            sending = asyncio.create_task(
                fred.send("fred@example.com", ["apex=counter@example.com"], b"later"))
            async with _relay(first.port) as second:
                await sending
                assert await second.line() == "counted later"
                await fred.close()
    run(body)


def test_gives_up_after_max_attempts() -> None:
    """With no relay coming back, the client stops after `max_attempts`: `Closed` carries the
    error, `receive()` ends, and every call raises ServiceNotAvailable."""
    async def body() -> None:
        events = Recorder()
        async with _relay() as relay:
            client = await ReconnectingApexClient.connect(
                "127.0.0.1", relay.port, TIMEOUT,
                policy=ReconnectPolicy(max_attempts=3, wait=0.01, wait_max=0.02),
                on_closed=events)
            await client.attach("fred@example.com")
            await relay.kill()
        closed = await events.next(Closed)
        assert closed.error is not None and "in 3 attempts" in str(closed.error)
        assert [d async for d in client.receive()] == []
        with pytest.raises(ServiceNotAvailable):
            await client.send("fred@example.com", ["barney@example.com"], b"x")
        await client.close()
    run(body)


def test_close_while_reconnecting_stops_at_once() -> None:
    """`close()` during the backoff ends the client without waiting out the wait: `Closed`
    without an error, `receive()` ends, a pending send raises 421."""
    async def body() -> None:
        events = Recorder()
        async with _relay() as relay:
            client = await ReconnectingApexClient.connect(
                "127.0.0.1", relay.port, TIMEOUT,
                policy=ReconnectPolicy(max_attempts=None, wait=3600, wait_max=3600),
                on_disconnected=events, on_closed=events)
            await client.attach("fred@example.com")
            await relay.kill()
        await events.next(Disconnected)
        waiting = asyncio.create_task(
            client.send("fred@example.com", ["fred@example.com"], b"x"))
        await asyncio.wait_for(client.close(), 5)
        assert (await events.next(Closed)).error is None
        assert [d async for d in client.receive()] == []
        with pytest.raises(ServiceNotAvailable):
            await waiting
    run(body)


def test_first_connect_is_not_retried() -> None:
    """A relay that is not there at all fails `connect` at once, like ApexClient."""
    async def body() -> None:
        async with _relay() as relay:
            port = relay.port
        with pytest.raises(OSError):
            await ReconnectingApexClient.connect("127.0.0.1", port, TIMEOUT, policy=FAST)
    run(body)


# --- a cut connection under a session the relay still believes in --------------------------

def test_half_dead_session_is_overridden() -> None:
    """The relay still holds barney's old session when the client comes back; re-attaching
    with attachOverride takes the endpoint over (without it the relay would answer 555)."""
    async def body() -> None:
        events = Recorder()
        async with ApexServer(Relay("example.com")) as server:
            proxy = await TcpProxy(server.port).start()
            barney = await ReconnectingApexClient.connect(
                "127.0.0.1", proxy.port, TIMEOUT, policy=FAST, on_disconnected=events,
                on_reconnected=events)
            await barney.attach("barney@example.com")
            proxy.cut()
            await events.next(Disconnected)
            back = await events.next(Reconnected)
            assert back.attached == (Endpoint.parse("barney@example.com"),)
            assert len(server._sessions) == 2  # the old one is still there, half dead
            await _send_to_barney(server.port, b"to the new session")
            got = await asyncio.wait_for(anext(barney.receive()), TIMEOUT)
            assert got.content == b"to the new session"
            await barney.close()
            await proxy.close()
    run(body)


def test_endpoint_taken_elsewhere_is_not_reattached() -> None:
    """When another session takes our endpoint with attachOverride (the relay terminates ours
    with 556) we report `Detached` and do not take it back on the next reconnection."""
    async def body() -> None:
        events = Recorder()
        async with ApexServer(Relay("example.com")) as server:
            proxy = await TcpProxy(server.port).start()
            barney = await ReconnectingApexClient.connect("127.0.0.1", proxy.port, TIMEOUT,
                                                          policy=FAST)
            barney.add_listener(events)
            await barney.attach("barney@example.com")
            await barney.attach("barney/appl=pager@example.com")
            thief = await ApexClient.connect("127.0.0.1", server.port)
            await thief.attach("barney@example.com", options=[Option(ATTACH_OVERRIDE)])
            detached = await events.next(Detached)
            assert (detached.endpoint, detached.code) == (Endpoint.parse("barney@example.com"),
                                                         556)
            assert barney.attached == (Endpoint.parse("barney/appl=pager@example.com"),)
            proxy.cut()
            back = await events.next(Reconnected)
            assert back.attached == (Endpoint.parse("barney/appl=pager@example.com"),)
            await thief.send("barney@example.com", ["barney/appl=pager@example.com"], b"hi")
            got = await asyncio.wait_for(anext(barney.receive()), TIMEOUT)
            assert got.content == b"hi"
            await thief.close()
            await barney.close()
            await proxy.close()
    run(body)


def test_reattach_refused_for_good_is_reported_as_lost() -> None:
    """If the relay refuses a re-attach with a non-retriable code (here 537: the policy changed
    meanwhile) the endpoint is dropped and `Reconnected.lost` says why."""
    async def body() -> None:
        events = Recorder()
        relay = Relay("example.com")
        async with ApexServer(relay) as server:
            proxy = await TcpProxy(server.port).start()
            client = await ReconnectingApexClient.connect("127.0.0.1", proxy.port, TIMEOUT,
                                                          policy=FAST, on_reconnected=events)
            await client.attach("fred@example.com")
            await client.attach("wilma@example.com")
            relay.may_attach = lambda ref, endpoint: endpoint.local != "wilma"
            proxy.cut()
            back = await events.next(Reconnected)
            assert back.attached == (Endpoint.parse("fred@example.com"),)
            [(endpoint, error)] = back.lost
            assert endpoint == Endpoint.parse("wilma@example.com")
            assert isinstance(error, AccessDenied)
            assert client.attached == (Endpoint.parse("fred@example.com"),)
            await client.close()
            await proxy.close()
    run(body)


USERS = Users()
USERS.add("fred", "yabba dabba doo", iterations=4096)


def test_reconnect_redoes_tls_and_sasl() -> None:
    """Against a relay that demands TLS and authentication, the new connection negotiates both
    again before re-attaching (the relay lets only an authenticated fred attach as fred)."""
    async def body() -> None:
        ca = trustme.CA()
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(server_tls)
        client_tls = ssl.create_default_context()
        ca.configure_trust(client_tls)
        events = Recorder()
        async with ApexServer(Relay("example.com"), tls=server_tls, require_tls=True,
                              sasl=USERS, require_auth=True) as server:
            proxy = await TcpProxy(server.port).start()
            fred = await ReconnectingApexClient.connect(
                "127.0.0.1", proxy.port, TIMEOUT, tls=client_tls,
                sasl=("fred", "yabba dabba doo"), mechanism="SCRAM-SHA-256", policy=FAST,
                on_reconnected=events)
            await fred.attach("fred@example.com")
            proxy.cut()
            back = await events.next(Reconnected)
            assert back.attached == (Endpoint.parse("fred@example.com"),)
            assert sum(1 for t in server._security.tunings.values() if t.identity == "fred") == 2
            await fred.send("fred@example.com", ["fred@example.com"], b"to myself")
            got = await asyncio.wait_for(anext(fred.receive()), TIMEOUT)
            assert got.content == b"to myself"
            await fred.close()
            await proxy.close()
    run(body)


def test_cli_listen_reconnects() -> None:
    """`apexps listen --reconnect` prints data sent before and after its relay restarted."""
    async def body() -> None:
        async with _relay() as first:
            listen = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "adapters.cli.main", "listen", "--reconnect",
                "--server", f"127.0.0.1:{first.port}", "--as", "barney@example.com",
                "--count", "2", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            await _stderr_until(listen, "attached as barney@example.com")
            await _send_to_barney(first.port, b"before")
            await first.kill()
        async with _relay(first.port):
            await _stderr_until(listen, "apex reconnected")
            await _send_to_barney(first.port, b"after")
            out, _ = await asyncio.wait_for(listen.communicate(), TIMEOUT)
        assert listen.returncode == 0
        assert [json.loads(line)["content"] for line in out.splitlines()] == ["before", "after"]
    run(body)


async def _stderr_until(proc: asyncio.subprocess.Process, text: str) -> None:
    assert proc.stderr is not None
    while text not in (line := (await asyncio.wait_for(proc.stderr.readline(), TIMEOUT))
                       .decode()):
        assert line, f"the process ended before saying {text!r}"


def test_plain_client_send_after_loss_fails_at_once() -> None:
    """ApexClient (no reconnecting) raises 421 for a send after its connection ended, instead of
    waiting `timeout` for a reply that cannot come."""
    async def body() -> None:
        async with ApexServer(Relay("example.com")) as server:
            client = await ApexClient.connect("127.0.0.1", server.port, TIMEOUT)
            await client.attach("fred@example.com")
        assert [d async for d in client.receive()] == []  # ends: the server closed
        with pytest.raises(ServiceNotAvailable):
            await asyncio.wait_for(client.send("fred@example.com", ["fred@example.com"], b"x"),
                                   TIMEOUT / 3)
        await client.close()
    run(body)
