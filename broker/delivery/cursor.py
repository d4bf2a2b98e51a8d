"""`ForwardCursor`: forward on acknowledgement, in journal order, each entry once.

Theory of operation
-------------------
A publication reaches the fan-out by two roads. The *ack road*: Kafka acknowledged its journal
record (partition and offset known), and the publishing broker hands the entry over from memory
at once (`acked`). The *follower road*: the journal follower fetches every record of the journal
back (`followed`), including what other writers put there (a later issue runs several brokers
on one namespace; a GAP record the journal itself wrote is another writer here). Each road
alone is in offset order per partition, and the follower's alone is complete.

Per journal partition the cursor keeps `next`: the first offset not yet forwarded. Everything
below it was forwarded (or was a record that forwards nothing: a GAP, a tombstone, an
undecodable record, which only the follower can vouch for). So:
- an acked entry at `next` is forwarded at once, and `next` moves past it and past the acked
  entries waiting right behind it;
- an acked entry above `next` waits: something below it (another writer's record, or one of
  ours whose acknowledgement is still on its way) has not been seen yet;
- an acked entry below `next` is dropped: forwarded already (the follower got there first);
- the follower's entries below `next` are dropped (forwarded on acknowledgement); one at or
  above `next` is forwarded, since the follower read every offset before it; and once the
  follower has read up to `reached`, `next` is at least that, the waiting acked entries below
  it are dropped (the follower forwarded their records) and those from `next` on go.
Nothing here assumes this broker is the journal's only writer: a partition whose every record
is ours moves on acknowledgements alone; one shared with others moves as fast as the follower
fills their offsets. Subscribers still only see what Kafka holds: an acked entry is one Kafka
acknowledged, a followed one one Kafka returned.

`start(positions)` is where the follower begins, per partition: nothing before it is
forwarded. Until a partition is started, its acked entries wait and its follower entries set
it. Not thread-safe: one thread (the event loop) calls everything; `forward` is called there,
with each batch in per-partition offset order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from broker.records import JournalEntry

__all__ = ["ForwardCursor"]


class ForwardCursor:
    """See the module docstring."""

    def __init__(self, forward: Callable[[list[JournalEntry]], None]) -> None:
        self._forward = forward
        #: partition -> the first offset not yet forwarded
        self._next: dict[int, int] = {}
        #: partition -> offset -> an acked entry waiting for the offsets below it
        self._waiting: dict[int, dict[int, JournalEntry]] = {}
        #: how many entries came by each road (logs, tests, the benchmark)
        self.by_ack = 0
        self.by_follower = 0

    def start(self, positions: Mapping[int, int]) -> None:
        """The follower begins at `positions` (offset per partition)."""
        out: list[JournalEntry] = []
        for part, offset in positions.items():
            self._next[part] = max(offset, self._next.get(part, offset))
            self._drain(part, out)
        self._hand(out, ack=True)

    def next_offset(self, part: int) -> int | None:
        """The first offset of `part` not yet forwarded (None: the partition is not started)."""
        return self._next.get(part)

    def waiting(self) -> int:
        """Acked entries waiting for the follower to fill the offsets below them."""
        return sum(len(w) for w in self._waiting.values())

    def acked(self, entries: Sequence[JournalEntry]) -> None:
        """Kafka acknowledged these journal records (any order across calls)."""
        out: list[JournalEntry] = []
        nxt = self._next
        for entry in entries:
            part, offset = entry.position
            at = nxt.get(part)
            if at is None or offset > at:
                self._waiting.setdefault(part, {})[offset] = entry
            elif offset == at:
                out.append(entry)
                nxt[part] = offset + 1
                if self._waiting.get(part):
                    self._drain(part, out)
            # offset < at: the follower forwarded it already
        self._hand(out, ack=True)

    def followed(self, entries: Sequence[JournalEntry], reached: Mapping[int, int]) -> None:
        """The follower read every record of each partition up to `reached` (exclusive) since
        its last call; `entries` are the DATA ones among them, in offset order."""
        out: list[JournalEntry] = []
        nxt = self._next
        for entry in entries:
            part, offset = entry.position
            if offset >= nxt.get(part, offset):
                out.append(entry)
                nxt[part] = offset + 1
        self._hand(out, ack=False)
        out = []
        for part, end in reached.items():
            if end > nxt.get(part, -1):
                nxt[part] = end
            waiting = self._waiting.get(part)
            if waiting:
                for offset in [o for o in waiting if o < nxt[part]]:
                    del waiting[offset]  # the follower forwarded its record
                self._drain(part, out)
        self._hand(out, ack=True)

    def _drain(self, part: int, out: list[JournalEntry]) -> None:
        """Move the acked entries waiting right at `next` of `part` to `out`."""
        waiting = self._waiting.get(part)
        if not waiting:
            return
        at = self._next[part]
        while at in waiting:
            out.append(waiting.pop(at))
            at += 1
        self._next[part] = at

    def _hand(self, out: list[JournalEntry], *, ack: bool) -> None:
        if not out:
            return
        if ack:
            self.by_ack += len(out)
        else:
            self.by_follower += len(out)
        self._forward(out)
