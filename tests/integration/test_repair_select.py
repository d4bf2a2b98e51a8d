"""A source repair's catch-up read from the real journal (broker/robust/repair.py
`select_catch_up`): named sources after a position, unnamed ones since a time, the live side's
boundary, and 570 for the repair size and for what retention deleted (records deleted for real,
with Kafka's DeleteRecords)."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from broker.core import BrokerCore
from broker.journal import Journal
from broker.records import JournalEntry, Publication
from broker.robust.repair import select_catch_up
from common.errors import RebuildRefused

pytestmark = pytest.mark.kafka

A, B, X = "a@example.com", "b@example.com", "x@example.com"
SUB = "jade@example.com"
TOPICS = {"q.a": SUB, "q.b": SUB}


def everyone(entry: JournalEntry, subscriber: str) -> bool:
    return True


def keys(entries: list[JournalEntry]) -> list[tuple[str, int]]:
    return [(e.source, e.source_seq) for e in entries]


def _publish(journal: Journal) -> dict[tuple[str, int], JournalEntry]:
    """A and B publish 6 each, interleaved, on q.a, q.b and q.other (not the link's)."""
    topics = ["q.a", "q.b", "q.other"]
    for k in range(6):
        for source in (A, B):
            journal.append_sync(Publication(topics[k % 3], source, f"{source}/{k}".encode()))
    return {(e.source, e.source_seq): e for s in (A, B) for e in journal.read_source(s)}


def _select(journal: Journal, sources: list[tuple[str, int]], since: int | None = None,
            **kwargs: object) -> list[tuple[str, int]]:
    options: dict[str, object] = {"entitled": everyone, "limit": 100, **kwargs}
    return keys(select_catch_up(journal, sources, since, TOPICS, **options))  # type: ignore[arg-type]


def test_catch_up_from_the_real_journal(core: BrokerCore) -> None:
    """Named sources after their position, unnamed ones since a time, up to the live side."""
    journal = core.journal
    stored = _publish(journal)
    wanted = {k for k, e in stored.items() if e.topic in TOPICS}
    assert _select(journal, [(A, 2)]) == sorted(k for k in wanted if k[0] == A and k[1] > 2)
    # B unnamed, since the time its seq 3 was accepted; A named, up to date
    since = stored[(B, 3)].appended_at
    assert _select(journal, [(A, 6)], since) == sorted(
        k for k in wanted if k[0] == B and stored[k].appended_at >= since)
    # a source never published, with after 0: nothing; the link's topics empty: nothing
    assert _select(journal, [(X, 0)]) == []
    assert select_catch_up(journal, [(A, 0)], 0, {}, entitled=everyone, limit=1) == []
    # the live side begins at A's seq 4: the catch-up stops before it
    four = stored[(A, 4)].position
    assert _select(journal, [(A, 0)], until={four.partition: four.offset}) == [(A, 1), (A, 2)]
    # size: 4 of A's are on the link's topics
    assert len(_select(journal, [(A, 0)], limit=4)) == 4
    with pytest.raises(RebuildRefused, match="more than 3"):
        _select(journal, [(A, 0)], limit=3)
    # since older than the journal retention window (30 days by default)
    with pytest.raises(RebuildRefused, match="retention"):
        _select(journal, [], 0)


def test_what_retention_deleted_is_refused(core: BrokerCore) -> None:
    """A named source whose next seq was deleted: 570; from its first retained seq on: served."""
    journal = core.journal
    stored = _publish(journal)
    first_kept = stored[(A, 3)].position
    admin = AdminClient(core.config.client_conf())
    done = admin.delete_records([TopicPartition(journal.topic, first_kept.partition,
                                                first_kept.offset)])
    for future in done.values():
        future.result(30)
    with pytest.raises(RebuildRefused, match=r"seqs 2\.\.2 are past"):
        _select(journal, [(A, 1)])
    assert _select(journal, [(A, 2)]) == [(A, 4), (A, 5)]  # 3 is on q.other
    # everything of A gone, though the journal acknowledged it: 570 as well
    end = max(e.position.offset for e in stored.values()
              if e.position.partition == first_kept.partition) + 1
    done = admin.delete_records([TopicPartition(journal.topic, first_kept.partition, end)])
    for future in done.values():
        future.result(30)
    with pytest.raises(RebuildRefused, match=r"seqs 3\.\.6"):
        _select(journal, [(A, 2)])
    assert _select(journal, [(A, 6)]) == []
