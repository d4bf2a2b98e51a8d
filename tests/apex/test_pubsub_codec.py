"""The pubsub service's documents (draft-schwartz-apex-pubsub §2, §6.1): the draft's examples,
round trips of generated operations, and hostile documents."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.apex.endpoint import Endpoint
from adapters.apex.pubsub_codec import (
    Cancel,
    CreateTopic,
    DeleteTopic,
    ListTopics,
    PubsubOperation,
    Reply,
    Subscribe,
    TopicList,
    decode_pubsub,
    encode_pubsub,
)
from common.errors import ApexpsError, ParameterSyntaxError, SyntaxError_


def test_the_drafts_examples() -> None:
    assert decode_pubsub(b"<createtopic topic='music.jazz.milesdavis'\n transID='1' />") == \
        CreateTopic("music.jazz.milesdavis", 1)
    assert decode_pubsub(b"<deletetopic topic='music.jazz.milesdavis' transID='2' />") == \
        DeleteTopic("music.jazz.milesdavis", 2)
    assert decode_pubsub(b"<listtopics />") == ListTopics()
    assert decode_pubsub(b"<topiclist><topic name='music.jazz.milesdavis' /></topiclist>") == \
        TopicList(("music.jazz.milesdavis",))
    assert decode_pubsub(
        b"<subscribe subscriber='apex=pubsub/music.jazz.milesdavis@redistr.com'"
        b" topic='music.jazz.milesdavis' duration='9999999' transID='5' />") == Subscribe(
        Endpoint.parse("apex=pubsub/music.jazz.milesdavis@redistr.com"),
        "music.jazz.milesdavis", 5, 9999999)
    assert decode_pubsub(b"<cancel topic='music.jazz.milesdavis' transID='6' />") == \
        Cancel("music.jazz.milesdavis", 6)
    assert decode_pubsub(b"<reply code='250' transID='1' />") == Reply(250, 1)


_topics = st.from_regex(r"[a-z][a-z0-9.\-_]{0,30}", fullmatch=True)
_ids = st.integers(1, 2_147_483_647)
_who = st.sampled_from(["fred@example.com", "apex=pubsub/a.b@redistr.com", "w/x@rubble.com"])
_ops: st.SearchStrategy[PubsubOperation] = st.one_of(
    st.builds(CreateTopic, _topics, _ids),
    st.builds(DeleteTopic, _topics, _ids),
    st.builds(ListTopics, st.none() | _ids),
    st.builds(Subscribe, _who.map(Endpoint.parse), _topics, _ids,
              st.integers(-2_147_483_647, 2_147_483_647),
              st.none() | st.sampled_from(["desk-1", "fred@example.com", "a <&>'\" b"]),
              st.booleans(), st.none() | st.integers(1, 4096), st.booleans()),
    st.builds(Cancel, _topics, _ids, st.none() | _who.map(Endpoint.parse)),
    st.builds(Reply, st.integers(100, 999), st.none() | _ids,
              st.text("abc <&>'\"xyz", max_size=20).map(str.strip)),
    st.builds(TopicList, st.lists(_topics, max_size=5).map(tuple), st.none() | _ids),
)


@given(_ops)
def test_round_trip(op: PubsubOperation) -> None:
    assert decode_pubsub(encode_pubsub(op)) == op


@pytest.mark.parametrize(("doc", "error"), [
    (b"<createtopic topic='a' />", ParameterSyntaxError),                  # no transID
    (b"<createtopic topic='a' transID='0' />", ParameterSyntaxError),      # transID out of range
    (b"<createtopic topic='a' transID='x' />", ParameterSyntaxError),
    (b"<createtopic topic='a' transID='1' owner='me' />", ParameterSyntaxError),
    (b"<createtopic topic='a' transID='1'><x /></createtopic>", ParameterSyntaxError),
    (b"<subscribe subscriber='fred@example.com' topic='a' transID='1' duration='1e9' />",
     ParameterSyntaxError),
    (b"<subscribe subscriber='nobody' topic='a' transID='1' duration='9' />", ApexpsError),
    (b"<publish topic='a' />", ParameterSyntaxError),
    (b"<topiclist><name topic='a' /></topiclist>", ParameterSyntaxError),
    (b"<subscribe subscriber='fred@example.com' topic='a' transID='1' duration='9' link='' />",
     ApexpsError),                                                     # empty link id
    (b"<subscribe subscriber='fred@example.com' topic='a' transID='1' duration='9'"
     b" link=' x' />", ApexpsError),                                   # padded link id
    (b"<createtopic", SyntaxError_),
    (b"<!DOCTYPE x [<!ENTITY a 'b'>]><listtopics />", SyntaxError_),
    (b"<" + b"x>" * 2000, SyntaxError_),
])
def test_hostile_documents_get_the_right_code(doc: bytes, error: type[ApexpsError]) -> None:
    with pytest.raises(error):
        decode_pubsub(doc)


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_an_apexps_error(blob: bytes) -> None:
    with contextlib.suppress(ApexpsError):
        decode_pubsub(blob)


def test_subscribe_names_its_link() -> None:
    """apexps's `link` attribute on subscribe (docs/robust-binding.md §3) round-trips."""
    doc = (b"<subscribe subscriber='jade@example.com' topic='equity.quote' duration='86400'"
           b" transID='5' link='desk-1' />")
    op = decode_pubsub(doc)
    assert op == Subscribe(Endpoint.parse("jade@example.com"), "equity.quote", 5, 86400, "desk-1")
    assert encode_pubsub(op) == doc


@pytest.mark.parametrize("batch", ["0", "4097", "-1", "x", ""])
def test_a_subscribe_batch_out_of_range_is_501(batch: str) -> None:
    with pytest.raises(ParameterSyntaxError):
        decode_pubsub(f"<subscribe subscriber='a@b.c' topic='t' duration='5' transID='1'"
                      f" batch='{batch}' />".encode())


@pytest.mark.parametrize(("value", "cached"), [("true", True), ("yes", True), ("false", True),
                                                (" x ", True), ("", False), ("  ", False)])
def test_cached_is_any_non_empty_value(value: str, cached: bool) -> None:
    """Content-based §5.8: "the cached attribute ... with a non-empty value" asks for the
    cached messages; absent or empty, only new ones."""
    doc = (f"<subscribe subscriber='jade@example.com' topic='equity.quote.service'"
           f" duration='86400' transID='700' cached='{value}' />").encode()
    assert decode_pubsub(doc).cached is cached  # type: ignore[union-attr]
    plain = doc.replace(f" cached='{value}'".encode(), b"")
    assert decode_pubsub(plain).cached is False  # type: ignore[union-attr]
