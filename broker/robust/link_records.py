"""The link log's values: what the fan-out asks to put on a link (`LinkItem`), what one record
of the log says a link seq carried (`LinkRecord`), and where a link stands (`LinkHead`).

They are apart from the log (`links.py`) because the fan-out, the delivery core, the refill, the
record writer and the subscriber's `<batch>` rendering all speak them without needing the log.
"""

from __future__ import annotations

import functools
from enum import StrEnum
from typing import Any, NamedTuple

from broker.kafka_io import Position
from broker.records import JournalEntry, to_ms
from broker.robust.linkid import validate_link_id
from broker.robust.linkseq import LinkSeqSpace
from common.errors import InvalidParameter

__all__ = ["LinkHead", "LinkItem", "LinkKind", "LinkRecord", "space_for"]


class LinkKind(StrEnum):
    """What one link seq carried."""

    #: a message: its journal coordinates, source and source seq
    DATA = "DATA"
    #: a heartbeat on an idle link
    HEARTBEAT = "HEARTBEAT"
    #: link seq 0: a new epoch
    RESET = "RESET"


_DATA, _RESET = LinkKind.DATA, LinkKind.RESET

# LinkItem and LinkRecord are NamedTuples, not frozen dataclasses: a fan-out turn makes one of
# each per delivery (ten per message at ten subscribers), and a frozen slots dataclass of these
# sizes takes about five times as long to build. They stay immutable values.


class LinkItem(NamedTuple):
    """What the fan-out asks to put on a link; the log gives it its seq."""

    link: str
    kind: LinkKind
    position: Position | None = None
    source: str | None = None
    source_seq: int | None = None
    #: RESET only: the subscriber that owns the link (set when it claims the link)
    owner: str | None = None
    #: DATA only: a data item's image or delta sent as state (a snapshot), not live traffic
    snapshot: bool = False

    @classmethod
    def data(cls, link: str, entry: JournalEntry, *, snapshot: bool = False) -> LinkItem:
        return cls(link, _DATA, entry.position, entry.source, entry.source_seq, None, snapshot)

    @classmethod
    def heartbeat(cls, link: str) -> LinkItem:
        return cls(link, LinkKind.HEARTBEAT)

    @classmethod
    def reset(cls, link: str, owner: str | None = None) -> LinkItem:
        return cls(link, LinkKind.RESET, owner=owner)

    def check(self) -> None:
        """553 unless the fields fit the kind."""
        validate_link_id(self.link)
        if self.kind is LinkKind.DATA:
            if self.position is None or self.source is None or type(self.source_seq) is not int \
                    or self.source_seq < 1:
                raise InvalidParameter("a DATA link item names its journal position, source"
                                       " and source seq")
        elif self.position is not None or self.source is not None \
                or self.source_seq is not None:
            raise InvalidParameter(f"a {self.kind} link item carries no message")
        if self.owner is not None and self.kind is not LinkKind.RESET:
            raise InvalidParameter("only a RESET names the link's owner")
        if self.snapshot and self.kind is not LinkKind.DATA:
            raise InvalidParameter("only DATA is a snapshot copy")


class LinkRecord(NamedTuple):
    """One record of the link log: what link seq `link_seq` of `epoch` carried."""

    link: str
    ordinal: int
    epoch: int
    epoch_start: int
    bits: int
    link_seq: int
    kind: LinkKind
    position: Position | None
    source: str | None
    source_seq: int | None
    owner: str | None
    writer: int
    recorded_at: int
    #: DATA: a snapshot copy of a data item's image or delta (robust-binding §9)
    snapshot: bool = False

    def to_avro(self) -> dict[str, Any]:
        pos = self.position
        return {
            "link": self.link, "ordinal": self.ordinal, "epoch": self.epoch,
            "epoch_start": self.epoch_start, "bits": self.bits, "kind": self.kind.value,
            "journal_partition": None if pos is None else pos.partition,
            "journal_offset": None if pos is None else pos.offset,
            "source": self.source, "source_seq": self.source_seq, "owner": self.owner,
            "writer": self.writer, "recorded_at": self.recorded_at, "snapshot": self.snapshot,
        }

    @classmethod
    def from_avro(cls, rec: dict[str, Any]) -> LinkRecord:
        part, off = rec["journal_partition"], rec["journal_offset"]
        bits = rec["bits"]
        return cls(
            link=rec["link"], ordinal=rec["ordinal"], epoch=rec["epoch"],
            epoch_start=rec["epoch_start"], bits=bits,
            link_seq=space_for(bits).add(0, rec["ordinal"] - rec["epoch_start"]),
            kind=_LINK_KINDS.get(rec["kind"]) or LinkKind(rec["kind"]),
            position=None if part is None or off is None else Position(part, off),
            source=rec["source"], source_seq=rec["source_seq"], owner=rec["owner"],
            writer=rec["writer"], recorded_at=to_ms(rec["recorded_at"]) or 0,
            snapshot=rec["snapshot"],
        )


_LINK_KINDS = {k.value: k for k in LinkKind}


@functools.lru_cache(maxsize=8)
def space_for(bits: int) -> LinkSeqSpace:
    """Records say their resolution; one space per resolution serves them all."""
    return LinkSeqSpace(bits)


class LinkHead(NamedTuple):
    """Where a link stands: its newest record's epoch, link seq and ordinal."""

    link: str
    epoch: int
    link_seq: int
    ordinal: int
    epoch_start: int
    bits: int
    owner: str | None
