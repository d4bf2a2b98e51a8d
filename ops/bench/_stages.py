"""Stage timestamps of a resource Notify's path, for `bench_gateway --stages`.

Run as `python -m ops.bench._stages STAGES-FILE apexps-args...`: it installs wrappers on the
few functions a Notify passes through, then runs the `apexps` command line as usual. Nothing
of the broker or the gateway changes: the wrappers call what they wrap and note the wall clock
(`time.time_ns`, one clock for every process of this machine) under the Notify's key, the
publisher's send time, which the benchmark's publications carry as their whole content and
the Notify carries as its newest version. A thread writes what was noted to STAGES-FILE as
`stage key ns` lines twice a second.

Stages (in path order):
- `broker_in`: the publication reached the pubsub handler (APEX decoded);
- `data_acked`: Kafka acknowledged its journal record (the handler's `_appended`);
- `notify_emitted`: the event notifier handed the Notify to the publish gate;
- `notify_acked`: Kafka acknowledged the Notify's journal record;
- `notify_rendered`: the delivery core's `Send` of it was rendered onto the BEEP session;
- `gw_in`: the gateway's user session decoded it;
- `sse_out`: the gateway's SSE handler took it off the stream's queue to write it.

Beside them, per process: the event loop's lag (a 10 ms timer's lateness, as `lag loop NS
AT`), every garbage collection that took over 1 ms (`gc GEN NS AT`), AT the wall clock, and
every loop callback that held the loop over `STALL_MS` (`stall NS AT SITE`): a thread notes
the main thread's Python stack every `SAMPLE_S`, and a stall is a run of samples inside one
callback (the same outermost frame under the loop); SITE is the innermost apexps frames seen
most often in it. A lag says the loop was late; a stall says what held it. (That is how the
item store's checkpoint round was found holding the broker's loop 23-47 ms once a second.)
"""

from __future__ import annotations

import asyncio
import base64
import collections
import gc
import re
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any

_NOTED: list[str] = []
#: How often the stall sampler looks at the main thread, and the least stall it notes.
SAMPLE_S = 0.004
STALL_MS = 12
#: The project's packages: a stall's site is named by their frames, not the library's.
_OWN = ("/broker/", "/adapters/", "/common/")
_VERSION = re.compile(rb">([A-Za-z0-9+/=]+)</version></notify>")
_SSE_CONTENT = re.compile(rb'"content":"(\d+)"\}\]\}')


def note(stage: str, key: bytes | str | None) -> None:
    if key:
        _NOTED.append(f"{stage} {key.decode() if isinstance(key, bytes) else key}"
                      f" {time.time_ns()}\n")


def _notify_key(content: bytes) -> bytes | None:
    m = _VERSION.search(content)
    return None if m is None else base64.b64decode(m.group(1))


def _writer(path: str) -> None:
    with open(path, "a") as out:
        while True:
            time.sleep(0.5)
            batch = _NOTED[:]
            del _NOTED[:len(batch)]
            out.writelines(batch)
            out.flush()


def _wrap(owner: Any, name: str, before: Callable[..., None] | None = None,
          after: Callable[..., None] | None = None) -> None:
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(*args, **kwargs)
        result = inner(*args, **kwargs)
        if after is not None:
            after(result, *args, **kwargs)
        return result

    setattr(owner, name, wrapper)


def _broker() -> None:
    from adapters.pubsub import _deliveries, events, handler
    from broker.names import NOTIFY_TOPIC

    def publish(_self: Any, data: Any, topic: str) -> None:
        note("broker_in", data.content)

    def appended(_self: Any, batch: Any, results: Any) -> None:
        for pub, _ in batch:
            note("data_acked", pub.content)

    def emit(_self: Any, notes: Any, *_: Any) -> None:
        for n in notes:
            if n.entry is not None:
                note("notify_emitted", n.entry.content)

    def forward_acked(_self: Any, pubs: Any, results: Any) -> None:
        for pub in pubs:
            if pub.topic == NOTIFY_TOPIC:
                note("notify_acked", _notify_key(pub.content))

    def render(_result: Any, _self: Any, action: Any) -> None:
        for item in action.items:
            if item.entry is not None and item.entry.topic == NOTIFY_TOPIC:
                note("notify_rendered", _notify_key(item.entry.content))

    _wrap(handler.PubsubHandler, "_publish", publish)
    _wrap(handler.PubsubHandler, "_appended", appended)
    _wrap(events.EventNotifier, "emit", emit)
    _wrap(handler.PubsubHandler, "_forward_acked", forward_acked)
    _wrap(_deliveries.Renderer, "render", after=render)


def _gateway() -> None:
    from adapters.gateway import _feeds, _upstream

    def notify_of(result: Any, _message: Any) -> None:
        if result is not None and result.versions and not result.current:
            note("gw_in", result.versions[-1].content)

    _wrap(_upstream, "notify_of", after=notify_of)
    inner_get = _feeds.Stream.get

    async def get(self: Any) -> Any:
        item = await inner_get(self)
        if item is not None:
            m = _SSE_CONTENT.search(item[1])
            note("sse_out", None if m is None else m.group(1))
        return item

    _feeds.Stream.get = get  # type: ignore[method-assign]


def _gc_pauses() -> None:
    started = [0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter_ns()
        else:
            took = time.perf_counter_ns() - started[0]
            if took > 1_000_000:
                _NOTED.append(f"gc {info['generation']} {took} {time.time_ns()}\n")

    gc.callbacks.append(timed)


def _site(frame: FrameType | None) -> str:
    """The three innermost apexps frames of a stack, innermost first."""
    out: list[str] = []
    while frame is not None and len(out) < 3:
        code = frame.f_code
        if any(part in code.co_filename for part in _OWN):
            name = code.co_filename.rsplit("/", 1)[-1]
            out.append(f"{name}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return "<".join(out) or "-"


def _callback(frame: FrameType | None) -> FrameType | None:
    """The outermost frame above the event loop (the callback it runs), None when idle."""
    below: FrameType | None = None
    while frame is not None:
        if frame.f_code.co_filename.endswith("runners.py"):  # asyncio.run: uvloop is C
            return below
        below, frame = frame, frame.f_back
    return None


def _stalls() -> None:
    main = threading.main_thread().ident
    assert main is not None  # the main thread runs: it started this one
    current: int | None = None
    began = 0
    sites: collections.Counter[str] = collections.Counter()
    while True:
        time.sleep(SAMPLE_S)
        stack = sys._current_frames().get(main)
        if stack is None:
            return
        callback = _callback(stack)
        now = time.perf_counter_ns()
        held = None if callback is None else id(callback)
        if held != current:
            if current is not None and now - began > STALL_MS * 1_000_000:
                site = sites.most_common(1)[0][0] if sites else "-"
                _NOTED.append(f"stall {now - began} {time.time_ns()} {site}\n")
            current, began = held, now
            sites.clear()
        if held is not None:
            sites[_site(stack)] += 1


def _loop_lag(run: Callable[..., Any]) -> Callable[..., Any]:
    async def lag() -> None:
        while True:
            t = time.perf_counter_ns()
            await asyncio.sleep(0.01)
            _NOTED.append(f"lag loop {time.perf_counter_ns() - t - 10_000_000}"
                          f" {time.time_ns()}\n")

    def wrapped(main: Coroutine[Any, Any, Any]) -> Any:
        async def with_lag() -> Any:
            probe = asyncio.ensure_future(lag())
            try:
                return await main
            finally:
                probe.cancel()
        return run(with_lag())

    return wrapped


def main() -> int:
    path, args = sys.argv[1], sys.argv[2:]
    if "broker" in args:
        _broker()
    if "gateway" in args:
        _gateway()
    _gc_pauses()
    threading.Thread(target=_stalls, daemon=True).start()
    from adapters.cli import loop
    loop.run = _loop_lag(loop.run)
    threading.Thread(target=_writer, args=(path,), daemon=True).start()
    from adapters.cli.main import main as cli
    return cli(args)


if __name__ == "__main__":
    sys.exit(main())
