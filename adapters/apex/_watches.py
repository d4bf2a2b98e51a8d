"""`Watches`: the server's RFC 3342 timers -- replies awaited for deliveries, and held data.

Theory of operation
-------------------
Most deliveries are fire-and-forget: the subscriber's `ok` changes nothing. A delivery the relay
gave a `Watch` (dataTiming, hold4Endpoint) is different: its reply decides something, so it is
remembered by (session, channel, msgno) until the application's RPY or ERR comes (`replied`).
`loop.call_later` timers stand for its deadline (noLaterThan: no `ok` in time means the delivery
failed, RFC 3342 §2.1) and its report time (reportAfter: say so and keep waiting, §2.2). The
watch's reports are data the relay has already addressed; they go out through `send`, like any
data a service sends. Held data (hold4Endpoint) is released on `ok`; on `error`, or when the
session ends before replying, it is held again -- and goes at once to a newer attachment of the
endpoint if there is one (`session_ended`).

One more timer wakes the relay when held data's next deadline or report time comes
(`Relay.expire_held`). It is re-armed after anything that may have held something new, and never
armed again once the server is closing: sessions still winding down would otherwise set timers
on a loop that is about to go.

This module keeps no session state of its own beyond the keys: the server tells it what was
delivered, replied and lost, and it answers with deliveries for the server to route.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from adapters.beep import ErrorReplyReceived, ReplyReceived

from ._party import Watch
from .codec import Data
from .relay import Delivery, Relay

__all__ = ["Watches"]

# The server's log: these lines were its own before the timers moved here.
log = structlog.get_logger("adapters.apex.server")

#: (session number, channel, msgno) of a delivery whose reply is awaited
Key = tuple[int, int, int]


@dataclass(slots=True)
class _Watched:
    """A delivered data whose reply we wait for (see the module docstring)."""

    key: Key
    watch: Watch
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    done: bool = False

    def finish(self) -> bool:
        """Mark it settled; False if it already was."""
        if self.done:
            return False
        self.done = True
        for timer in self.timers:
            timer.cancel()
        return True


class Watches:
    """The watched deliveries of one server and the held-data timer.

    Args:
        relay: whose held data this times (`holds`, `requeue_held`, `expire_held`).
        send: routes a report the watch produces (the server's `send`).
        deliver: routes deliveries that requeued or expired held data produce.
    """

    def __init__(self, relay: Relay, send: Callable[[Data], None],
                 deliver: Callable[[Sequence[Delivery]], None]) -> None:
        self.relay, self._send, self._deliver = relay, send, deliver
        self._watched: dict[Key, _Watched] = {}
        self._hold_timer: asyncio.TimerHandle | None = None
        self._hold_due: int | None = None
        self._closing = False

    def watch(self, key: Key, watch: Watch) -> None:
        """The delivery `key` went out with `watch`: await its reply."""
        watched = _Watched(key, watch)
        loop = asyncio.get_running_loop()
        if watch.deadline is not None:
            watched.timers.append(loop.call_later(watch.deadline, self._timed_out, watched))
        if watch.report_after is not None:
            watched.timers.append(loop.call_later(watch.report_after, self._late, watched))
        self._watched[key] = watched

    def replied(self, session: int, event: ReplyReceived | ErrorReplyReceived) -> None:
        """A reply came on `session`; it settles the delivery it answers, if watched."""
        watched = self._watched.pop((session, event.channel, event.msgno), None)
        if watched is None or not watched.finish():
            return
        watch, holds = watched.watch, self.relay.holds
        if isinstance(event, ErrorReplyReceived):
            if watch.hold_id is not None:
                self.relay.requeue_held(watch.hold_id, redeliver=False)
                self.arm_holds()
            return
        if watch.hold_id is not None and holds is not None:
            holds.release(watch.hold_id)
        if watch.on_ok is not None:
            self._send(watch.on_ok)

    def _timed_out(self, watched: _Watched) -> None:
        """No `ok` within noLaterThan: the delivery failed (RFC 3342 §2.1)."""
        self._watched.pop(watched.key, None)
        if not watched.finish():
            return
        watch, holds = watched.watch, self.relay.holds
        log.info("delivery timed out", hold_id=watch.hold_id)
        if watch.hold_id is not None and holds is not None:
            holds.release(watch.hold_id)
        if watch.on_timeout is not None:
            self._send(watch.on_timeout)

    def _late(self, watched: _Watched) -> None:
        """No `ok` within reportAfter: say so, keep waiting (RFC 3342 §2.2)."""
        if not watched.done and watched.watch.on_late is not None:
            self._send(watched.watch.on_late)

    def undelivered(self, delivery: Delivery) -> None:
        """`delivery` could not be written: held data it carried waits again."""
        watch = delivery.watch
        if watch is not None and watch.hold_id is not None:
            self.relay.requeue_held(watch.hold_id, redeliver=False)

    def session_ended(self, session: int) -> None:
        """A session ended before replying: its held data waits again (or goes to a newer
        attachment); a watch with a deadline keeps its timers (no `ok` can come now, so the
        deadline will pass and report), the others are dropped."""
        for key in [k for k in self._watched if k[0] == session]:
            watched = self._watched[key]
            if watched.watch.hold_id is not None:
                del self._watched[key]
                if watched.finish():
                    self._deliver(self.relay.requeue_held(watched.watch.hold_id))
            elif watched.watch.deadline is None:
                del self._watched[key]
                watched.finish()
        self.arm_holds()

    def closing(self) -> None:
        """The server is closing: set no new hold timer from now on."""
        self._closing = True

    def stop(self) -> None:
        """Cancel every timer and forget every watch."""
        for watched in self._watched.values():
            watched.finish()
        self._watched.clear()
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = self._hold_due = None

    def arm_holds(self) -> None:
        """Keep one timer set for the earliest deadline or report time among held data."""
        holds = self.relay.holds
        due = None if holds is None or self._closing else holds.next_due()
        if due is None or (self._hold_due is not None and self._hold_due <= due):
            return
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        delay = max(0.0, due / 1000 - self.relay.clock())
        self._hold_timer = asyncio.get_running_loop().call_later(delay, self._holds_due)
        self._hold_due = due

    def _holds_due(self) -> None:
        self._hold_timer = self._hold_due = None
        self._deliver(self.relay.expire_held())
        self.arm_holds()
