"""Ingest (broker/pubsub/ingest.py): headers and fields of a published message, parsed once."""

from __future__ import annotations

from typing import Any

import pytest

from broker.pubsub.ingest import ingest, is_xml, parse_date
from broker.selectors import parse_selector_schema
from common.errors import InvalidMessage

NOW = 1_700_000_000_000
QUOTE = b"""<ps:message-content transID='101' content='#Content'
                    xmlns:ps='http://www.example.com/pubsub'>
  <ps:topic>somewhere.else</ps:topic>
  <ps:publisher>mallory@example.com</ps:publisher>
  <ps:publication-date>2002-03-15T12:15:00-08:00</ps:publication-date>
  <ps:expiration-date>2003-03-15T12:15:00-08:00</ps:expiration-date>
  <ps:message-id>1029</ps:message-id>
  <ps:revision-id>3</ps:revision-id>
  <ps:content Name='Content'>
    <equity-quote symbol='XMPL'><net-change-pct>10.0</net-change-pct></equity-quote>
  </ps:content>
</ps:message-content>"""


def _ingest(content: bytes, **kw: Any) -> Any:
    args: dict[str, Any] = {"topic": "equity.quote.service", "publisher": "quote@example.com",
                            "now": NOW}
    return ingest(content, kw.pop("content_type", "application/xml"), **(args | kw))


def test_headers_and_fields_from_one_message() -> None:
    got = _ingest(QUOTE)
    assert got.message_id == "1029"
    assert got.revision_id == "3"
    assert got.expiration_date == "2003-03-15T12:15:00-08:00"
    assert got.publication_date == parse_date("2002-03-15T20:15:00+00:00", "d")
    assert got.fields["symbol"] == ["XMPL"]
    assert got.fields["net-change-pct"] == ["10.0"]
    assert got.fields["message-id"] == ["1029"]


def test_publisher_and_topic_are_the_brokers_not_the_contents() -> None:
    got = _ingest(QUOTE)
    assert got.publisher == "quote@example.com"
    assert got.fields["publisher"] == ["quote@example.com"]
    assert got.fields["topic"] == ["equity.quote.service"]


def test_publication_date_set_by_the_broker_when_absent() -> None:
    got = _ingest(b"<equity-quote symbol='TEST'/>")
    assert got.publication_date == NOW
    assert got.fields["publication-date"][0].startswith("2023-11-14T22:13:20")
    assert got.message_id is None and got.revision_id is None and got.expiration_date is None


def test_content_that_is_not_xml_is_not_parsed() -> None:
    got = _ingest(b"<<< not xml", content_type="application/octet-stream", message_id="IBM")
    assert got.fields == {} and got.message_id == "IBM" and got.publication_date == NOW


@pytest.mark.parametrize("media", ["application/xml", "text/xml; charset=utf-8",
                                   "application/beep+xml", "Application/Atom+XML"])
def test_xml_media_types(media: str) -> None:
    assert is_xml(media)


@pytest.mark.parametrize("bad", [
    b"<a><b></a>",
    b"<!DOCTYPE a [<!ENTITY x 'y'>]><a>&x;</a>",
    QUOTE.replace(b">3<", b">-1<"),
    QUOTE.replace(b">3<", b">2147483648<"),
    QUOTE.replace(b"2003-03-15T12:15:00-08:00", b"next tuesday"),
    QUOTE.replace(b"2002-03-15T12:15:00-08:00", b"yesterday"),
])
def test_malformed_xml_or_headers_are_561(bad: bytes) -> None:
    with pytest.raises(InvalidMessage):
        _ingest(bad)


@pytest.mark.parametrize("expires", [b"0", b"*"])
def test_expiration_zero_and_never(expires: bytes) -> None:
    got = _ingest(QUOTE.replace(b"2003-03-15T12:15:00-08:00", expires))
    assert got.expiration_date == expires.decode()


def test_message_id_must_agree_with_the_publish_option() -> None:
    assert _ingest(QUOTE, message_id="1029").message_id == "1029"
    with pytest.raises(InvalidMessage):
        _ingest(QUOTE, message_id="IBM")


def test_selector_schema_keeps_only_its_names() -> None:
    schema = parse_selector_schema(
        "<selector-schema xmlns:xs='http://www.w3.org/2001/XMLSchema'>"
        "<xs:element name='net-change-pct' type='xs:decimal'/>"
        "<xs:attribute name='publisher' type='xs:string'/></selector-schema>")
    got = _ingest(QUOTE, schema=schema)
    assert got.fields == {"net-change-pct": ["10.0"], "publisher": ["quote@example.com"]}


def test_validation_hook_sees_the_parsed_tree_once() -> None:
    seen: list[Any] = []
    got = _ingest(QUOTE, validate=seen.append)
    assert len(seen) == 1 and seen[0].tag.endswith("message-content")
    assert got.fields["symbol"] == ["XMPL"]

    def refuse(_root: Any) -> None:
        raise InvalidMessage("does not conform")

    with pytest.raises(InvalidMessage):
        _ingest(QUOTE, validate=refuse)
