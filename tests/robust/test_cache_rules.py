"""Cached messages (content-based draft §5.2.1, §5.8 `cached`) as the item store keeps them:
revisions, expirations, drops and topic deletions in any order, against a plain model."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.kafka_io import Position
from broker.records import JournalEntry, PublishType, RecordKind
from tests.robust.test_items import _store

T0 = 1_800_000_000_000
TOPICS = ("q.a", "q.b")
MIDS = ("1029", "1030", "1031")


def _date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


class CacheMachine(RuleBasedStateMachine):
    """The store's cached view after each step equals the model's: per message-id the
    highest revision seen (a lower or equal one, or a `0`, changes nothing), gone once dropped
    by a higher revision or with its topic, and hidden while expired."""

    def __init__(self) -> None:
        super().__init__()
        self.store = _store()
        self.now = T0
        self.offset = 0
        #: (topic, mid) -> (revision, expiration header, content)
        self.model: dict[tuple[str, str], tuple[int, str | None, bytes]] = {}

    def _apply(self, topic: str, mid: str, rev: int, ptype: PublishType,
               exp: str | None) -> bytes:
        self.offset += 1
        content = f"m{self.offset}".encode()
        self.store.apply([JournalEntry(
            position=Position(0, self.offset), kind=RecordKind.DATA, topic=topic,
            source="p@example.com", source_seq=self.offset, gap_to=None, gap_reason=None,
            publish_type=ptype, publisher_seq=None, message_id=mid, revision_id=str(rev),
            publication_date=None, expiration_date=exp, permission_token=None,
            content_type="application/xml", content=content, fields={}, options={},
            appended_at=self.now)])
        return content

    @rule(topic=st.sampled_from(TOPICS), mid=st.sampled_from(MIDS), rev=st.integers(0, 4),
          ptype=st.sampled_from([PublishType.UPDATE, PublishType.IMAGE,
                                 PublishType.CORRECTION]),
          exp=st.sampled_from([None, "*", "0", -2000, 0, 1000, 5000]))
    def publish(self, topic: str, mid: str, rev: int, ptype: PublishType,
                exp: str | int | None) -> None:
        header = _date(self.now + exp) if isinstance(exp, int) else exp
        content = self._apply(topic, mid, rev, ptype, header)
        cur = self.model.get((topic, mid))
        if header != "0" and (cur is None or rev > cur[0]):
            self.model[(topic, mid)] = (rev, header, content)

    @rule(topic=st.sampled_from(TOPICS), mid=st.sampled_from(MIDS), rev=st.integers(0, 4))
    def drop(self, topic: str, mid: str, rev: int) -> None:
        self._apply(topic, mid, rev, PublishType.DROP, None)
        cur = self.model.get((topic, mid))
        if cur is None or rev > cur[0]:
            self.model.pop((topic, mid), None)

    @rule(ms=st.sampled_from([1, 999, 1000, 3000]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule(topic=st.sampled_from(TOPICS))
    def delete_topic(self, topic: str) -> None:
        self.store.forget_topic(topic)
        for key in [k for k in self.model if k[0] == topic]:
            del self.model[key]

    @invariant()
    def cached_view_matches(self) -> None:
        for topic in TOPICS:
            got = {(e.message_id, e.revision_id, e.content)
                   for e in self.store.snapshot(topic, now=self.now)}
            want = set()
            for (t, mid), (rev, exp, content) in self.model.items():
                if t != topic:
                    continue
                if exp not in (None, "*") and datetime.fromisoformat(exp).timestamp() * 1000 \
                        <= self.now:
                    continue
                want.add((mid, str(rev), content))
            assert got == want


TestCache = CacheMachine.TestCase


def test_deltas_go_with_their_expired_image() -> None:
    """A delta (no revision) on an expired revision is not cached without it."""
    store = _store()
    image = JournalEntry(
        position=Position(0, 1), kind=RecordKind.DATA, topic="q.a", source="p@example.com",
        source_seq=1, gap_to=None, gap_reason=None, publish_type=PublishType.UPDATE,
        publisher_seq=None, message_id="1029", revision_id="3", publication_date=None,
        expiration_date=_date(T0 + 1000), permission_token=None,
        content_type="application/xml", content=b"i", fields={}, options={}, appended_at=T0)
    delta = JournalEntry(**{**{f: getattr(image, f) for f in image.__slots__},  # type: ignore[arg-type]
                            "position": Position(0, 2), "source_seq": 2, "revision_id": None,
                            "expiration_date": None, "content": b"d"})
    store.apply([image, delta])
    assert [e.content for e in store.snapshot("q.a", now=T0)] == [b"i", b"d"]
    assert store.snapshot("q.a", now=T0 + 1000) == []
