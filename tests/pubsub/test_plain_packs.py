"""`PlainPacks` (adapters/pubsub/_plain_packs.py): a forward turn's messages for each plain
subscriber that said batch=, in `<publications>` documents of at most its limit and BATCH_BYTES,
in order, each message with its own InRe, the documents' hop limit the least of their
messages'; a pack of one goes as the data of its own. Pure: the data it hands to `send` are
decoded back."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from adapters.apex.batch_codec import BATCH_BYTES
from adapters.apex.codec import Data, _decode_fast, encode
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
    sent: list[Data | tuple[str, JournalEntry, tuple[str, ...] | None]] = []
    packs = PlainPacks(SERVICE, lambda data, tags=None: sent.append(data), itertools.count(1),
                       lambda _who: limit, lambda *alone: sent.append(alone))
    entries = [_entry(n, size, hops) for n, (_, size, hops, _) in enumerate(adds)]
    for entry, (who, _, _, in_re) in zip(entries, adds, strict=True):
        packs.add(who, entry, in_re)
    packs.close()
    for who in ("a@example.com", "b@example.com"):
        want = [(n, in_re) for n, (w, _, _, in_re) in enumerate(adds) if w == who]
        got = []
        for out in sent:
            if isinstance(out, tuple):  # one message alone: the data of its own
                if out[0] == who:
                    got.append((out[1].position.offset, out[2]))
                continue
            if out.recipients != (Endpoint.parse(who),):
                continue
            doc = decode_publications(out.content)
            got += [(int(p.content.split(b":")[0]), p.in_re) for p in doc]
            assert out.originator == SERVICE and 1 < len(doc) <= limit
            # a document is closed before the message that would take it past BATCH_BYTES
            assert len(out.content) <= BATCH_BYTES + 40
            hops = min(adds[int(p.content.split(b":")[0])][2] for p in doc)
            (option,) = out.options
            assert f"noMoreThan='{hops}'" in option.content
        assert got == want


def test_a_message_for_many_subscribers_is_encoded_once() -> None:
    sent: list[Data] = []
    packs = PlainPacks(SERVICE, lambda data, tags=None: sent.append(data), itertools.count(1),
                       lambda _who: 10, lambda *_: None)
    entries = [_entry(0, 100, 5), _entry(1, 100, 5)]
    for who in ("a@example.com", "b@example.com", "c@example.com"):
        for entry in entries:
            packs.add(who, entry, None)
    packs.close()
    assert len(packs._contents) == 2
    assert len(sent) == 3 and len({d.content for d in sent}) == 1


def test_a_pack_travels_as_a_mime_part_that_the_fast_reader_takes() -> None:
    """The document is the data's MIME part, not XML inline in the control document: a
    subscriber then reads the data without lxml (inline, a pack cost a plain subscriber more
    than the data it replaced: W2's subscriber 162 µs a message against 145)."""
    sent: list[Data] = []
    packs = PlainPacks(SERVICE, lambda data, tags=None: sent.append(data), itertools.count(1),
                       lambda _who: 10, lambda *_: None)
    for n in range(3):
        packs.add("a@example.com", _entry(n, 512, 5), ("1",))
    packs.close()
    (data,) = sent
    content_type, body = encode(data)
    fast = _decode_fast(content_type, body)
    assert fast is not None and (fast.content, fast.recipients) == (data.content, data.recipients)
