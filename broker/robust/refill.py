"""Gap fill: the exact items of a link range, each link record with the journal entry it carried.

`refill` is what the service sends again for a gap request: for every link seq of the range, in
link order, the link record (its stamp: link, epoch, link seq, source, source seq) and, for DATA,
the journal entry (content, publish type, token …) read back from where the record says it is.
The journal read is by position: positions are grouped per partition into runs no more than
`RUN_SPREAD` offsets apart, and each run is one bounded read, so a gap on a quiet topic does not
scan a busy partition end to end. A DATA record whose journal entry is gone (journal retention
shorter than link retention) or is not the message the link record names makes the whole range
unfillable: 569, repair by source.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.codec import Codec, default_codec
from broker.errors import LinkContextGone
from broker.journal import SCHEMA as JOURNAL_SCHEMA
from broker.journal import Journal
from broker.kafka_io import Position, read_partition
from broker.records import JournalEntry
from broker.robust.links import LinkKind, LinkLog, LinkRecord

__all__ = ["RUN_SPREAD", "journal_entries", "refill"]

#: Positions further apart than this in one journal partition are read separately: a read
#: costs a consumer (~tens of ms), scanning costs ~1 µs per record skipped.
RUN_SPREAD = 20_000


def journal_entries(journal: Journal, positions: Iterable[Position],
                    codec: Codec | None = None) -> dict[Position, JournalEntry]:
    """The journal entries stored at `positions` (those still there)."""
    codec = codec or default_codec()
    by_part: dict[int, list[int]] = {}
    for pos in positions:
        by_part.setdefault(pos.partition, []).append(pos.offset)
    out: dict[Position, JournalEntry] = {}
    for part, given in by_part.items():
        wanted = set(given)
        offsets = sorted(wanted)
        runs: list[list[int]] = [[offsets[0]]]
        for off in offsets[1:]:
            if off - runs[-1][-1] > RUN_SPREAD:
                runs.append([off])
            else:
                runs[-1].append(off)
        for run in runs:
            for rec in read_partition(journal.config, journal.topic, part, run[0], run[-1] + 1):
                if rec.position.offset in wanted and rec.value is not None:
                    _, value = codec.decode(rec.value, expect=JOURNAL_SCHEMA)
                    out[rec.position] = JournalEntry.from_avro(rec.position, value)
    return out


def refill(links: LinkLog, journal: Journal, link: str, lo: int, hi: int | None = None, *,
           epoch: int | None = None) -> list[tuple[LinkRecord, JournalEntry | None]]:
    """What to send again for the gap `lo..hi` of `link`: (record, entry) in link order, entry
    None for heartbeats. Raises as `LinkLog.read_range` does, and 569 when a message the range
    carried is no longer in the journal."""
    records = links.read_range(link, lo, hi, epoch=epoch)
    entries = journal_entries(journal, (r.position for r in records
                                        if r.kind is LinkKind.DATA and r.position is not None))
    out: list[tuple[LinkRecord, JournalEntry | None]] = []
    for record in records:
        if record.kind is not LinkKind.DATA:
            out.append((record, None))
            continue
        entry = entries.get(record.position) if record.position is not None else None
        if entry is None or entry.source != record.source \
                or entry.source_seq != record.source_seq:
            raise LinkContextGone(f"link seq {record.link_seq} of link {link!r} carried a message"
                                  " the journal no longer holds; repair by source")
        out.append((record, entry))
    return out
