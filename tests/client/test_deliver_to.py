"""`deliver_to`: a subscriber's messages handed to a callback in the read loop (no queue, no
task switch per message), for `PubsubClient` and `RobustSubscriber`. The transport is the fake
of test_robust_client.py; everything above it is the real code."""

from __future__ import annotations

from pathlib import Path

from adapters.client.pubsub_client import Delivered
from adapters.client.robust_client import Message, PositionsFile, RobustSubscriber
from tests.client.test_robust_client import FakeApex, L, client_over, data, reset, run, settle


def test_a_plain_subscribers_messages_go_to_the_callback_not_events() -> None:
    """Forwarded messages reach the callback in order, as they are routed; a callback that
    raises is logged and the next message still comes; events() still ends with the
    connection."""
    async def body() -> None:
        fake = FakeApex()
        client = client_over(fake)
        got: list[bytes] = []

        def take(delivered: Delivered) -> None:
            got.append(delivered.content)
            if delivered.content == b"m2":
                raise RuntimeError("the application's bug")

        client.deliver_to(take)
        for n in (1, 2, 3):
            fake.stamped(data(n, n, link="other"), f"m{n}".encode())
        await settle()
        assert got == [b"m1", b"m2", b"m3"]
        assert not client._events.items  # nothing queued for events()
        await fake.close()
        await settle()
        await client.close()
    run(body)


def test_a_robust_subscriber_hands_each_message_once_in_order_and_commits_it(
        tmp_path: Path) -> None:
    """Messages released by the stub go to the callback in link order, each once (a copy
    sent again is not handed twice), and each counts as processed when the callback
    returns: close saves the position after the last of them."""
    async def body() -> None:
        state = tmp_path / "p.json"
        fake = FakeApex()
        client = client_over(fake)
        robust = await RobustSubscriber.open(client, L, state=state)
        got: list[Message] = []
        robust.deliver_to(got.append)
        fake.stamped(reset())
        fake.stamped(data(2, 2), b"m2")  # early: held until 1 comes
        fake.stamped(data(1, 1), b"m1")
        fake.stamped(data(1, 1), b"m1")  # a copy
        fake.stamped(data(3, 3), b"m3")
        await settle()
        assert [m.content for m in got] == [b"m1", b"m2", b"m3"]
        assert robust.positions().link_seq == 3
        assert robust._messages_queued == 0  # only notices are queued (for events())
        await robust.close()
        saved = PositionsFile(state).load()
        assert saved is not None and saved.link_seq == 3
        await client.close()
    run(body)


