"""A model broker for the subscriber stub's tests: the binding's promises (docs/robust-binding.md
§5) kept in memory, with a lossy, duplicating, reordering channel to one subscriber.

Not a fake of apexps's broker: a reference of what any conforming broker does, small enough to
read. Requests are answered at once; what the subscriber receives waits in `channel` until the
test delivers, drops, duplicates or swaps it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict, deque
from dataclasses import dataclass

from adapters.apex.robust_codec import GapRequest, LinkReply, RepairRequest
from adapters.apex.robust_stamp import Stamp, StampKind
from broker.records import PublishType
from broker.robust.linkseq import LinkSeqSpace
from common.errors import ApexpsError


@dataclass(frozen=True)
class Sent:
    """One data on the channel."""

    stamp: Stamp
    content: bytes


Item = Sent | LinkReply


class ModelBroker:
    def __init__(self, link: str, bits: int, *, max_gap: int, seq: int = 0, epoch: int = 0,
                 time: int = 1_000) -> None:
        self.link = link
        self.space = LinkSeqSpace(bits)
        self.max_gap = max_gap
        self.time = time
        self.epoch = epoch
        self.seq = seq
        #: the current epoch's refillable link seqs (a newer lap overwrites an older one)
        self.records: dict[int, Sent] = {}
        self.journal: list[tuple[str, int, int]] = []
        self.published: dict[str, int] = defaultdict(int)
        self.channel: deque[Item] = deque()
        self.requests = 0

    # --- what the broker does on its own ----------------------------------------------------

    def _put(self, stamp: Stamp, content: bytes) -> None:
        sent = Sent(stamp, content)
        self.records[stamp.link_seq] = sent
        self.channel.append(sent)

    def _data(self, source: str, seq: int, time: int) -> None:
        self.seq = self.space.next(self.seq)
        self._put(Stamp(self.link, self.seq, StampKind.DATA, self.epoch, source, seq,
                        PublishType.UPDATE, "equity.quote", time=time),
                  f"{source}:{seq}".encode())

    def publish(self, source: str) -> None:
        self.time += 1
        self.published[source] += 1
        self.journal.append((source, self.published[source], self.time))
        self._data(source, self.published[source], self.time)

    def heartbeat(self) -> None:
        self.seq = self.space.next(self.seq)
        self._put(Stamp(self.link, self.seq, StampKind.HEARTBEAT, self.epoch, time=self.time),
                  b"<heartbeat interval='1000' />")

    def reset(self, repair: int | None = None) -> None:
        """A new epoch: the marker goes out, the old epoch's seqs can no longer be refilled."""
        self.epoch += 1
        self.seq = 0
        self.records.clear()
        self.channel.append(Sent(Stamp(self.link, 0, StampKind.RESET, self.epoch,
                                       time=self.time, repair=repair), b"<linkreset />"))

    def forget(self) -> None:
        """The link retention window passed: nothing of this epoch can be refilled."""
        self.records.clear()

    # --- requests ---------------------------------------------------------------------------

    def gap(self, req: GapRequest) -> None:
        self.requests += 1

        def reply(code: int) -> None:
            self.channel.append(LinkReply(code, self.link, req.trans_id, self.epoch, self.seq))

        if req.epoch is not None and req.epoch != self.epoch:
            reply(569)
            return
        hi = req.link_to
        if hi is None:
            if req.link_from == self.space.next(self.seq):
                reply(250)
                return
            hi = self.seq
        try:
            self.space.check_range(req.link_from, hi, self.max_gap)
        except ApexpsError as exc:
            reply(int(exc.code))
            return
        seqs = list(self.space.expand(req.link_from, hi))
        if self.seq == 0 or any(s not in self.records for s in seqs):
            reply(569)
            return
        for s in seqs:
            sent = self.records[s]
            self.channel.append(Sent(dataclasses.replace(sent.stamp, refill=True), sent.content))
        reply(250)

    def repair(self, req: RepairRequest) -> None:
        self.requests += 1
        self.reset(repair=req.trans_id)
        listed = {p.source: p.after for p in req.sources}
        for source, seq, time in self.journal:
            if source in listed:
                wanted = seq > listed[source]
            else:
                wanted = req.since is not None and time >= req.since
            if wanted:
                self._data(source, seq, time)
        self.channel.append(LinkReply(250, self.link, req.trans_id, self.epoch, self.seq))
