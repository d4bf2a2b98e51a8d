"""`apexps watch --refresh`'s refresher (adapters/cli/watch_cmd.py): a refresh the broker could
not take now (421, or no answer in time) is tried again while the grant lasts, and said on
stderr; a refused one ends the refreshing. A fake client answers in the order given; the
clock is asyncio's, the grants a few hundredths of a second."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

import pytest

from adapters.apex.events_codec import WatchReply
from adapters.cli.watch_cmd import _refresher
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
