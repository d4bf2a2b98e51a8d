"""`Ticket`: a service's answer to one data, settled together with the rest of its batch.

Theory of operation
-------------------
A service that must wait before it answers a data returns an awaitable (relay.py). The pubsub
service answers a whole event-loop turn's publications at once: they are one journal batch,
and Kafka's acknowledgement of the batch settles all of them in one call on the event loop.
With an asyncio future per publication, that one call turned into a `set_result` per
publication and, for each, a loop callback of its own (asyncio schedules every done-callback
with `call_soon`), then a relay step and a server step per publication in separate loop
turns' worth of handles.

A `Ticket` is the same answer without the loop in between: `settle(result)` runs the callbacks
registered with `then` at once, in the caller's frame. The service settles a batch's tickets
in one loop pass, in order; the relay's `Pending.settle_then` registers on a ticket directly;
and the APEX server sees every reply of the batch settle within that one pass, so it writes
them with one structlog binding per channel and one socket write per connection.

A ticket is also awaitable, for callers that await a service's result (`Pending.settle`, a
service call with several recipients): awaiting makes the one asyncio future it then needs.

`settle` happens once; later calls are ignored (a service that gives up on a batch it already
answered changes nothing). A callback that raises is logged and does not stop the others:
they are other publishers' replies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Iterable
from typing import Any

import structlog

from .codec import Data

__all__ = ["Ticket", "TicketResult"]

log = structlog.get_logger(__name__)

#: What a ticket settles with: the service's answering data, or why it failed.
TicketResult = Iterable[Data] | BaseException


class Ticket:
    """One data's answer from a service that settles it with others (see module docstring)."""

    __slots__ = ("_callbacks", "_result", "settled")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[TicketResult], None]] = []
        self._result: TicketResult = ()
        self.settled = False

    def then(self, callback: Callable[[TicketResult], None]) -> None:
        """Call `callback(result)` when settled (at once if it is already)."""
        if self.settled:
            callback(self._result)
        else:
            self._callbacks.append(callback)

    def settle(self, result: TicketResult) -> None:
        """Settle with `result` and run the callbacks now, in the order they were added."""
        if self.settled:
            return
        self.settled, self._result = True, result
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(result)
            except Exception:  # one reply's bug must not cost the rest of the batch theirs
                log.exception("ticket callback failed")

    def __await__(self) -> Generator[Any, None, Iterable[Data]]:
        future: asyncio.Future[Iterable[Data]] = asyncio.get_running_loop().create_future()

        def done(result: TicketResult) -> None:
            if future.done():
                return
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

        self.then(done)
        return (yield from future.__await__())
