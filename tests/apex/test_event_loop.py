"""The commands' event loop (adapters/cli/loop.py): uvloop by default, asyncio on request."""

from __future__ import annotations

import asyncio

import pytest

from adapters.cli import loop as event_loop


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_uvloop_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # uvloop is a dependency on this platform, so the default must actually be used
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert event_loop.loop_name() == "uvloop"
    assert event_loop.run(_loop_type()) == "uvloop"


def test_asyncio_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert event_loop.loop_name() == "asyncio"
    assert event_loop.run(_loop_type()) == "asyncio"


def test_an_unknown_loop_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENV, "trio")
    with pytest.raises(SystemExit, match="uvloop or asyncio"):
        event_loop.loop_factory()
