"""createtopic with the content-based draft's children (§6.2.3; docs/apexps-pubsub.dtd)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from adapters.apex.pubsub_codec import CreateTopic, decode_pubsub, encode_pubsub
from broker.pubsub.schemas import prepare
from common.errors import ParameterSyntaxError

XS = "xmlns:xsd='http://www.w3.org/2001/XMLSchema'"
SCHEMA = (f"<message-schema {XS}><xsd:element name='equity-quote' type='xsd:string' />"
          "</message-schema>")
SELECT = "<selector-schema class='JMS' />"


def test_the_drafts_createtopic_example() -> None:
    """§6.2.3's example (schemas filled in): each child lands in its field."""
    doc = f"""<createtopic topic='equity.quote.service' transID='105' {XS}>
        <publisher>stock-service@example.com
        </publisher>
        <description>
            This service provides delayed stock
            price information.
        </description>
        <message-schema><xsd:element name='equity-quote' type='xsd:string'/></message-schema>
        <selector-schema class='JMS'>
            <xsd:element name='symbol' type='xsd:string'/>
        </selector-schema>
    </createtopic>""".encode()
    op = decode_pubsub(doc)
    assert isinstance(op, CreateTopic)
    assert (op.topic, op.trans_id, op.publishers) == ("equity.quote.service", 105,
                                                      ("stock-service@example.com",))
    assert op.description == "This service provides delayed stock price information."
    assert op.message_schema is not None and len(op.selector_schemas) == 1
    # The namespace declared on <createtopic> travels with each schema element.
    message, selector = prepare(op.message_schema, op.selector_schemas)
    assert message is not None and "equity-quote" in message
    assert selector is not None and "symbol" in selector


def _as_lxml_writes(xml: str) -> str:
    # decoding serializes each schema element with lxml; generate them in that form
    return etree.tostring(etree.fromstring(xml), encoding="unicode")


_schemas = st.sampled_from([None, SCHEMA, "<message-schema uri='apexps:topic/q' />"]).map(
    lambda x: None if x is None else _as_lxml_writes(x))
_selectors = st.lists(st.sampled_from([SELECT, f"<selector-schema class='RFC-2254' {XS}>"
                                       "<xsd:attribute name='a' type='xsd:int' />"
                                       "</selector-schema>"]).map(_as_lxml_writes),
                      max_size=2).map(tuple)


@given(st.builds(CreateTopic, st.from_regex(r"[a-z][a-z.]{0,20}", fullmatch=True),
                 st.integers(1, 2_147_483_647), st.none() | st.text("ab <&>'\"c", max_size=20)
                 .map(lambda t: " ".join(t.split())),
                 st.lists(st.sampled_from(["a@b.c", "x/y@z.com"]), max_size=2).map(tuple),
                 _schemas, _selectors))
def test_createtopic_round_trips(op: CreateTopic) -> None:
    """Encode then decode gives the operation back, schemas as their element's XML."""
    assert decode_pubsub(encode_pubsub(op)) == op


@pytest.mark.parametrize("children", [
    "<message-schema /><message-schema />",                     # two message schemas
    f"{SELECT}<message-schema />",                              # out of the DTD's order
    "<description>a</description><publisher endpoint='a@b.c' />",
    "<disposition>create</disposition>",                        # a Topics-topic element
    "<message-schema href='x' />",                              # an attribute the DTD lacks
    "<description><b>bold</b></description>",
    "stray text",
])
def test_createtopic_outside_the_dtd_is_501(children: str) -> None:
    """What the DTD does not allow is a 501 on the document, before the service sees it."""
    with pytest.raises(ParameterSyntaxError):
        decode_pubsub(f"<createtopic topic='a' transID='1'>{children}</createtopic>".encode())
