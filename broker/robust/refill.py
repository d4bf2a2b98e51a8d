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

import contextlib
import heapq
from collections.abc import Generator, Iterable, Iterator

from broker.codec import Codec, default_codec
from broker.journal import SCHEMA as JOURNAL_SCHEMA
from broker.journal import Journal
from broker.kafka_io import Position, read_partition
from broker.records import JournalEntry
from broker.robust.link_records import LinkKind, LinkRecord
from broker.robust.links import LinkLog
from common.errors import LinkContextGone

__all__ = ["RUN_SPREAD", "Refilled", "journal_entries", "refill", "refill_chunks"]

#: Positions further apart than this in one journal partition are read separately: a read
#: costs a consumer (~tens of ms), scanning costs ~1 µs per record skipped.
RUN_SPREAD = 20_000


def journal_entries(journal: Journal, positions: Iterable[Position],
                    codec: Codec | None = None) -> dict[Position, JournalEntry]:
    """The journal entries stored at `positions` (those still there)."""
    codec = codec or default_codec()
    return {entry.position: entry for part, offsets in _by_partition(positions).items()
            for entry in _entries(journal, part, offsets, codec)}


Refilled = list[tuple[LinkRecord, JournalEntry | None]]


def refill(links: LinkLog, journal: Journal, link: str, lo: int, hi: int | None = None, *,
           epoch: int | None = None) -> Refilled:
    """What to send again for the gap `lo..hi` of `link`: (record, entry) in link order, entry
    None for heartbeats. Raises as `LinkLog.read_range` does, and 569 when a message the range
    carried is no longer in the journal."""
    return [pair for chunk in refill_chunks(links, journal, link, lo, hi, epoch=epoch)
            for pair in chunk]


def refill_chunks(links: LinkLog, journal: Journal, link: str, lo: int, hi: int | None = None,
                  *, epoch: int | None = None, chunk: int = 1024,
                  codec: Codec | None = None) -> Generator[Refilled]:
    """`refill` a chunk at a time, so the first items can be on their way while the journal
    is still being read. The link records are all read (and the range checked) before the
    first chunk: a bad range raises before anything is yielded. A message gone from the
    journal raises 569 when its chunk comes, after the chunks before it."""
    records = links.read_range(link, lo, hi, epoch=epoch)
    codec = codec or default_codec()
    wanted = [r.position for r in records if r.kind is LinkKind.DATA and r.position is not None]
    readers = {part: _entries(journal, part, offsets, codec)
               for part, offsets in _by_partition(wanted).items()}
    read: dict[Position, JournalEntry] = {}
    with contextlib.ExitStack() as readers_open:
        for reader in readers.values():
            readers_open.callback(reader.close)  # each holds a consumer until closed
        yield from _chunks(records, readers, read, link, chunk)


def _chunks(records: list[LinkRecord], readers: dict[int, Generator[JournalEntry]],
            read: dict[Position, JournalEntry], link: str, chunk: int) -> Iterator[Refilled]:
    for at in range(0, len(records), chunk):
        out: Refilled = []
        for record in records[at:at + chunk]:
            if record.kind is not LinkKind.DATA:
                out.append((record, None))
                continue
            entry = _take(readers, read, record.position)
            if entry is None or entry.source != record.source \
                    or entry.source_seq != record.source_seq:
                raise LinkContextGone(f"link seq {record.link_seq} of link {link!r} carried a"
                                      " message the journal no longer holds; repair by source")
            out.append((record, entry))
        yield out


def _by_partition(positions: Iterable[Position]) -> dict[int, list[int]]:
    by_part: dict[int, list[int]] = {}
    for pos in positions:
        by_part.setdefault(pos.partition, []).append(pos.offset)
    return by_part


def _entries(journal: Journal, part: int, offsets: list[int],
             codec: Codec) -> Generator[JournalEntry]:
    """The entries at `offsets` of one journal partition that are still there, in offset
    order: what the follower keeps (broker/recent.py) from memory, the rest read from Kafka in
    runs (RUN_SPREAD) as they are asked for."""
    kept: list[JournalEntry] = []
    if journal.recent is not None:
        for off in sorted(set(offsets)):
            entry = journal.recent.get(part, off)
            if entry is not None:
                kept.append(entry)
    missing = set(offsets) - {e.position.offset for e in kept}
    if not missing:
        yield from kept
        return
    yield from heapq.merge(kept, _read(journal, part, missing, codec),
                           key=lambda e: e.position.offset)


def _read(journal: Journal, part: int, wanted: set[int],
          codec: Codec) -> Iterator[JournalEntry]:
    ordered = sorted(wanted)
    runs: list[list[int]] = [[ordered[0]]]
    for off in ordered[1:]:
        if off - runs[-1][-1] > RUN_SPREAD:
            runs.append([off])
        else:
            runs[-1].append(off)
    for run in runs:
        for rec in read_partition(journal.config, journal.topic, part, run[0], run[-1] + 1):
            if rec.position.offset in wanted and rec.value is not None:
                _, value = codec.decode(rec.value, expect=JOURNAL_SCHEMA)
                yield JournalEntry.from_avro(rec.position, value)


def _take(readers: dict[int, Generator[JournalEntry]], read: dict[Position, JournalEntry],
          position: Position | None) -> JournalEntry | None:
    """The entry at `position`: read ahead in its partition until it comes (keeping what comes
    before it for later chunks); None if the partition has no such entry."""
    if position is None:
        return None
    entry = read.pop(position, None)
    if entry is not None:
        return entry
    reader = readers.get(position.partition)
    if reader is None:
        return None
    for entry in reader:
        if entry.position == position:
            return entry
        read[entry.position] = entry
        if entry.position.offset > position.offset:
            break  # offsets rise: the wanted one is not there
    return None
