"""The shell of the acknowledgement log (broker/robust/acks.py): takes the server's word that
a subscriber answered `ok`, and writes what moved at most every `ACK_FLUSH_S` on the event loop.

No timer runs while nothing is acknowledged: the first `ok` after a flush arms one. `reached`
is what an operator or a test awaits instead of polling Kafka."""

from __future__ import annotations

import asyncio

from broker.robust.acks import ACK_FLUSH_S, AckLog, AckTag

__all__ = ["AckRecorder"]


class AckRecorder:
    def __init__(self, acks: AckLog, loop: asyncio.AbstractEventLoop, *,
                 interval_s: float = ACK_FLUSH_S) -> None:
        self._acks, self._loop, self._interval = acks, loop, interval_s
        self._timer: asyncio.TimerHandle | None = None
        #: (link, epoch) -> (link seq, future) of those awaiting `reached`
        self._waiters: dict[tuple[str, int], list[tuple[int, asyncio.Future[None]]]] = {}

    def answered(self, tag: object) -> None:
        """`ApexServer`'s `answered`: the delivery tagged `tag` was answered `ok`."""
        if not isinstance(tag, AckTag) or not self._acks.acked(tag):
            return
        if self._timer is None:
            self._timer = self._loop.call_later(self._interval, self._flush)
        waiting = self._waiters.get((tag.link, tag.epoch))
        if waiting:
            for pair in [w for w in waiting if w[0] <= tag.seq]:
                waiting.remove(pair)
                if not pair[1].done():
                    pair[1].set_result(None)

    async def reached(self, link: str, epoch: int, seq: int) -> None:
        """Return once the subscriber of `link` has answered `ok` through link seq `seq` of
        `epoch` (seqs rise within an epoch until they wrap; for a wrapped link, ask again)."""
        known = self._acks.acknowledged(link, epoch)
        if known is not None and known.seq >= seq:
            return
        done = self._loop.create_future()
        self._waiters.setdefault((link, epoch), []).append((seq, done))
        await done

    def _flush(self) -> None:
        self._timer = None
        self._acks.flush()

    def close(self) -> None:
        """Write what is left (the broker is stopping: its last word goes to Kafka too)."""
        if self._timer is not None:
            self._timer.cancel()
        self._flush()
