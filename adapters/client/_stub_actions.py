"""What the subscriber stub (`resequencer.Resequencer`) says and keeps: the actions each of its
calls returns, its counters, and the positions an application saves to resume after a
restart. Plain values, no logic beyond reading positions back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from adapters.apex.batch_codec import DEFAULT_BATCH
from adapters.apex.robust_codec import GapRequest, RepairRequest, SourcePosition
from adapters.apex.robust_stamp import Stamp
from broker.robust.linkid import validate_link_id
from broker.robust.linkseq import LinkSeqSpace
from common.errors import ParameterSyntaxError

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
    "ResequencerCounters",
    "Reset",
    "SilentLink",
]


# --- actions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand this message to the application (in link order, each (source, seq) once)."""

    stamp: Stamp
    content: bytes


@dataclass(frozen=True, slots=True)
class RequestGap:
    """Send a gap request: `link_from..link_to` of `epoch` (`link_to` None: through the
    newest), with `request_id` as its transID."""

    request_id: int
    link: str
    epoch: int
    link_from: int
    link_to: int | None

    def document(self) -> GapRequest:
        return GapRequest(self.link, self.link_from, self.request_id, self.link_to, self.epoch,
                          DEFAULT_BATCH)


@dataclass(frozen=True, slots=True)
class RequestRepair:
    """Send a source repair request, with `request_id` as its transID."""

    request_id: int
    link: str
    epoch: int | None
    sources: tuple[SourcePosition, ...]
    since: int | None

    def document(self) -> RepairRequest:
        return RepairRequest(self.link, self.request_id, self.sources, self.since, self.epoch,
                             DEFAULT_BATCH)


@dataclass(frozen=True, slots=True)
class Delayed:
    """Data is late: a hole persists (`hole`, with its range) or no heartbeat (`heartbeat`)."""

    reason: Literal["hole", "heartbeat"]
    waited: float
    link_from: int | None = None
    link_to: int | None = None


@dataclass(frozen=True, slots=True)
class SilentLink:
    """Nothing has arrived on the link for `waited` seconds, heartbeats included."""

    waited: float


@dataclass(frozen=True, slots=True)
class Reset:
    """The link's context was lost (`reason`); the stub is repairing by source."""

    epoch: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Repaired:
    """The hole `link_from..link_to` closed: `items` seqs refilled after `waited` seconds."""

    link_from: int
    link_to: int
    items: int
    waited: float


@dataclass(frozen=True, slots=True)
class Lost:
    """The broker refused to rebuild (570): messages after `sources` may never arrive."""

    reason: str
    sources: tuple[SourcePosition, ...]


@dataclass(frozen=True, slots=True)
class LinkRefused:
    """The broker refused the link itself (537, or a repair it cannot serve at all); the
    stub stops asking until `resume`."""

    code: int
    text: str


Action = (Deliver | RequestGap | RequestRepair | Delayed | SilentLink | Reset | Repaired | Lost
          | LinkRefused)


@dataclass
class ResequencerCounters:
    """What the stub did, for the application's monitoring and the acceptance tests."""

    delivered: int = 0
    #: dropped: a link seq already had, or a source seq already delivered
    duplicates: int = 0
    #: dropped: a stamp of an older epoch, or one that came while repairing by source
    stale: int = 0
    holes: int = 0
    gap_requests: int = 0
    #: link seqs that arrived to fill a hole
    repaired: int = 0
    delayed: int = 0
    resets: int = 0
    repairs: int = 0
    lost: int = 0
    #: link seqs a gap fill sent as `withheld` (no longer entitled): consumed, not delivered
    withheld: int = 0


# --- positions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Positions:
    """Where the application stands: the link's epoch and last contiguous link seq, the
    journal time of that item, and the last source seq delivered per source."""

    link: str
    bits: int
    epoch: int | None
    link_seq: int
    time: int | None
    sources: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"version": 1, "link": self.link, "bits": self.bits,
                           "epoch": self.epoch, "linkseq": self.link_seq, "time": self.time,
                           "sources": self.sources}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Positions:
        """Read positions written by `to_json`; 501 if they are not that."""
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParameterSyntaxError(f"positions are not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ParameterSyntaxError("positions: a version-1 object was expected")
        try:
            link, bits, epoch = doc["link"], doc["bits"], doc["epoch"]
            seq, time, sources = doc["linkseq"], doc["time"], doc["sources"]
        except KeyError as exc:
            raise ParameterSyntaxError(f"positions lack {exc}") from None
        space = LinkSeqSpace(bits) if type(bits) is int else None
        if space is None or not _uint(seq, space.maximum) or not (
                epoch is None or _uint(epoch)) or not (time is None or _uint(time)) \
                or not isinstance(sources, dict) \
                or not all(isinstance(k, str) and _uint(v) for k, v in sources.items()):
            raise ParameterSyntaxError("positions hold a value of the wrong type or range")
        return cls(validate_link_id(link), bits, epoch, seq, time, dict(sources))


def _uint(value: object, high: int = 2**63 - 1) -> bool:
    return type(value) is int and 0 <= value <= high
