"""The event binding's codec (adapters/apex/events_codec.py): round trips of generated values,
each checked against docs/apexps-events.dtd, and bad input answered with its code."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from adapters.apex.endpoint import Endpoint
from adapters.apex.events_codec import (
    Decision,
    NotifyDoc,
    Version,
    WatchReply,
    WatchRequest,
    decode_events,
    encode_events,
)
from broker.events import PERMANENT, Reason, Resource, State
from broker.records import PublishType

DTD = etree.DTD(str(Path(__file__).resolve().parents[2] / "docs" / "apexps-events.dtd"))

resources = st.builds(Resource, st.sampled_from(["q.a", "equity.quote"]),
                      st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF,
                                            exclude_characters="\x7f"), min_size=1, max_size=20))
ids = st.from_regex(r"[A-Za-z0-9.:=/@+_-]{1,20}", fullmatch=True)
events = st.frozensets(st.sampled_from([1, 2, 3, 0x8000, PERMANENT]), min_size=1)
versions = st.builds(Version, st.just("fred@example.com"), st.integers(1, 2**63 - 1),
                     st.sampled_from([t for t in PublishType if t is not PublishType.SNAPSHOT]),
                     st.sampled_from(["application/beep+xml", "text/plain"]), st.binary())
watches = st.builds(WatchRequest, resources, ids, st.integers(0, PERMANENT), events,
                    st.integers(1, 2**31 - 1),
                    st.one_of(st.none(), st.just(Endpoint.parse("jade@example.com"))),
                    st.one_of(st.none(), st.just("desk-1")),
                    st.sampled_from([None, "add", "remove"]))
replies = st.builds(WatchReply, st.sampled_from([250, 550, 571, 572]),
                    st.integers(1, 2**31 - 1), st.one_of(st.none(), resources),
                    st.one_of(st.none(), ids), st.one_of(st.none(), st.integers(0, PERMANENT)),
                    st.one_of(st.just(frozenset()), events),
                    st.one_of(st.none(), st.integers(1, 100)), st.text(
                        st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=30,
                    ).map(str.strip))  # the reply's text is read stripped, as a pubsub reply's
states = st.sampled_from([(State.ACTIVE, None), (State.PENDING, None)]) | st.tuples(
    st.just(State.TERMINATED), st.sampled_from(list(Reason)))
notifies = st.builds(lambda r, i, sr, ev, ex, cur, vs: NotifyDoc(
    r, i, "jade@example.com", sr[0], sr[1], ev, ex, cur, tuple(vs)),
    resources, ids, states, st.one_of(st.just(frozenset()), events),
    st.one_of(st.none(), st.integers(0, PERMANENT)), st.booleans(),
    st.lists(versions, max_size=3))

decisions = st.builds(Decision, resources,
                      st.sampled_from([Endpoint.parse("jade@example.com"),
                                       Endpoint.parse("fred/appl=wb@example.com")]),
                      ids, st.booleans())


@given(st.one_of(watches, replies, notifies, decisions))
def test_round_trip_fits_the_dtd(doc: object) -> None:
    """What encode writes is valid against the DTD and decodes to the same value."""
    raw = encode_events(doc)  # type: ignore[arg-type]
    assert DTD.validate(etree.fromstring(raw)), DTD.error_log
    assert decode_events(raw) == doc


@pytest.mark.parametrize(("raw", "code"), [
    (b"<watch resource='q.a/IBM' id='1' expires='60' events='1' transID='1'", 500),
    (b"<!DOCTYPE x [<!ENTITY a 'b'>]><watch />", 500),
    (b"<watch resource='q.a/IBM' id='1' expires='60' events='1' />", 501),
    (b"<watch resource='q.a/IBM' id='1' expires='-1' events='1' transID='1' />", 501),
    (b"<watch resource='q.a/IBM' id='1' expires='4294967296' events='1' transID='1' />", 501),
    (b"<watch resource='q.a/IBM' id='1' expires='60' events='1  2' transID='1' />", 501),
    (b"<watch resource='q.a/IBM' id='1' expires='60' events='' transID='1' />", 501),
    (b"<watch resource='q.a/IBM' id='1' expires='60' events='x' transID='1' />", 501),
    (b"<watch resource='q.a/IBM' id='1' expires='60' events='1' transID='1' bogus='1' />", 501),
    (b"<watch resource='q.a/IBM' id='1' expires='60' events='1' transID='1' update='x' />",
     501),
    (b"<watch resource='q.a/IBM' id='a b' expires='60' events='1' transID='1' />", 501),
    (b"<watch resource='IBM' id='1' expires='60' events='1' transID='1' />", 553),
    (b"<watch resource='WKT=Nope/IBM' id='1' expires='60' events='1' transID='1' />", 553),
    (b"<notify resource='q.a/IBM' id='1' subscriber='j@x' state='active' reason='timeout' />",
     501),
    (b"<notify resource='q.a/IBM' id='1' subscriber='j@x' state='gone' />", 501),
    (b"<notify resource='q.a/IBM' id='1' subscriber='j@x' state='active'><version source='f@x'"
     b" sourceseq='1' type='image' content-type='t'>!!</version></notify>", 501),
    (b"<decide resource='q.a/IBM' subscriber='j@x' id='1' verdict='approve'", 500),
    (b"<decide resource='q.a/IBM' subscriber='j@x' id='1' />", 501),
    (b"<decide resource='q.a/IBM' subscriber='j@x' id='1' verdict='yes' />", 501),
    (b"<decide resource='q.a/IBM' subscriber='j@x' id='1' verdict='reject' by='x' />", 501),
    (b"<decide resource='q.a/IBM' subscriber='j@x' id='1' verdict='reject'><x /></decide>",
     501),
    (b"<decide resource='q.a/IBM' subscriber='j' id='1' verdict='reject' />", 553),
    (b"<decide resource='IBM' subscriber='j@x' id='1' verdict='reject' />", 553),
    (b"<subscribe />", 501),
])
def test_bad_input_gets_its_code(raw: bytes, code: int) -> None:
    """Not well-formed or hostile 500, not valid 501, a resource that is not one 553."""
    with pytest.raises(Exception) as caught:
        decode_events(raw)
    assert int(getattr(caught.value, "code", 0)) == code, caught.value
