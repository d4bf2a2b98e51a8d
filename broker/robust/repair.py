"""Source repair (docs/robust-binding.md §5.2): which journal entries a repair resends.

Theory of operation
-------------------
A repair names, per source, the last source seq the subscriber has (`after`), and optionally a
time (`since`) for the sources it does not name. The *catch-up* is, per named source in the
order named, every DATA entry after `after`; then, per unnamed source (sorted by name), every
DATA entry the journal accepted at or after `since`. An entry is taken only if its topic is one
the link's subscriptions cover (`topics`: topic -> the subscriber) and the subscriber is
entitled to it now (the fan-out's permission hook). Each source comes in source seq order, and
each (source, source seq) once: a source lives in one journal partition, whose order is seq
order for DATA.

Where the catch-up ends (`until`). The fan-out holds back whatever the journal follower hands
it for the link while the catch-up is read, and puts it on the link after the catch-up; so the
catch-up must be exactly what the follower had already handed over, no more and no less.
`until` gives, per journal partition, the first offset the follower had *not* handed over: an
entry at or past it belongs to the live side. None reads to the end of each partition.

What is refused (570, `RebuildRefused`), before anything is sent:
- more than `limit` messages (the capability `maxrepair`);
- a named source whose `after`+1 is no longer in the journal: its first record after `after`
  (DATA, or a GAP that explains the seq) starts later, or none is left although the journal
  acknowledged seqs after `after` — retention deleted them. A source the journal never had, or
  an `after` at or past its newest seq, simply has nothing to resend;
- a `since` older than the journal retention window (`journal_retention_ms`; -1 keeps
  everything), since what was accepted then may be deleted.

`CatchUp` is the selection alone (no Kafka), fed the records in journal order; `select_catch_up`
reads them (blocking: run it in a worker thread).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from broker.codec import Codec, default_codec
from broker.journal import SCHEMA as JOURNAL_SCHEMA
from broker.journal import Journal
from broker.kafka_io import offset_for_time, partition_count, read_partition
from broker.records import JournalEntry, RecordKind, now_ms
from common.errors import RebuildRefused

__all__ = ["CatchUp", "Entitled", "select_catch_up"]

#: The permission hook: may `subscriber` see `entry` now?
Entitled = Callable[[JournalEntry, str], bool]


class CatchUp:
    """The catch-up of one repair, selected from records fed in journal order.

    Args:
        topics: topic -> subscriber, for each subscription that travels on the link.
        entitled: the permission hook.
        limit: most messages the catch-up may hold; one more raises 570.
        listed: the sources the repair names (their records never come from `since`).
    """

    def __init__(self, topics: Mapping[str, str], entitled: Entitled, limit: int,
                 listed: Iterable[str] = ()) -> None:
        self.topics, self.entitled, self.limit = topics, entitled, limit
        self.listed = frozenset(listed)
        self._named: list[JournalEntry] = []
        self._unnamed: dict[str, list[JournalEntry]] = {}
        self._count = 0

    def _wanted(self, entry: JournalEntry) -> bool:
        subscriber = self.topics.get(entry.topic)
        return subscriber is not None and self.entitled(entry, subscriber)

    def _count_one(self) -> None:
        self._count += 1
        if self._count > self.limit:
            raise RebuildRefused(f"the repair would resend more than {self.limit} messages"
                                 " (maxrepair); ask for a restart from live data")

    def take_source(self, source: str, after: int, records: Iterable[JournalEntry], *,
                    acknowledged: int, end: int | None = None) -> None:
        """A named source: `records` are its records (DATA and GAP) in journal order, from
        some point at or before the first with a seq after `after`; `acknowledged` is the
        journal's newest acknowledged seq of the source *before* the read began; `end` the
        partition's `until` offset (records at or past it are live, but the first one still
        tells where the source's retained seqs begin)."""
        lowest: int | None = None
        last = after
        for entry in records:
            if entry.source != source or entry.last_seq <= after:
                continue
            lowest = entry.source_seq if lowest is None else min(lowest, entry.source_seq)
            if end is not None and entry.position.offset >= end:
                break
            if entry.kind is RecordKind.DATA and entry.source_seq > last:
                last = entry.source_seq
                if self._wanted(entry):
                    self._count_one()
                    self._named.append(entry)
        if lowest is None and acknowledged > after:
            raise RebuildRefused(f"{source}'s seqs {after + 1}..{acknowledged} are past the"
                                 " journal's retention")
        if lowest is not None and lowest > after + 1:
            raise RebuildRefused(f"{source}'s seqs {after + 1}..{lowest - 1} are past the"
                                 " journal's retention")

    def take_since(self, since: int, records: Iterable[JournalEntry]) -> None:
        """Records of one journal partition, in its order, from at or before the first one
        accepted at `since`: the unnamed sources' DATA accepted at or after `since`."""
        for entry in records:
            if entry.kind is not RecordKind.DATA or entry.source in self.listed \
                    or entry.appended_at < since:
                continue
            taken = self._unnamed.setdefault(entry.source, [])
            if taken and entry.source_seq <= taken[-1].source_seq:
                continue  # a duplicate the journal holds; once is enough
            if self._wanted(entry):
                self._count_one()
                taken.append(entry)

    def entries(self) -> list[JournalEntry]:
        """The catch-up in send order: named sources as named, then unnamed ones by name."""
        out = list(self._named)
        for source in sorted(self._unnamed):
            out += self._unnamed[source]
        return out


def _partition(journal: Journal, part: int, start: int, end: int | None,
               codec: Codec) -> Iterator[JournalEntry]:
    for rec in read_partition(journal.config, journal.topic, part, start, end):
        if rec.value is not None:
            _, value = codec.decode(rec.value, expect=JOURNAL_SCHEMA)
            yield JournalEntry.from_avro(rec.position, value)


def select_catch_up(journal: Journal, sources: Sequence[tuple[str, int]], since: int | None,
                    topics: Mapping[str, str], *, entitled: Entitled, limit: int,
                    until: Mapping[int, int] | None = None, now: int | None = None,
                    codec: Codec | None = None) -> list[JournalEntry]:
    """The catch-up of a repair naming `sources` ((source, after) pairs) and `since`; see the
    module docstring. Blocks on Kafka. Raises RebuildRefused (570)."""
    if not topics:
        return []  # no subscription travels on the link: nothing could be resent
    catch = CatchUp(topics, entitled, limit, (s for s, _ in sources))
    if since is not None:
        retention = journal.config.journal_retention_ms
        now = now_ms() if now is None else now
        if retention >= 0 and since < now - retention:
            raise RebuildRefused(f"since={since} reaches past the journal's retention"
                                 f" ({retention} ms)")
    for source, after in sources:
        acknowledged = journal.last_durable_seq(source)
        end = None if until is None else until.get(journal.partition_for(source))
        with contextlib.closing(journal.read_source(source, after)) as records:
            catch.take_source(source, after, records, acknowledged=acknowledged, end=end)
    if since is not None:
        codec = codec or default_codec()
        config, topic = journal.config, journal.topic
        for part in range(partition_count(config, topic)):
            end = None if until is None else until.get(part)
            start = offset_for_time(config, topic, part, since)
            catch.take_since(since, _partition(journal, part, start, end, codec))
    return catch.entries()
