"""`apexps watch --refresh`'s refresher (adapters/cli/watch_cmd.py): a refresh the broker could
not take now (421, or no answer in time) is tried again while the grant lasts, and said on
stderr; a refused one ends the refreshing. A fake client answers in the order given; the
clock is asyncio's, the grants a few hundredths of a second."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from adapters.apex.codec import BEEP_XML, Data, Option
from adapters.apex.endpoint import Endpoint
from adapters.apex.events_codec import WatchReply, WatchRequest, decode_events, encode_events
from adapters.cli.watch_cmd import _refresher
from adapters.client.pubsub_client import PubsubClient
from common.errors import AccessDenied, JournalUnavailable

ARGS = argparse.Namespace(resource="q.w/IBM", events=frozenset(), expires=1, id="1", link=None)


class Answers:
    """`watch` answers each call with the next of `answers` (an exception is raised)."""

    def __init__(self, *answers: int | BaseException) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def watch(self, *_: Any, **__: Any) -> WatchReply:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else 0.05
        if isinstance(answer, BaseException):
            raise answer
        return WatchReply(250, 1, expires=answer)  # type: ignore[arg-type]


async def _run(client: Answers, until: float) -> None:
    task = asyncio.create_task(_refresher(client, ARGS, 0.05))  # type: ignore[arg-type]
    await asyncio.sleep(until)
    task.cancel()  # nothing if it returned already
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_a_refresh_the_broker_could_not_take_is_tried_again(
        capsys: pytest.CaptureFixture[str]) -> None:
    client = Answers(JournalUnavailable("the journal follower did not catch up"),
                     TimeoutError("no reply"))
    asyncio.run(_run(client, 0.5))
    assert client.calls >= 4  # the two failures, then refreshes again at each grant
    err = capsys.readouterr().err
    assert err.count("trying again") == 2 and "q.w/IBM" in err


def test_a_refused_refresh_ends_the_refreshing(capsys: pytest.CaptureFixture[str]) -> None:
    client = Answers(AccessDenied("no longer yours"))
    asyncio.run(_run(client, 0.3))
    assert client.calls == 1
    assert "the watch ends when its grant does" in capsys.readouterr().err


class WatchingApex:
    """Stands in for ApexClient under a real PubsubClient: records each watch request written
    and hands the client whatever data `reply` is given, as its read loop would."""

    timeout = 5.0

    def __init__(self) -> None:
        self.requests: asyncio.Queue[WatchRequest] = asyncio.Queue()
        self._receive: Callable[[Data | None], None] | None = None

    def deliver_to(self, callback: Callable[[Data | None], None]) -> None:
        self._receive = callback

    async def send(self, originator: Endpoint, recipients: Iterable[Endpoint], content: bytes,
                   content_type: str = BEEP_XML, *, options: Iterable[Option] = ()) -> None:
        doc = decode_events(content)
        assert isinstance(doc, WatchRequest)
        self.requests.put_nowait(doc)

    def reply(self, doc: WatchReply) -> None:
        assert self._receive is not None
        self._receive(Data(Endpoint.parse("apex=pubsub@example.com"),
                           (Endpoint.parse("sam@example.com"),), encode_events(doc), BEEP_XML))


def test_the_refresher_ends_when_cancelled_as_its_answer_arrives() -> None:
    """`apexps watch --count N` cancels the refresher when the Nth Notify comes, and a refresh's
    Notify comes right behind its watchreply: the cancel then lands in the very step that
    answers the refresh. Python 3.11's `asyncio.wait_for` swallowed such a cancel, so the
    refresher went on refreshing and the CLI never exited (the client now waits with
    `asyncio.timeout`)."""

    async def run() -> bool:
        apex = WatchingApex()
        client = PubsubClient(apex, Endpoint.parse("sam@example.com"))  # type: ignore[arg-type]
        args = argparse.Namespace(**{**vars(ARGS), "events": frozenset({1})})
        task = asyncio.create_task(_refresher(client, args, 0.05))
        async with asyncio.timeout(5):
            asked = await apex.requests.get()  # the refresher now waits for its answer
        apex.reply(WatchReply(250, asked.trans_id, asked.resource, asked.watch_id, 1))
        task.cancel()
        await asyncio.wait([task], timeout=2)
        ended = task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return ended

    assert asyncio.run(run()), "the refresher swallowed its cancel and kept refreshing"
