"""`Receipts`: which deliveries a recipient answered `ok`, for a service that asked to know.

A service sending data on its own (`ApexServer.send`) may give each recipient an opaque tag;
the pubsub fan-out tags a link's deliveries with the link record they carried last, to record
what its subscriber acknowledged (broker/robust/acks.py). Tags are kept per (session, channel)
in the order their MSGs went out. BEEP answers a channel's MSGs in order (RFC 3080 §2.6.1),
so the answer to msgno N settles every tag sent before it: N's own tags by what the answer
was, earlier ones (which can only be ones whose answer we missed) as not acknowledged. A session
that ends drops its unanswered tags: nothing was acknowledged for them.

Untagged deliveries cost nothing here, which is nearly all of them on a broker without links.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

__all__ = ["Receipts"]

#: (session number, channel)
_Key = tuple[int, int]


class Receipts:
    def __init__(self, answered: Callable[[object], None]) -> None:
        """`answered(tag)` is called for each tag whose delivery was answered `ok`."""
        self._answered = answered
        self._pending: dict[_Key, deque[tuple[int, Sequence[object]]]] = {}

    def sent(self, session: int, channel: int, msgno: int, tags: Sequence[object]) -> None:
        self._pending.setdefault((session, channel), deque()).append((msgno, tags))

    def replied(self, session: int, channel: int, msgno: int, *, ok: bool) -> None:
        queue = self._pending.get((session, channel))
        while queue:
            sent, tags = queue[0]
            if sent > msgno:
                break
            queue.popleft()
            if ok and sent == msgno:
                for tag in tags:
                    self._answered(tag)
        if queue is not None and not queue:
            del self._pending[(session, channel)]

    def session_ended(self, session: int) -> None:
        for key in [k for k in self._pending if k[0] == session]:
            del self._pending[key]

    def __len__(self) -> int:
        return sum(len(q) for q in self._pending.values())
