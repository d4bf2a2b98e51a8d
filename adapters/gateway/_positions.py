"""Where a feed's deliveries sat on its link, and the gap requests that fetch them again.

Theory of operation
-------------------
A feed numbers its deliveries 1, 2, 3, … (its SSE event ids), and a reconnecting stream may be
owed deliveries the feed's buffer no longer holds: the broker must send them again (gap fill),
and it knows them by link position (epoch, link seq). `LinkPositions` remembers those positions
as runs: deliveries whose link seqs rose by one in one epoch are one run. On a topic
subscription's own link a run lasts until a heartbeat or a reset; on a user's shared link
(resource watches) the others' Notifies come between, so runs are mostly one delivery long.

`chunks` turns deliveries lo..hi into gap requests of at most the service's max gap seqs each,
skipping the seqs between runs (the others' on a shared link), so a watch's refill costs the
broker about as many items as it asks for, not the span of the link it crossed. Each chunk
knows which of its seqs are the feed's and their numbers (`ident`); the rest of what the
broker sends for the range is dropped.

Memory: at most `MAX_RUNS` runs (a small object each); deliveries older than the oldest run are
refused with `LinkContextGone`, which ends the stream as a refill the broker refused would.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from common.errors import LinkContextGone

__all__ = ["MAX_RUNS", "Chunk", "LinkPositions"]

#: Runs a feed remembers (a run ends at each heartbeat or reset, and on a shared link at nearly
#: every delivery): about 60 octets each.
MAX_RUNS = 4096


@dataclass(slots=True)
class _Run:
    """Deliveries first_id.. (count of them) carried link seqs first_seq.. of `epoch`."""

    first_id: int
    epoch: int | None
    first_seq: int
    count: int


@dataclass(slots=True)
class Chunk:
    """One gap request of a refill: link seqs first..last of `epoch`, of which the feed's are
    the segments (first seq, last seq, first delivery number)."""

    epoch: int | None
    first: int
    last: int
    segments: list[tuple[int, int, int]]

    def ident(self, seq: int) -> int | None:
        """The delivery number of link seq `seq` (None: not one of the feed's)."""
        for a, b, ident in self.segments:
            if a <= seq <= b:
                return ident + seq - a
        return None

    def wants(self, seq: int) -> bool:
        return self.ident(seq) is not None


class LinkPositions:
    """The link positions of one feed's deliveries; see the module docstring."""

    def __init__(self, max_runs: int = MAX_RUNS) -> None:
        self._runs: deque[_Run] = deque(maxlen=max_runs)
        #: the number the next delivery gets
        self.next_id = 1

    def number(self, epoch: int | None, link_seq: int) -> int:
        """The next delivery number, noting where the delivery sits on the link."""
        ident = self.next_id
        self.next_id += 1
        runs = self._runs
        last = runs[-1] if runs else None
        if (last is not None and last.epoch == epoch
                and last.first_seq + last.count == link_seq
                and last.first_id + last.count == ident):
            last.count += 1
        else:
            runs.append(_Run(ident, epoch, link_seq, 1))
        return ident

    def chunks(self, lo: int, hi: int, most: int) -> Iterator[Chunk]:
        """Deliveries lo..hi as gap requests of at most `most` link seqs each;
        `LinkContextGone` for deliveries older than the runs remembered."""
        runs = [r for r in self._runs if r.first_id + r.count > lo and r.first_id <= hi]
        if not runs or runs[0].first_id > lo:
            raise LinkContextGone(f"deliveries from {lo} are older than this gateway keeps")
        chunk: Chunk | None = None
        for run in runs:
            a, b = max(lo, run.first_id), min(hi, run.first_id + run.count - 1)
            seq, last_seq = run.first_seq + a - run.first_id, run.first_seq + b - run.first_id
            while seq <= last_seq:
                if chunk is None or chunk.epoch != run.epoch or seq - chunk.first >= most:
                    if chunk is not None:
                        yield chunk
                    chunk = Chunk(run.epoch, seq, seq, [])
                end = min(last_seq, chunk.first + most - 1)
                chunk.segments.append((seq, end, a))
                chunk.last = end
                a += end - seq + 1
                seq = end + 1
        if chunk is not None:
            yield chunk
