"""`PlainPacks` (adapters/pubsub/_plain_packs.py): a forward turn's messages for each plain
subscriber that said batch=, in `<publications>` documents of at most its limit and about
BATCH_BYTES, in order, each message with its own InRe, the documents' hop limit the least of
their messages'. Pure: the data it hands to `send` are decoded back."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from adapters.apex.batch_codec import BATCH_BYTES
from adapters.apex.codec import Data
from adapters.apex.endpoint import Endpoint
from adapters.apex.publications_codec import decode_publications
from adapters.pubsub._plain_packs import PlainPacks
from broker.records import JournalEntry, Position, PublishType, RecordKind

SERVICE = Endpoint.parse("apex=pubsub@example.com")


def _entry(n: int, size: int, hops: int) -> JournalEntry:
    return JournalEntry(Position(0, n), RecordKind.DATA, "q.a", "pub@example.com", n + 1,
                        None, None, PublishType.UPDATE, None, None, None, None, None, None,
                        "text/plain", b"%d:" % n + b"." * size, {},
                        {"dataHopping": str(hops)}, 0)


@given(st.lists(st.tuples(st.sampled_from(["a@example.com", "b@example.com"]),
                          st.integers(0, 40_000), st.integers(1, 9),
                          st.none() | st.sampled_from([("1",), ("1", "2")])), max_size=40),
       st.integers(1, 5))
def test_each_subscriber_gets_its_messages_in_order_in_bounded_documents(
        adds: list[tuple[str, int, int, tuple[str, ...] | None]], limit: int) -> None:
    sent: list[Data] = []
    packs = PlainPacks(SERVICE, lambda data, tags=None: sent.append(data), itertools.count(1),
                       lambda _who: limit)
    for n, (who, size, hops, in_re) in enumerate(adds):
        packs.add(who, _entry(n, size, hops), in_re)
    packs.close()
    for who in ("a@example.com", "b@example.com"):
        mine = [d for d in sent if d.recipients == (Endpoint.parse(who),)]
        want = [(n, in_re) for n, (w, _, _, in_re) in enumerate(adds) if w == who]
        docs = [decode_publications(d.content) for d in mine]
        got = [(int(p.content.split(b":")[0]), p.in_re) for doc in docs for p in doc]
        assert got == want
        for data, doc in zip(mine, docs, strict=True):
            assert data.originator == SERVICE and 0 < len(doc) <= limit
            # a document is closed before the item that would take it past BATCH_BYTES
            assert len(doc) == 1 or len(data.content) <= BATCH_BYTES + 200
            hops = min(adds[int(p.content.split(b":")[0])][2] for p in doc)
            (option,) = data.options
            assert f"noMoreThan='{hops}'" in option.content


def test_a_message_for_many_subscribers_is_encoded_once() -> None:
    sent: list[Data] = []
    packs = PlainPacks(SERVICE, lambda data, tags=None: sent.append(data), itertools.count(1),
                       lambda _who: 10)
    entry = _entry(0, 100, 5)
    for who in ("a@example.com", "b@example.com", "c@example.com"):
        packs.add(who, entry, None)
    assert len(packs._contents) == 1
    packs.close()
    assert len(sent) == 3 and len({d.content for d in sent}) == 1
