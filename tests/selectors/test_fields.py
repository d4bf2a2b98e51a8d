"""extract_fields, the selector schema, and the draft's own examples end to end."""

from __future__ import annotations

import pytest
from lxml import etree

from broker import selectors
from common.errors import InvalidMessage, ReplyCode, SelectorError

# Draft §5.2's equity-quote message (with the closing quote its xmlns:ps attribute lacks).
DRAFT_MESSAGE = b"""<ps:message-content transID='101'
                    content='#Content'
                    xmlns:ps='http://www.example.com/pubsub'>
   <ps:topic>equity.quote.service</ps:topic>
   <ps:publisher>quote-service@example.com</ps:publisher>
   <ps:publication-date>2002-03-15T12:15:00-08:00
   </ps:publication-date>
   <ps:expiration-date>2003-03-15T12:15:00-08:00
   </ps:expiration-date>
   <ps:message-id>1029</ps:message-id>
   <ps:revision-id>0</ps:revision-id>
   <ps:content Name='Content'>
      <equity-quote symbol='XMPL'>
         <issue-name>Example, Inc.</issue-name>
         <last-trade>11.0</last-trade>
         <last-trade-datetime>October 18, 2001 11:12:00
         </last-trade-datetime>
         <net-change-price>1.0</net-change-price>
         <net-change-pct>10.0</net-change-pct>
         <best-bid-price>11.0</best-bid-price>
         <best-ask-price>12.0</best-ask-price>
      </equity-quote>
   </ps:content>
</ps:message-content>"""

DRAFT_JMS = """symbol IN ('XMPL', 'TEST', 'SMPL')
               AND (net-change-pct > 5.0
               OR net-change-pct < -5.0)"""
DRAFT_LDAP = """&(symbol='XMPL')
     (|(net-change-pct > 5.0)(net-change-pct < -5.0))"""

# Draft §5.5's selector schema (the 2000/10 namespace, xsd: prefix).
DRAFT_SCHEMA = b"""<selector-schema class='JMS' xmlns:xsd='http://www.w3.org/2000/10/XMLSchema'>
    <xsd:element name='equity-quote'>
        <xsd:complexType>
            <xsd:element name='net-change-pct' type='xsd:decimal'/>
            <xsd:attribute name='symbol' type='xsd:string'/>
        </xsd:complexType>
    </xsd:element>
</selector-schema>"""


@pytest.mark.parametrize(("klass", "text"), [("JMS", DRAFT_JMS), ("RFC-2254", DRAFT_LDAP)])
def test_draft_examples_match_draft_message(klass: str, text: str) -> None:
    """The draft's §5.6 / §5.8 selectors parse and match its §5.2 equity quote."""
    sel = selectors.compile(klass, text)
    assert sel.fields == {"symbol", "net-change-pct"}
    assert sel.matches(DRAFT_MESSAGE) is True
    calm = DRAFT_MESSAGE.replace(b"<net-change-pct>10.0", b"<net-change-pct>1.0")
    assert sel.matches(calm) is False


def test_fields_of_the_draft_message() -> None:
    """Headers, content elements (trimmed text) and attributes, but not envelope attributes."""
    fields = selectors.extract_fields(DRAFT_MESSAGE)
    assert fields["topic"] == ["equity.quote.service"]
    assert fields["publication-date"] == ["2002-03-15T12:15:00-08:00"]
    assert fields["last-trade-datetime"] == ["October 18, 2001 11:12:00"]
    assert fields["symbol"] == ["XMPL"]
    assert fields["message-id"] == ["1029"]
    assert "transID" not in fields and "Name" not in fields and "content" not in fields


def test_message_forms_give_the_same_content_fields() -> None:
    """bytes, str, an lxml element, ps:content and the bare content all read alike."""
    full = selectors.extract_fields(DRAFT_MESSAGE)
    root = etree.fromstring(DRAFT_MESSAGE)
    content = root[-1]
    bare = content[0]
    assert selectors.extract_fields(DRAFT_MESSAGE.decode()) == full
    assert selectors.extract_fields(root) == full
    expected = {k: v for k, v in full.items() if k not in selectors.HEADER_FIELDS}
    assert selectors.extract_fields(content) == expected
    assert selectors.extract_fields(etree.tostring(bare)) == expected


def test_repeated_elements_and_attributes_are_instances() -> None:
    """An element and an attribute of one name, and repeated elements, are all instances."""
    msg = b"<q x='1'><x> 2 </x><x>3<!-- c --></x><y><x>4</x></y></q>"
    assert selectors.extract_fields(msg)["x"] == ["1", "2", "3", "4"]


@pytest.mark.parametrize("msg", [
    b"<!DOCTYPE q [<!ENTITY e 'boom'>]><q>&e;</q>",
    b"<!DOCTYPE q SYSTEM 'http://example.com/q.dtd'><q/>",
    b"<q><unclosed></q>",
    b"<a>" * 100 + b"</a>" * 100,
])
def test_hostile_or_broken_xml_is_refused(msg: bytes) -> None:
    """DOCTYPEs, malformed XML and over-deep nesting raise InvalidMessage (561)."""
    with pytest.raises(InvalidMessage) as info:
        selectors.extract_fields(msg)
    assert info.value.code is ReplyCode.INVALID_MESSAGE


def test_oversized_message_is_refused() -> None:
    """A message over the byte limit is refused before parsing."""
    with pytest.raises(InvalidMessage):
        selectors.extract_fields(b"<q>" + b"x" * 100 + b"</q>", max_bytes=50)


def test_schema_types_drive_comparisons() -> None:
    """A declared decimal compares numerically in both classes; a string stays text."""
    schema = selectors.parse_selector_schema(DRAFT_SCHEMA)
    assert schema.types["net-change-pct"] is selectors.FieldType.NUMBER
    assert schema.types["symbol"] is selectors.FieldType.STRING
    assert selectors.compile("JMS", DRAFT_JMS, schema).matches(DRAFT_MESSAGE, schema)
    ldap = selectors.compile("RFC-2254", "(net-change-pct=10)", schema)
    assert ldap.matches(DRAFT_MESSAGE) is True
    untyped = selectors.compile("RFC-2254", "(net-change-pct=10)")
    assert untyped.matches(DRAFT_MESSAGE) is False


@pytest.mark.parametrize(("klass", "text", "reason"), [
    ("JMS", "last-trade > 5", "not in the topic's selector schema"),
    ("JMS", "net-change-pct = 'x'", "cannot compare"),
    ("JMS", "symbol > 'A'", "compare only"),
    ("JMS", "symbol + 1 = 2", "needs numbers"),
    ("JMS", "net-change-pct LIKE '1%'", "declared number"),
    ("RFC-2254", "(net-change-pct>=abc)", "not a number"),
    ("RFC-2254", "(last-trade=1)", "not in the topic's selector schema"),
])
def test_schema_mismatches_visible_in_text_are_567(klass: str, text: str, reason: str) -> None:
    """With a schema, unknown names and type mismatches seen in the text are compile errors."""
    with pytest.raises(SelectorError, match=reason):
        selectors.compile(klass, text, DRAFT_SCHEMA)


def test_schema_restricts_extracted_fields() -> None:
    """With a schema, extract_fields keeps only the names it declares."""
    schema = selectors.parse_selector_schema(DRAFT_SCHEMA)
    assert set(selectors.extract_fields(DRAFT_MESSAGE, schema)) == {
        "equity-quote", "symbol", "net-change-pct"}


def test_schema_boolean_and_conflicting_declarations() -> None:
    """xs:boolean reads 1/0 too; a name declared with two types falls back to untyped."""
    schema = selectors.parse_selector_schema(
        b"<s xmlns:xs='http://www.w3.org/2001/XMLSchema'><xs:element name='f' type='xs:boolean'/>"
        b"<xs:element name='v' type='xs:int'/><xs:attribute name='v' type='xs:string'/></s>")
    assert schema.types["v"] is selectors.FieldType.TEXT
    sel = selectors.compile("JMS", "f = TRUE AND f", schema)
    assert sel.matches_fields({"f": ["1"]}) is True
    assert sel.evaluate({"f": ["maybe"]}) is None


@pytest.mark.parametrize("names", [("symbol",), ("equity-quote", "last-trade"),
                                   ("issue-name", "symbol", "topic"), ("lang", "currency")])
def test_a_schema_keeps_exactly_the_fields_it_names_of_the_full_extraction(
        names: tuple[str, ...]) -> None:
    """With a schema, extraction skips the values of names it does not keep (their text is
    not even joined); what it keeps is exactly the schema-free extraction's, namespaced
    attributes by local name included."""
    message = DRAFT_MESSAGE.replace(
        b"<equity-quote symbol='XMPL'>",
        b"<equity-quote symbol='XMPL' xml:lang='en' xmlns:m='urn:m' m:currency='USD'>")
    decls = "".join(f"<xs:element name='{n}' type='xs:string'/>" for n in names)
    schema = selectors.parse_selector_schema(
        "<selector-schema class='JMS' xmlns:xs='http://www.w3.org/2001/XMLSchema'>"
        f"<xs:schema>{decls}</xs:schema></selector-schema>".encode())
    everything = selectors.extract_fields(message)
    assert everything["lang"] == ["en"] and everything["currency"] == ["USD"]
    assert selectors.extract_fields(message, schema) == \
        {k: v for k, v in everything.items() if k in names}
