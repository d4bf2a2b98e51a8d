"""The subscriber stub (XEP-0040 §2), sans-I/O: stamps in, a contiguous stream and requests out.

Theory of operation
-------------------
The stub serves one link. Its caller (the async client, later) hands it every stamped data that
arrives (`receive`), every `linkreply` (`on_reply`), the passing of time (`tick`) and each
reconnection (`resume`); each call returns a list of actions: `Deliver` to the application,
`RequestGap` / `RequestRepair` to send to `apex=pubsub@D` (their `request_id` is the transID
to send), and notices (`Delayed`, `SilentLink`, `Reset`, `Repaired`, `Lost`, `LinkRefused`).
No socket, no clock, no asyncio: time is the `now` argument, in seconds.

Ordering. Within an epoch link seqs are numbered internally by an absolute count from the
*frontier*, the last seq consumed in order, so the wrap never enters the bookkeeping:
`LinkSeqSpace.distance(frontier, seq)` says how far ahead an arriving seq is (≤ 0: already
had, a duplicate). The next seq is consumed at once, then whatever it unblocks from the *held*
items; a seq further ahead is held and the seqs between become a *hole*, asked for at once by
link range (in pieces of at most `max_gap`). Heartbeats take seqs like data, so a hole shows
even on a quiet link. A hole that persists past `gap_timeout` is reported `Delayed` and asked
for again; after `max_attempts`, or when the broker answers 569/570/553, or the hole is larger
than `max_gap`, or more than `max_held` items wait, the stub stops trying by link seq and
repairs by source (below). When a hole closes, `Repaired`.

Exactly once, in per-source order. A data item is delivered only if its source seq is above
the last one delivered for that source; otherwise it is dropped as a duplicate. Since the link
carries each source in source order and the stub consumes the link in order, that is enough.
Snapshot copies (stamp `snapshot`, robust-binding §9) are state, not the stream: they are
delivered in link order without that check and move neither the per-source positions nor the
frontier's journal time.

Epochs and repair. A stamp of an older epoch is stale and dropped. A reset or any stamp of a
newer epoch that the stub did not ask for means the broker lost this link's context: the stub
reports `Reset`, drops what it holds, and sends `RequestRepair` with its last source seq per
source and `since` (the journal time of its frontier, less `repair_margin_ms`, for sources it
has not seen yet). Until the reset that answers that request (stamp `repair` = its id) arrives,
it drops everything: the repair epoch brings back, per source in source order, all it had not
yet delivered, and mixing in items of the intermediate epoch would break per-source order. A
repair refused with 570 is reported `Lost` and the stub asks to restart from live data.

Reconnecting. `resume(now)` after a (re)connection asks for everything after the frontier (an
open-ended gap) and holds every stamp that arrives until the answer: 250 means the refill came
first and the held stamps are processed in order; 569/570 mean repair by source. Positions
(`Positions`, JSON) survive an application restart the same way.

Heartbeats. Nothing heard for twice the interval: `Delayed("heartbeat")`; for `silent_factor` times
the interval: `SilentLink` (the caller may reconnect). Both once per silence.

Why one module of this length: it is one state machine (like h11's `_state.py`); gap
detection, reordering, repair and resumption all read and change the same per-link state, and
splitting them would move that state behind accessors without making any rule easier to read.
What it says and keeps (its actions, counters and `Positions`) are plain values, in
`_stub_actions.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from adapters.apex.robust_codec import LinkReply, SourcePosition
from adapters.apex.robust_stamp import Stamp, StampKind
from broker.robust.config import DEFAULT_MAX_GAP
from broker.robust.linkid import validate_link_id
from broker.robust.linkseq import LinkSeqSpace
from common.errors import InvalidParameter

from ._stub_actions import (
    Action,
    Delayed,
    Deliver,
    LinkRefused,
    Lost,
    Positions,
    Repaired,
    RequestGap,
    RequestRepair,
    ResequencerCounters,
    Reset,
    SilentLink,
)

__all__ = [
    "Action",
    "Delayed",
    "Deliver",
    "LinkRefused",
    "Lost",
    "Positions",
    "Repaired",
    "RequestGap",
    "RequestRepair",
    "Resequencer",
    "ResequencerCounters",
    "Reset",
    "SilentLink",
]

#: Items held while a hole is filled; beyond this the stub repairs by source instead. A
#: refill answers in well under a second, so this is seconds of a busy link.
DEFAULT_MAX_HELD = 50_000
#: Tries of one hole by link range before repairing by source.
DEFAULT_MAX_ATTEMPTS = 3
#: A silent link is reported after this many heartbeat intervals without a word.
DEFAULT_SILENT_FACTOR = 4
#: Repair requests of one round the stub still accepts the answer to.
MAX_ROUND = 16
#: The longest a repair request waits before it is asked again (the wait doubles up to it): a
#: catch-up of a long outage takes the broker a while to read and write.
MAX_REPAIR_WAIT = 120.0
#: `since` in a repair reaches back this far before the frontier's journal time, for sources
#: whose messages were in flight in other partitions (clock skew between journal partitions).
DEFAULT_REPAIR_MARGIN_MS = 1_000


# --- the stub -------------------------------------------------------------------------------


class _Mode(Enum):
    #: no epoch known yet: the first stamp starts the stream
    FRESH = "fresh"
    #: consuming the link in order
    LIVE = "live"
    #: after resume(): holding stamps until the open-ended gap is answered
    RESUMING = "resuming"
    #: repair by source asked for: dropping everything until the reset that answers it
    REPAIRING = "repairing"


@dataclass
class _Hole:
    """One hole as detected: its seqs, for the notices; `missing` counts what is still out."""

    link_from: int
    link_to: int
    size: int
    detected_at: float
    requested_at: float
    missing: int
    attempts: int = 1
    reported: bool = False


@dataclass(frozen=True, slots=True)
class _Pending:
    kind: Literal["gap", "resume", "repair"]
    sent_at: float
    lo: int = 0  # gap: absolute range asked for
    hi: int = 0
    hole: int = 0
    empty: bool = False  # repair: a restart from live (nothing to lose any more)
    attempt: int = 1  # repair: how many times this round has asked (the wait doubles)


class Resequencer:
    """One link's stub; see the module docstring.

    Args:
        link_id: the link this stub serves (stamps of other links are refused).
        bits: the link seq resolution the broker advertised.
        heartbeat_interval: the advertised heartbeat interval, seconds.
        positions: where a previous run stopped (`Positions.from_json`).
        max_gap: the broker's maximum gap fill; larger holes are repaired by source.
        max_held: most items held while holes are filled.
        gap_timeout: how long a hole may stay unanswered before it is `Delayed` and asked
            for again (default twice the heartbeat interval).
        repair_timeout: how long a repair or resume may stay unanswered before it is sent
            again (default 10 heartbeat intervals).
        request_ids: where the transIDs of its requests come from (default: its own count
            from 1); a client that sends requests of its own on the same session passes its
            counter, so the two never use the same transID.
    """

    def __init__(self, link_id: str, bits: int, heartbeat_interval: float, *,
                 positions: Positions | None = None, max_gap: int = DEFAULT_MAX_GAP,
                 max_held: int = DEFAULT_MAX_HELD, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 gap_timeout: float | None = None, repair_timeout: float | None = None,
                 silent_factor: float = DEFAULT_SILENT_FACTOR,
                 repair_margin_ms: int = DEFAULT_REPAIR_MARGIN_MS,
                 request_ids: Callable[[], int] | None = None) -> None:
        self.link = validate_link_id(link_id)
        self.space = LinkSeqSpace(bits)
        self._maximum = self.space.maximum
        if heartbeat_interval <= 0:
            raise InvalidParameter("the heartbeat interval is positive")
        self.heartbeat_interval = heartbeat_interval
        self.max_gap = max(1, min(max_gap, self.space.window))
        self.max_held = max_held
        self.max_attempts = max_attempts
        self.gap_timeout = 2 * heartbeat_interval if gap_timeout is None else gap_timeout
        self.repair_timeout = 10 * heartbeat_interval if repair_timeout is None \
            else repair_timeout
        self.silent_factor = silent_factor
        self.repair_margin_ms = repair_margin_ms
        self.counters = ResequencerCounters()
        self._mode = _Mode.FRESH
        self._epoch: int | None = None
        self._seq = 0  # frontier link seq
        self._abs = 0  # frontier as an absolute count within the epoch
        self._time: int | None = None  # journal time of the frontier
        #: time of the first stamp ever seen: the best `since` a stub that consumed nothing
        #: has (what it missed before that stamp was sent shortly before, within the margin)
        self._first_time: int | None = None
        self._sources: dict[str, int] = {}
        self._held: dict[int, tuple[Stamp, bytes]] = {}
        self._top = 0  # highest absolute count seen (held or consumed)
        #: missing absolute counts as disjoint [lo, hi, hole id] runs, sorted by lo
        self._missing: list[list[int]] = []
        self._holes: dict[int, _Hole] = {}
        self._pending: dict[int, _Pending] = {}
        self._queued: list[tuple[Stamp, bytes]] = []  # while RESUMING
        self._repair_id: int | None = None
        #: every repair request of the current round (they all ask the same: positions do not
        #: move while repairing), newest last; the reset answering any of them is ours
        self._round: list[int] = []
        self._next_id = 0
        self._request_ids = request_ids
        self._hole_ids = 0
        self._heard: float | None = None
        self._late_reported = False
        self._silent_reported = False
        if positions is not None:
            if positions.link != self.link or positions.bits != bits:
                raise InvalidParameter("the positions are for another link or resolution")
            self._sources = dict(positions.sources)
            self._time = positions.time
            if positions.epoch is not None:
                self._epoch, self._seq = positions.epoch, positions.link_seq
                self._mode = _Mode.LIVE

    # --- what the application may read ----------------------------------------------------

    def positions(self) -> Positions:
        """Where the stream stands; persist `to_json()` after the application has processed
        what was delivered, and pass it back on restart."""
        return Positions(self.link, self.space.bits, self._epoch, self._seq, self._time,
                         dict(self._sources))

    @property
    def idle(self) -> bool:
        """Nothing missing, held, queued or asked for: the application has all that came."""
        return self._mode in (_Mode.LIVE, _Mode.FRESH) and not self._held \
            and not self._missing and not self._pending

    # --- inputs -----------------------------------------------------------------------------

    def receive(self, stamp: Stamp, content: bytes, now: float) -> list[Action]:
        """A stamped data arrived (content: the message; ignored for heartbeats and resets)."""
        if stamp.link != self.link:
            raise InvalidParameter(f"a stamp of link {stamp.link!r} reached the stub of"
                                   f" {self.link!r}")
        if stamp.link_seq > self._maximum:
            raise InvalidParameter(f"link seq {stamp.link_seq} is beyond the advertised"
                                   f" {self.space.bits} bits")
        self._heard = now
        self._late_reported = self._silent_reported = False
        if self._first_time is None and not stamp.snapshot:
            self._first_time = stamp.time
        out: list[Action] = []
        if self._mode is _Mode.RESUMING:
            self._queued.append((stamp, content))
            if len(self._queued) > self.max_held:
                self._lose_context(out, now, "the reorder buffer filled while resuming")
            return out
        self._take(out, stamp, content, now)
        return out

    def on_reply(self, reply: LinkReply, now: float) -> list[Action]:
        """A `linkreply` arrived; replies to requests the stub no longer waits for are ignored."""
        out: list[Action] = []
        pending = self._pending.pop(reply.trans_id, None) if reply.trans_id else None
        if pending is None or reply.link != self.link:
            return out
        ok = reply.code == 250
        if reply.code == 537:
            self._refused(out, reply)
        elif pending.kind == "gap":
            if ok:
                self._ask_again_if_still_missing(out, pending, now)
            else:
                self._lose_context(out, now, f"gap refused: {reply.code} {reply.text}".strip())
        elif pending.kind == "resume":
            if ok:
                self._mode = _Mode.LIVE
                for stamp, content in self._in_link_order(self._queued):
                    self._take(out, stamp, content, now)
                self._queued = []
            else:
                self._lose_context(out, now, f"resume refused: {reply.code} {reply.text}".strip())
        elif self._mode is not _Mode.REPAIRING:
            pass  # a repair answered after its epoch began: nothing more to do
        elif ok:
            # The reset that begins the repair epoch precedes this reply on the channel, so
            # it was lost: ask again.
            self._ask_repair(out, now, empty=pending.empty)
        elif pending.empty:
            self._refused(out, reply)
        else:
            lost = self._positions_list()
            self.counters.lost += 1
            out.append(Lost(f"repair refused: {reply.code} {reply.text}".strip(), lost))
            self._ask_repair(out, now, empty=True)
        return out

    def tick(self, now: float) -> list[Action]:
        """Time passed: late heartbeats, silent link, holes and requests that timed out."""
        out: list[Action] = []
        if self._heard is not None and self._mode is not _Mode.FRESH:
            silence = now - self._heard
            if silence > 2 * self.heartbeat_interval and not self._late_reported:
                self._late_reported = True
                self.counters.delayed += 1
                out.append(Delayed("heartbeat", silence))
            if silence > self.silent_factor * self.heartbeat_interval \
                    and not self._silent_reported:
                self._silent_reported = True
                out.append(SilentLink(silence))
        for hole_id, hole in list(self._holes.items()):
            if now - hole.requested_at <= self.gap_timeout:
                continue
            if not hole.reported:
                hole.reported = True
                self.counters.delayed += 1
                out.append(Delayed("hole", now - hole.detected_at, hole.link_from,
                                   hole.link_to))
            if hole.attempts >= self.max_attempts:
                self._lose_context(out, now, f"hole {hole.link_from}..{hole.link_to} still"
                                   f" open after {hole.attempts} requests")
                return out
            hole.attempts += 1
            hole.requested_at = now
            self._request_runs(out, hole_id, now)
        for request_id, pending in list(self._pending.items()):
            if pending.kind == "gap":
                continue
            wait = min(self.repair_timeout * 2 ** (pending.attempt - 1),
                       max(self.repair_timeout, MAX_REPAIR_WAIT))
            if now - pending.sent_at <= wait or request_id not in self._pending:
                continue
            if pending.kind == "resume":
                del self._pending[request_id]
                self._lose_context(out, now, "no answer to the resume request")
            elif self._mode is _Mode.REPAIRING and request_id == self._repair_id:
                # A long catch-up may still be on its way: the earlier request stays pending
                # (its answer is as good as the new one's) and the wait doubles.
                self._ask_repair(out, now, empty=pending.empty, attempt=pending.attempt + 1)
        return out

    def resume(self, now: float) -> list[Action]:
        """The connection is (re)established: ask for what was missed while away."""
        out: list[Action] = []
        self._heard = now
        self._late_reported = self._silent_reported = False
        if self._mode is _Mode.REPAIRING:
            self._ask_repair(out, now, empty=self._pending_empty_repair())
        elif self._mode is not _Mode.FRESH and self._epoch is not None:
            # Everything after the frontier comes again in answer, held items included.
            self._drop_holes()
            self._held.clear()
            self._top = self._abs
            for request_id in [i for i, p in self._pending.items() if p.kind == "resume"]:
                del self._pending[request_id]
            self._mode = _Mode.RESUMING
            self._queued = []
            request_id = self._new_id()
            self._pending[request_id] = _Pending("resume", now)
            self.counters.gap_requests += 1
            out.append(RequestGap(request_id, self.link, self._epoch,
                                  self.space.next(self._seq), None))
        return out

    def _in_link_order(self, queued: list[tuple[Stamp, bytes]]) -> list[tuple[Stamp, bytes]]:
        """What arrived while resuming, the current epoch's seqs in link order first. Live data
        overtake the refill they follow (the broker sends them as they come, the refill after
        reading Kafka); taken in arrival order they would open a hole for seqs the queue holds,
        and ask the broker to send those again. Stamps of other epochs keep their order, after
        (an older one is stale; a newer one comes after every seq of this epoch on the link)."""
        epoch, frontier = self._epoch, self._seq

        def place(item: tuple[Stamp, bytes]) -> tuple[int, int]:
            stamp = item[0]
            if stamp.epoch == epoch and stamp.kind is not StampKind.RESET:
                return 0, self.space.distance(frontier, stamp.link_seq)
            return 1, 0

        return sorted(queued, key=place)

    # --- the link, in order -----------------------------------------------------------------

    def _take(self, out: list[Action], stamp: Stamp, content: bytes, now: float) -> None:
        if self._mode is _Mode.REPAIRING:
            if stamp.kind is StampKind.RESET and stamp.repair is not None \
                    and stamp.repair in self._round:
                self._start_epoch(stamp)
                self._mode = _Mode.LIVE
                for request_id in [i for i, p in self._pending.items() if p.kind == "repair"]:
                    del self._pending[request_id]
            else:
                self.counters.stale += 1
            return
        if self._mode is _Mode.FRESH:
            self._mode = _Mode.LIVE
            self._epoch = stamp.epoch
            if stamp.epoch > 0:
                # A link that was reset before we saw anything of it: what its earlier epochs
                # carried can only come back by source.
                self._lose_context(out, now, f"the first stamp is of epoch {stamp.epoch}")
                return
            if stamp.kind is StampKind.RESET:
                self._start_epoch(stamp)
                return
            # Epoch 0 already under way: its start was lost, so ask for it from seq 1.
            self._seq, self._abs, self._top = 0, 0, 0
        assert self._epoch is not None
        if stamp.epoch < self._epoch:
            self.counters.stale += 1
            return
        if stamp.epoch > self._epoch and stamp.kind is StampKind.RESET \
                and stamp.repair is not None and stamp.repair in self._round:
            # The broker answered another request of the round we finished (it was asked
            # again while a long catch-up ran): the same catch-up once more. Follow it; what we
            # have already is discarded by (source, source seq).
            self._drop_holes()
            self._held.clear()
            self._start_epoch(stamp)
            return
        if stamp.epoch > self._epoch:
            what = "reset" if stamp.kind is StampKind.RESET else "stamp"
            self._lose_context(out, now, f"a {what} of epoch {stamp.epoch} the stub did not"
                               f" ask for (it was at epoch {self._epoch})")
            return
        if stamp.kind is StampKind.RESET:
            self.counters.duplicates += 1
            return
        seq = stamp.link_seq
        # the next seq is by far the commonest case: no serial arithmetic for it
        ahead = 1 if seq == self._seq + 1 and seq <= self._maximum \
            else self.space.distance(self._seq, seq)
        if ahead <= 0:
            self.counters.duplicates += 1
            return
        at = self._abs + ahead
        if at in self._held:
            self.counters.duplicates += 1
            return
        self._fill(out, at, now)
        if at == self._abs + 1:
            self._consume(out, stamp, content)
            self._drain(out)
            return
        self._held[at] = (stamp, content)
        if at > self._top:
            first = max(self._top, self._abs) + 1
            self._top = at
            if at - first > 0:
                self._new_hole(out, first, at - 1, now)
        if len(self._held) > self.max_held and self._mode is _Mode.LIVE:
            self._lose_context(out, now, f"more than {self.max_held} items held behind holes")

    def _consume(self, out: list[Action], stamp: Stamp, content: bytes) -> None:
        self._abs += 1
        self._seq = stamp.link_seq
        if stamp.snapshot:
            self.counters.delivered += 1
            out.append(Deliver(stamp, content))
            return
        if stamp.time is not None:
            self._time = stamp.time
        if stamp.kind is not StampKind.DATA:
            if stamp.kind is StampKind.WITHHELD:
                self.counters.withheld += 1
            return
        assert stamp.source is not None and stamp.source_seq is not None
        if stamp.source_seq <= self._sources.get(stamp.source, 0):
            self.counters.duplicates += 1
            return
        self._sources[stamp.source] = stamp.source_seq
        self.counters.delivered += 1
        out.append(Deliver(stamp, content))

    def _drain(self, out: list[Action]) -> None:
        held = self._held
        while self._abs + 1 in held:
            stamp, content = held.pop(self._abs + 1)
            self._consume(out, stamp, content)
        self._top = max(self._abs, self._top)

    def _start_epoch(self, reset: Stamp) -> None:
        self._epoch = reset.epoch
        self._seq, self._abs, self._top = 0, 0, 0
        if reset.time is not None:
            self._time = reset.time
        self._held.clear()
        self._drop_holes()

    # --- holes ------------------------------------------------------------------------------

    def _new_hole(self, out: list[Action], lo: int, hi: int, now: float) -> None:
        size = hi - lo + 1
        self.counters.holes += 1
        if size > self.max_gap:
            self._lose_context(out, now, f"a hole of {size} link seqs is more than the"
                               f" {self.max_gap} a gap request may name")
            return
        self._hole_ids += 1
        hole_id = self._hole_ids
        self._holes[hole_id] = _Hole(self._seq_at(lo), self._seq_at(hi), size, now, now, size)
        self._missing.append([lo, hi, hole_id])
        self._missing.sort()
        self._request_runs(out, hole_id, now)

    def _request_runs(self, out: list[Action], hole_id: int, now: float) -> None:
        """Ask for what is still missing of one hole, in pieces of at most max_gap."""
        assert self._epoch is not None
        for lo, hi, owner in self._missing:
            if owner != hole_id:
                continue
            for start in range(lo, hi + 1, self.max_gap):
                end = min(hi, start + self.max_gap - 1)
                request_id = self._new_id()
                self._pending[request_id] = _Pending("gap", now, start, end, hole_id)
                self.counters.gap_requests += 1
                out.append(RequestGap(request_id, self.link, self._epoch, self._seq_at(start),
                                      self._seq_at(end)))

    def _fill(self, out: list[Action], at: int, now: float) -> None:
        """`at` arrived: take it out of its hole; report the hole repaired when it closes."""
        if not self._missing:
            return
        found = next((i for i, (lo, hi, _) in enumerate(self._missing) if lo <= at <= hi), None)
        if found is None:
            return
        i = found
        lo, hi, hole_id = self._missing[i]
        rest = [r for r in ([lo, at - 1, hole_id], [at + 1, hi, hole_id]) if r[0] <= r[1]]
        self._missing[i:i + 1] = rest
        self.counters.repaired += 1
        hole = self._holes[hole_id]
        hole.missing -= 1
        if hole.missing == 0:
            del self._holes[hole_id]
            for request_id in [i for i, p in self._pending.items() if p.hole == hole_id]:
                del self._pending[request_id]
            out.append(Repaired(hole.link_from, hole.link_to, hole.size,
                                now - hole.detected_at))

    def _ask_again_if_still_missing(self, out: list[Action], pending: _Pending,
                                    now: float) -> None:
        """A gap was answered 250, so everything it asked for was sent before the reply:
        whatever of it is still missing was lost again."""
        hole = self._holes.get(pending.hole)
        if hole is None:
            return
        if any(lo <= pending.hi and pending.lo <= hi and owner == pending.hole
               for lo, hi, owner in self._missing):
            if hole.attempts >= self.max_attempts:
                self._lose_context(out, now, f"hole {hole.link_from}..{hole.link_to} refilled"
                                   f" {hole.attempts} times and still open")
                return
            hole.attempts += 1
            hole.requested_at = now
            self._request_runs(out, pending.hole, now)

    def _drop_holes(self) -> None:
        self._missing.clear()
        self._holes.clear()
        for request_id in [i for i, p in self._pending.items() if p.kind == "gap"]:
            del self._pending[request_id]

    def _seq_at(self, at: int) -> int:
        return self.space.add(self._seq, at - self._abs)

    # --- repair by source -------------------------------------------------------------------

    def _lose_context(self, out: list[Action], now: float, reason: str) -> None:
        """Give up on the link's order: drop what is held and repair by source."""
        self.counters.resets += 1
        out.append(Reset(self._epoch, reason))
        self._held.clear()
        self._queued = []
        self._drop_holes()
        self._top = self._abs
        self._mode = _Mode.REPAIRING
        self._round = []
        self._ask_repair(out, now, empty=False)

    def _ask_repair(self, out: list[Action], now: float, *, empty: bool,
                    attempt: int = 1) -> None:
        for request_id in [i for i, p in self._pending.items() if p.kind == "resume"]:
            del self._pending[request_id]
        request_id = self._new_id()
        self._repair_id = request_id
        self._round = [*self._round[-(MAX_ROUND - 1):], request_id]
        self._pending[request_id] = _Pending("repair", now, empty=empty, attempt=attempt)
        self.counters.repairs += 1
        sources = () if empty else self._positions_list()
        known = self._time if self._time is not None else self._first_time
        since = None if empty or known is None else max(0, known - self.repair_margin_ms)
        out.append(RequestRepair(request_id, self.link, self._epoch, sources, since))

    def _pending_empty_repair(self) -> bool:
        return any(p.kind == "repair" and p.empty for p in self._pending.values())

    def _positions_list(self) -> tuple[SourcePosition, ...]:
        return tuple(SourcePosition(s, n) for s, n in sorted(self._sources.items()))

    def _refused(self, out: list[Action], reply: LinkReply) -> None:
        self._pending.clear()
        self._drop_holes()
        out.append(LinkRefused(reply.code, reply.text))

    def _new_id(self) -> int:
        if self._request_ids is not None:
            return self._request_ids()
        # transIDs are 1..2^31-1 (RFC 3340); wrapping after two billion requests is harmless
        # because by then nothing waits on the early ones.
        self._next_id = self._next_id % 2_147_483_647 + 1
        return self._next_id
