"""`RobustSubscriber` and `apexps subscribe --link --state` on the live path: real Kafka, real
BEEP over TCP. A subscriber whose connection dies mid-stream, whose application restarts, or
whose broker is killed with SIGKILL and restarted gets every message exactly once, in order,
by gap fill after it comes back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, PubsubClient
from adapters.client.reconnect import ReconnectPolicy
from adapters.client.resequencer import Positions
from adapters.client.robust_client import Message, RobustSubscriber
from broker.kafka_io import KafkaConfig
from broker.robust.config import RobustConfig
from common.errors import ApexpsError
from tests.apex.tcp_proxy import TcpProxy
from tests.integration.broker_process import start_broker
from tests.integration.link_log import logged

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: no heartbeats during a test: link seqs are then exactly the messages, 1, 2, 3 …
QUIET = RobustConfig(heartbeat_ms=600_000)
FAST = ReconnectPolicy(wait=0.05, wait_max=0.5)
TIMEOUT = 60.0
PUB = "pub@example.com"


def run(body: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(body, 240))


async def _take(messages: AsyncIterator[Message], count: int) -> list[Message]:
    return [await asyncio.wait_for(anext(messages), TIMEOUT) for _ in range(count)]


async def _publish(pub: PubsubClient, topic: str, lo: int, hi: int) -> None:
    """m{lo} .. m{hi-1}, one after the other (each durable before the next)."""
    for k in range(lo, hi):
        await pub.publish(topic, f"m{k}".encode())


async def _seen(control: PubsubClient, count: int) -> None:
    """Wait until `control` has received `count` deliveries: they were sequenced onto every
    link of their topic in the same link-log batch, so every subscriber's copy was sent too."""
    events = control.events()
    got = 0
    while got < count:
        if isinstance(await asyncio.wait_for(anext(events), TIMEOUT), Delivered):
            got += 1


def _exactly_once_in_order(got: list[Message], count: int, *, epochs: int = 1) -> None:
    assert [m.content for m in got] == [f"m{k}".encode() for k in range(count)]
    assert [m.stamp.source for m in got] == [PUB] * count
    assert [m.stamp.source_seq for m in got] == list(range(1, count + 1))
    # the link carried nothing else (QUIET): its seqs are contiguous, whatever path each took,
    # within each epoch (a kill -9 begins a new one: robust-binding §2.5)
    want, seq, epoch = [], 0, None
    for m in got:
        seq = seq + 1 if m.stamp.epoch == epoch else 1
        epoch = m.stamp.epoch
        want.append(seq)
    assert [m.stamp.link_seq for m in got] == want
    seen = len({m.stamp.epoch for m in got})
    assert seen == 1 if epochs == 1 else seen >= epochs


# --- (a) the connection drops mid-stream -------------------------------------------------


def test_dropped_connection_is_refilled_exactly_once_in_order(kafka_config: KafkaConfig) -> None:
    """The subscriber's TCP connection dies mid-stream and stays down while some 80 messages go
    to its dead session; after reconnecting it gets them by gap fill (more than the 64 MSGs a
    BEEP peer may leave unanswered by default, in a burst), then the rest live."""
    async def body() -> None:
        async with BrokerApp(kafka_config, robust=QUIET) as app:
            proxy = await TcpProxy(app.port).start()
            pub = await PubsubClient.connect("127.0.0.1", app.port, PUB)
            control = await PubsubClient.connect("127.0.0.1", app.port, "ctl@example.com")
            jade = await PubsubClient.connect("127.0.0.1", proxy.port, "jade@example.com",
                                              reconnect=FAST)
            await pub.create_topic("q.drop")
            await control.subscribe("q.drop", 600, link="ctl-drop")
            robust = await RobustSubscriber.open(jade, "jade-drop")
            await robust.subscribe("q.drop", 600)
            messages = robust.messages()
            # The cut comes after the 20th message has reached jade's application, and the
            # next 80 go to the dead session: publishing is paced by the test, not raced.
            await _publish(pub, "q.drop", 0, 20)
            got = await _take(messages, 20)
            proxy.refusing = True
            proxy.cut()
            before_cut = robust.counters.delivered
            await _publish(pub, "q.drop", 20, 100)
            await _seen(control, 100)
            proxy.refusing = False
            publishing = asyncio.create_task(_publish(pub, "q.drop", 100, 150))
            got += await _take(messages, 130)
            await publishing
            _exactly_once_in_order(got, 150)
            c = robust.counters
            assert robust.resumes == 1 and c.gap_requests >= 1
            # what came after the cut, up to the 100th, went to the dead session
            assert before_cut == 20 and robust.refilled >= 100 - before_cut
            assert c.delivered == 150 and c.resets == 0 and c.lost == 0
            # nothing more was queued: the next message is one published now
            await pub.publish("q.drop", b"end")
            assert [m.content for m in await _take(messages, 1)] == [b"end"]
            await robust.close()
            for client in (jade, control, pub):
                await client.close()
            await proxy.close()
    run(body())


# --- (b) the application restarts with its positions file --------------------------------


def test_restart_with_positions_file_resumes_without_loss_or_repeats(
        kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """The application stops after 25 of 60 messages (the rest keep coming meanwhile) and
    starts again from its positions file: it gets messages 26..60, each once."""
    async def body() -> None:
        state = tmp_path / "jade.json"
        async with BrokerApp(kafka_config, robust=QUIET) as app:
            pub = await PubsubClient.connect("127.0.0.1", app.port, PUB)
            await pub.create_topic("q.restart")
            jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
            robust = await RobustSubscriber.open(jade, "jade-restart", state=state)
            await robust.subscribe("q.restart", 600)
            publishing = asyncio.create_task(_publish(pub, "q.restart", 0, 60))
            messages = robust.messages()
            first = await _take(messages, 25)
            await robust.close()
            await jade.close()
            saved = Positions.from_json(state.read_text())
            last = first[-1].stamp
            assert (saved.link, saved.epoch, saved.link_seq) == ("jade-restart", 0, 25)
            assert saved.sources == {PUB: last.source_seq} and saved.time == last.time
            await publishing
            # the application comes back: the link comes from the file
            jade = await PubsubClient.connect("127.0.0.1", app.port, "jade@example.com")
            robust = await RobustSubscriber.open(jade, state=state)
            assert robust.link == "jade-restart"
            await robust.subscribe("q.restart", 600)
            messages = robust.messages()
            second = await _take(messages, 35)
            _exactly_once_in_order(first + second, 60)
            # live data that overtook the refill are put in order, not taken for a hole
            assert robust.refilled >= 1 and robust.counters.holes == 0
            await pub.publish("q.restart", b"end")
            assert [m.content for m in await _take(messages, 1)] == [b"end"]
            await robust.close()
            assert Positions.from_json(state.read_text()).link_seq == 61
            for client in (jade, pub):
                await client.close()
    run(body())


# --- (c) the command line ----------------------------------------------------------------


APEXPS = [sys.executable, "-m", "adapters.cli.main"]


async def _cli_subscribe(port: int, state: Path, count: int, topic: str = "q.cli",
                         who: str = "jade") -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        *APEXPS, "--log-json", "subscribe", "--server", f"127.0.0.1:{port}",
        "--as", f"{who}@example.com", "--topic", topic, "--link", f"{who}-cli",
        "--state", str(state), "--count", str(count),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    while True:  # the log lines before it are JSON; this one is for people
        line = (await asyncio.wait_for(proc.stderr.readline(), TIMEOUT)).decode()
        assert line, "apexps subscribe exited before subscribing"
        if line.startswith(f"apexps: subscribed to {topic}"):
            return proc


async def _cli_output(proc: asyncio.subprocess.Process) -> tuple[list[dict[str, object]],
                                                                  list[dict[str, object]]]:
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, err.decode()
    logs = [json.loads(x) for x in err.decode().splitlines() if x.startswith("{")]
    return [json.loads(x) for x in out.decode().splitlines()], logs


def test_cli_subscribe_prints_stamped_json_lines_and_resumes_from_its_state(
        kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """`apexps subscribe --link --state` prints one JSON line per message with its stamp;
    run again with the same state, it prints only what came since."""
    async def body() -> None:
        state = tmp_path / "cli.json"
        async with BrokerApp(kafka_config, robust=QUIET) as app:
            pub = await PubsubClient.connect("127.0.0.1", app.port, PUB)
            await pub.create_topic("q.cli")
            proc = await _cli_subscribe(app.port, state, 5)
            await _publish(pub, "q.cli", 0, 5)
            lines, logs = await _cli_output(proc)
            assert [x["content"] for x in lines] == [f"m{k}" for k in range(5)]
            for n, line in enumerate(lines, 1):
                assert line["topic"] == "q.cli" and line["type"] == "update"
                assert (line["link"], line["epoch"], line["linkseq"]) == ("jade-cli", 0, n)
                assert (line["source"], line["sourceseq"]) == (PUB, n)
                assert line["content_type"] == "application/octet-stream"
                assert isinstance(line["time"], int)
                assert "messageid" not in line and "token" not in line
            stopped = [x for x in logs if x["event"] == "robust subscriber stopped"]
            assert stopped and stopped[0]["delivered"] == 5
            assert Positions.from_json(state.read_text()).link_seq == 5
            # away: three more come; the next run prints exactly those
            await _publish(pub, "q.cli", 5, 8)
            proc = await _cli_subscribe(app.port, state, 3)
            lines, logs = await _cli_output(proc)
            assert [(x["linkseq"], x["sourceseq"], x["content"]) for x in lines] == [
                (6, 6, "m5"), (7, 7, "m6"), (8, 8, "m7")]
            # notices and counters go to stderr only: stdout is exactly the three lines
            assert any(x["event"] == "robust subscriber stopped" for x in logs)
            # SIGTERM stops it as cleanly as --count: what it printed is what the file holds
            proc = await _cli_subscribe(app.port, state, 0)
            await _publish(pub, "q.cli", 8, 10)
            assert proc.stdout is not None
            printed = [json.loads(await asyncio.wait_for(proc.stdout.readline(), TIMEOUT))
                       for _ in range(2)]
            assert [x["linkseq"] for x in printed] == [9, 10]
            proc.send_signal(signal.SIGTERM)
            lines, _ = await _cli_output(proc)
            assert lines == []
            assert Positions.from_json(state.read_text()).link_seq == 10
            await pub.close()
    run(body())


def test_cli_subscribe_refuses_a_state_file_of_another_link(kafka_config: KafkaConfig,
                                                            tmp_path: Path) -> None:
    """A state file that names another link is an error (553), and it is left as it was."""
    async def body() -> None:
        state = tmp_path / "other.json"
        text = Positions("someone-else", 32, 0, 7, None, {PUB: 7}).to_json()
        state.write_text(text)
        async with BrokerApp(kafka_config, robust=QUIET) as app:
            proc = await asyncio.create_subprocess_exec(
                *APEXPS, "subscribe", "--server", f"127.0.0.1:{app.port}", "--as",
                "jade@example.com", "--topic", "q.none", "--link", "jade-x", "--state",
                str(state), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
            assert proc.returncode == 1 and out == b""
            assert "error 553" in err.decode() and "someone-else" in err.decode()
        assert state.read_text() == text
    run(body())


# --- (d) the broker is killed and restarted ----------------------------------------------


async def _close_quietly(*clients: PubsubClient) -> None:
    for client in clients:
        with contextlib.suppress(ApexpsError, OSError):
            await client.close()


def test_broker_kill_9_and_restart_while_subscribed(kafka_config: KafkaConfig,
                                                    tmp_path: Path) -> None:
    """SIGKILL the broker and start it again on the same port. `direct` is connected to it and
    simply reconnects; `held`'s network (a proxy) was down since before the kill, while 10
    messages were sent to it, so they come back by gap fill from the restarted broker; the
    CLI (`apexps subscribe --link --state`) reconnects by itself. All see the 30 messages
    once, in order."""
    async def body() -> None:
        args = ("--heartbeat-ms", "600000")
        ns = kafka_config.namespace
        proc, port = await start_broker(kafka_config.bootstrap, *args, namespace=ns, logs=False)
        proxy = await TcpProxy(port).start()
        cli: asyncio.subprocess.Process | None = None
        try:
            pub = await PubsubClient.connect("127.0.0.1", port, PUB)
            control = await PubsubClient.connect("127.0.0.1", port, "ctl@example.com")
            await pub.create_topic("q.kill")
            await control.subscribe("q.kill", 600, link="ctl-kill")
            cli = await _cli_subscribe(port, tmp_path / "cli.json", 30, "q.kill", "cli")
            subscribers = {}
            for name, via in (("direct", port), ("held", proxy.port)):
                client = await PubsubClient.connect("127.0.0.1", via, f"{name}@example.com",
                                                    reconnect=FAST)
                robust = await RobustSubscriber.open(client, f"{name}-kill")
                await robust.subscribe("q.kill", 600)
                subscribers[name] = (client, robust, robust.messages())
            got: dict[str, list[Message]] = {name: [] for name in subscribers}

            async def take(count: int, *names: str) -> None:
                for name in names:
                    got[name] += await _take(subscribers[name][2], count)

            await _publish(pub, "q.kill", 0, 10)
            await take(10, "direct", "held")
            proxy.refusing = True
            proxy.cut()
            await _publish(pub, "q.kill", 10, 20)
            await _seen(control, 20)
            await take(10, "direct")
            # a reset (ordinal 0) and 20 messages on each link (one pack holds every link's)
            await logged(kafka_config, ("direct-kill", "held-kill"), 20)
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
            await _close_quietly(pub, control)
            proc, _ = await start_broker(kafka_config.bootstrap, *args, namespace=ns,
                                         logs=False, port=port)
            proxy.refusing = False
            await take(10, "held")  # 11..20, refilled by the restarted broker
            pub = await PubsubClient.connect("127.0.0.1", port, PUB)
            await _publish(pub, "q.kill", 20, 30)
            await take(10, "direct", "held")
            for name, (client, robust, _) in subscribers.items():
                _exactly_once_in_order(got[name], 30, epochs=2)
                assert robust.resumes >= 1 and robust.counters.lost == 0, name
                await robust.close()
                await client.close()
            assert subscribers["held"][1].refilled >= 10
            lines, logs = await _cli_output(cli)
            assert [(x["sourceseq"], x["content"]) for x in lines] == [
                (k, f"m{k - 1}") for k in range(1, 31)]
            # the restarted broker began a new epoch (robust-binding §2.5): seqs 1.. again
            assert [x["epoch"] for x in lines[:20]] == [0] * 20
            assert len({x["epoch"] for x in lines[20:]}) == 1 and lines[20]["epoch"] > 0
            assert [x["linkseq"] for x in lines] == [*range(1, 21), *range(1, 11)]
            assert any(x["event"] == "robust link resuming after reconnect" for x in logs)
            await pub.close()
        finally:
            if cli is not None and cli.returncode is None:
                cli.kill()
                await cli.wait()
            await proxy.close()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    run(body())


def test_cli_subscribe_snapshot_prints_the_items_state_first(kafka_config: KafkaConfig,
                                                             tmp_path: Path) -> None:
    """`apexps subscribe --snapshot`: the current image and deltas of each data item first
    (marked "snapshot": true, with their original source seqs), then live messages."""
    async def body() -> None:
        async with BrokerApp(kafka_config, robust=QUIET) as app:
            pub = await PubsubClient.connect("127.0.0.1", app.port, PUB)
            await pub.create_topic("q.items")
            for content, ptype, mid in ((b"ibm 1", "image", "IBM"), (b"ibm +1", "update", "IBM"),
                                        (b"msft 1", "image", "MSFT"), (b"ibm 2", "image", "IBM"),
                                        (b"msft +1", "correction", "MSFT")):
                await pub.publish("q.items", content, publish_type=ptype, message_id=mid)
            control = await PubsubClient.connect("127.0.0.1", app.port, "ctl@example.com")
            await control.subscribe("q.items", 600, snapshot=True)
            await _seen(control, 3)  # the state is what was forwarded: all five are in it
            proc = await asyncio.create_subprocess_exec(
                *APEXPS, "--log-json", "subscribe", "--server", f"127.0.0.1:{app.port}",
                "--as", "jade@example.com", "--topic", "q.items", "--snapshot",
                "--state", str(tmp_path / "snap.json"), "--count", "4",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            assert proc.stderr is not None
            while not (await asyncio.wait_for(proc.stderr.readline(), TIMEOUT)).startswith(
                    b"apexps: subscribed to"):
                pass
            await pub.publish("q.items", b"ibm +2", publish_type="update", message_id="IBM")
            lines, _ = await _cli_output(proc)
            assert [(x["content"], x["type"], x.get("snapshot", False)) for x in lines] == [
                ("msft 1", "image", True), ("ibm 2", "image", True),
                ("msft +1", "correction", True), ("ibm +2", "update", False)]
            assert [x["sourceseq"] for x in lines] == [3, 4, 5, 6]
            for c in (pub, control):
                await c.close()

    asyncio.run(body())
