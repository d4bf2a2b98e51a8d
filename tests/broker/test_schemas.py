"""A topic's message and selector schemas (broker/pubsub/schemas.py), on their own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import selectors
from broker.pubsub import schemas
from broker.pubsub.schemas import TopicSchemas, check_selector, compile_message_schema, prepare
from broker.records import Topic
from common.errors import (
    InvalidMessage,
    InvalidSchema,
    MessageNotConforming,
    SelectorError,
    UnsupportedSelectorClass,
)

XS = "xmlns:xsd='http://www.w3.org/2001/XMLSchema'"

#: §5.3.1's message schema, as createtopic carries it (the draft's form: declarations only).
QUOTE_SCHEMA = f"""<message-schema {XS}>
  <xsd:element name='equity-quote'>
    <xsd:complexType>
      <xsd:sequence>
        <xsd:element name='issue-name' type='xsd:string'/>
        <xsd:element name='last-trade' type='xsd:decimal'/>
        <xsd:element name='last-trade-datetime' type='xsd:string'/>
        <xsd:element name='net-change-price' type='xsd:decimal'/>
        <xsd:element name='net-change-pct' type='xsd:decimal'/>
        <xsd:element name='best-bid-price' type='xsd:decimal'/>
        <xsd:element name='best-ask-price' type='xsd:decimal'/>
      </xsd:sequence>
      <xsd:attribute name='symbol' type='xsd:string' use='required'/>
    </xsd:complexType>
  </xsd:element>
</message-schema>"""


def quote(pct: str = "10.0", symbol: str = "XMPL") -> bytes:
    """§5.2's message, whole (ps:message-content with its headers)."""
    return f"""<ps:message-content transID='101' content='#Content'
        xmlns:ps='http://www.example.com/pubsub'>
      <ps:topic>equity.quote.service</ps:topic>
      <ps:publisher>quote-service@example.com</ps:publisher>
      <ps:publication-date>2002-03-15T12:15:00-08:00</ps:publication-date>
      <ps:message-id>1029</ps:message-id>
      <ps:content Name='Content'>
        <equity-quote symbol='{symbol}'>
          <issue-name>Example, Inc.</issue-name>
          <last-trade>11.0</last-trade>
          <last-trade-datetime>October 18, 2001 11:12:00</last-trade-datetime>
          <net-change-price>1.0</net-change-price>
          <net-change-pct>{pct}</net-change-pct>
          <best-bid-price>11.0</best-bid-price>
          <best-ask-price>12.0</best-ask-price>
        </equity-quote>
      </ps:content>
    </ps:message-content>""".encode()


def topic(message_schema: str | None = None, *selector_schemas: str, name: str = "q",
          revision: int = 1) -> Topic:
    msg, sel = prepare(message_schema, selector_schemas)
    return Topic(name=name, created_at=1, revision=revision, message_schema=msg,
                 selector_schema=sel)


def test_the_drafts_message_conforms_to_the_drafts_schema_whole_or_bare() -> None:
    """§5.2's message satisfies §5.3.1's schema as ps:message-content and as the bare body."""
    checked = TopicSchemas.of(topic(QUOTE_SCHEMA))
    checked.validate(quote())
    body = quote().split(b"<ps:content Name='Content'>")[1].split(b"</ps:content>")[0]
    checked.validate(body.strip())


def test_a_message_that_does_not_conform_is_561_naming_the_first_error_and_its_line() -> None:
    """A decimal field holding text is MessageNotConforming (561), with the line it is on."""
    checked = TopicSchemas.of(topic(QUOTE_SCHEMA))
    with pytest.raises(MessageNotConforming) as caught:
        checked.validate(quote(pct="ten"))
    assert caught.value.code == 561
    assert "net-change-pct" in str(caught.value) and "(line 13)" in str(caught.value)


def test_a_missing_required_attribute_does_not_conform() -> None:
    """use='required' holds: a quote without its symbol is refused."""
    text = quote().replace(b" symbol='XMPL'", b"")
    with pytest.raises(MessageNotConforming, match="symbol"):
        TopicSchemas.of(topic(QUOTE_SCHEMA)).validate(text)


def test_a_topic_without_a_message_schema_takes_any_message() -> None:
    """The default message schema (§5.3.2) encloses anything: nothing is validated."""
    TopicSchemas.of(topic()).validate(b"not even XML")


def test_a_message_over_the_size_cap_is_refused_before_it_is_parsed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """10 MB against a schema: 561 by its size alone; lxml never sees it."""
    checked = TopicSchemas.of(topic(QUOTE_SCHEMA))
    big = b"<equity-quote symbol='X'>" + b"<x/>" * (10 * 1024 * 1024 // 4) + b"</equity-quote>"

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed a message over the cap")

    monkeypatch.setattr(schemas.etree, "fromstring", no_parse)
    with pytest.raises(InvalidMessage, match="exceeds the limit") as caught:
        checked.validate(big)
    assert caught.value.code == 561


def test_a_body_that_is_not_one_element_does_not_conform() -> None:
    """ps:content with two elements (or none) is no message the schema can describe."""
    two = quote().replace(b"</equity-quote>", b"</equity-quote><extra/>")
    with pytest.raises(MessageNotConforming, match="2 elements"):
        TopicSchemas.of(topic(QUOTE_SCHEMA)).validate(two)


def test_the_drafts_2000_10_namespace_is_read_as_xml_schema() -> None:
    """§8's examples use the 2000/10 namespace; such a schema compiles and validates."""
    old = QUOTE_SCHEMA.replace("2001/XMLSchema", "2000/10/XMLSchema")
    TopicSchemas.of(topic(old, name="old")).validate(quote())


def test_a_schema_is_compiled_once_per_topic_revision() -> None:
    """The same record gives the same compiled object; a new revision compiles again."""
    first = topic(QUOTE_SCHEMA, name="cached")
    assert TopicSchemas.of(first) is TopicSchemas.of(first)
    later = topic(QUOTE_SCHEMA, name="cached", revision=2)
    assert TopicSchemas.of(later) is not TopicSchemas.of(first)


# --- refused schemas ------------------------------------------------------------------------

_KINDS = ["include", "import namespace='urn:other'", "redefine", "override"]
_LOCATIONS = st.one_of(
    st.builds(lambda host, path: f"http://{host}/{path}.xsd",
              st.sampled_from(["127.0.0.1:9", "example.com", "[::1]:80", "localhost"]),
              st.text("abcxyz/._-", min_size=1, max_size=12)),
    st.builds(lambda p: f"file:///{p}", st.text("abc/._-", min_size=1, max_size=20)),
    st.builds(lambda p: f"/{p}", st.text("abc/._-", min_size=1, max_size=20)),
    st.text("abc/._-", min_size=1, max_size=20),  # relative paths
    st.sampled_from(["ftp://example.com/s.xsd", "https://example.com/s.xsd",
                     "apexps:topic/q", "\\\\server\\share\\s.xsd", "data:,x"]),
)


def _with_reference(kind: str, location: str) -> str:
    loc = location.replace("&", "&amp;").replace("'", "&apos;").replace("<", "&lt;")
    return (f"<message-schema {XS}><xsd:schema><xsd:{kind} schemaLocation='{loc}'/>"
            "<xsd:element name='a' type='xsd:string'/></xsd:schema></message-schema>")


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(_KINDS), location=_LOCATIONS)
def test_any_include_or_import_of_a_url_or_path_is_refused(kind: str, location: str) -> None:
    """Guard 2: whatever the location, an xs:include/import/redefine/override is 553, refused
    by name before libxml2 is asked to load anything."""
    with pytest.raises(InvalidSchema, match=r"^xs:(include|import|redefine|override) ") as caught:
        prepare(_with_reference(kind, location))
    assert caught.value.code == 553


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(_KINDS[:3]), location=_LOCATIONS)
def test_the_resolver_alone_refuses_every_load(kind: str, location: str) -> None:
    """Guard 3 without guard 2: libxml2 asks the resolver, which reads nothing and refuses."""
    original = schemas._check_costs
    schemas._check_costs = lambda root: None  # as if guard 2 had missed it
    try:
        with pytest.raises(InvalidSchema, match="refused: a topic's schema is self-contained"):
            prepare(_with_reference(kind, location))
    finally:
        schemas._check_costs = original


def test_the_resolver_does_not_read_an_existing_local_schema(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """An include of a real, valid schema file is refused, not read (guard 2 switched off)."""
    from pathlib import Path
    path = Path(str(tmp_path)) / "inc.xsd"
    path.write_text(f"<xsd:schema {XS}><xsd:element name='b' type='xsd:string'/></xsd:schema>")
    monkeypatch.setattr(schemas, "_check_costs", lambda root: None)
    with pytest.raises(InvalidSchema, match="refused") as caught:
        prepare(_with_reference("include", str(path)))
    assert str(path) in str(caught.value)


def test_a_uri_to_fetch_is_refused_and_a_named_topic_is_copied() -> None:
    """<message-schema uri='http://…'> is 553; uri='apexps:topic/NAME' copies NAME's schema."""
    with pytest.raises(InvalidSchema, match="fetches no schema"):
        prepare("<message-schema uri='http://www.example.com/schema/service.xsd'/>")
    named = topic(QUOTE_SCHEMA, name="schema.quote")
    found, _ = prepare("<message-schema uri='apexps:topic/schema.quote'/>",
                       named={"schema.quote": named}.get)
    assert found == named.message_schema
    with pytest.raises(InvalidSchema, match="no topic 'nothing'"):
        prepare("<message-schema uri='apexps:topic/nothing'/>", named={}.get)


@pytest.mark.parametrize("bad, why", [
    (f"<message-schema {XS}><xsd:element name='a' type='xsd:nosuch'/></message-schema>",
     "not a usable"),
    (f"<message-schema {XS}><xsd:element name='a'><xsd:simpleType><xsd:restriction"
     " base='xsd:string'><xsd:pattern value='(a|aa)*b'/></xsd:restriction></xsd:simpleType>"
     "</xsd:element></message-schema>", "quantifies a group"),
    (f"<message-schema {XS}><xsd:element name='a'><xsd:complexType><xsd:sequence"
     " maxOccurs='10'><xsd:choice maxOccurs='10'><xsd:element name='b'/></xsd:choice>"
     "</xsd:sequence></xsd:complexType></xsd:element></message-schema>", "repeats inside"),
    (f"<message-schema {XS}><xsd:element name='a'><xsd:complexType><xsd:choice"
     " maxOccurs='unbounded'><xsd:element name='c' maxOccurs='unbounded'/><xsd:element"
     " name='d'/></xsd:choice></xsd:complexType></xsd:element></message-schema>",
     "repeats inside"),
    (f"<message-schema {XS}><xsd:element name='a' maxOccurs='x'/></message-schema>",
     "maxOccurs"),
    (f"<message-schema {XS}>"  # h refers to g, defined after it: a fixpoint, not one pass
     "<xsd:group name='h'><xsd:sequence><xsd:group ref='g'/></xsd:sequence></xsd:group>"
     "<xsd:group name='g'><xsd:choice><xsd:element name='c'"
     " maxOccurs='unbounded'/><xsd:element name='d'/></xsd:choice></xsd:group>"
     "<xsd:element name='a'><xsd:complexType><xsd:choice maxOccurs='unbounded'>"
     "<xsd:group ref='h'/></xsd:choice></xsd:complexType></xsd:element></message-schema>",
     "repeats inside"),
    ("<message-schema><a/></message-schema>", "declarations"),
    ("<message-schema><!DOCTYPE x></message-schema>", "not well-formed|DOCTYPE"),
    ("<!DOCTYPE m [<!ENTITY e SYSTEM 'file:///etc/passwd'>]><message-schema>&e;"
     "</message-schema>", "DOCTYPE"),
    ("<message-schema>" + "<a>" * 70 + "</a>" * 70 + "</message-schema>", "deeper"),
    (f"<message-schema {XS}>" + "<xsd:annotation/>" * 30_000 + "</message-schema>",
     "exceeds the limit"),
])
def test_a_bad_message_schema_is_553(bad: str, why: str) -> None:
    """Not XML Schema, costly constructs, DOCTYPEs, depth and size: each refused with a reason."""
    with pytest.raises(InvalidSchema, match=why):
        prepare(bad)


def test_compile_alone_refuses_what_prepare_refuses() -> None:
    """The record's text is checked again when compiled (a record written by another hand)."""
    with pytest.raises(InvalidSchema, match="self-contained"):
        compile_message_schema(
            f"<xsd:schema {XS}><xsd:include schemaLocation='x.xsd'/></xsd:schema>")


# --- selector schemas -----------------------------------------------------------------------

SELECTOR_SCHEMA = f"""<selector-schema class='JMS' {XS}>
    <xsd:element name='equity-quote'>
        <xsd:complexType>
            <xsd:element name='net-change-pct' type='xsd:decimal'/>
            <xsd:attribute name='symbol' type='xsd:string'/>
        </xsd:complexType>
    </xsd:element>
</selector-schema>"""


def jms(text: str) -> selectors.Selector:
    return selectors.compile("JMS", text)


def test_a_selector_naming_a_field_the_schema_lacks_is_567() -> None:
    """§5.8.1: a selector that does not fit the topic's selector schema is refused (567)."""
    checked = TopicSchemas.of(topic(None, SELECTOR_SCHEMA, name="sel"))
    with pytest.raises(SelectorError, match="industry-group") as caught:
        check_selector(jms("industry-group = 'tech'"), checked)
    assert caught.value.code == 567


def test_a_selector_using_a_field_with_the_wrong_type_is_567() -> None:
    """symbol is a string: comparing it with a number does not fit."""
    checked = TopicSchemas.of(topic(None, SELECTOR_SCHEMA, name="sel"))
    with pytest.raises(SelectorError):
        check_selector(jms("symbol > 5"), checked)
    with pytest.raises(SelectorError):
        check_selector(jms("net-change-pct LIKE '1%'"), checked)


def test_a_fitting_selector_comes_back_typed_by_the_schema() -> None:
    """The §5.8 selector fits; the returned selector compares net-change-pct as a number."""
    checked = TopicSchemas.of(topic(None, SELECTOR_SCHEMA, name="sel"))
    typed = check_selector(
        jms("symbol IN ('XMPL', 'TEST') AND (net-change-pct > 5.0 OR net-change-pct < -5.0)"),
        checked)
    assert typed.matches(quote()) and not typed.matches(quote(pct="1.0"))


def test_a_class_the_topic_does_not_offer_is_566() -> None:
    """A topic whose selector schema is for JMS refuses an RFC-2254 selector with 566."""
    checked = TopicSchemas.of(topic(None, SELECTOR_SCHEMA, name="sel"))
    with pytest.raises(UnsupportedSelectorClass) as caught:
        check_selector(selectors.compile("RFC-2254", "(symbol=XMPL)"), checked)
    assert caught.value.code == 566


def test_the_default_selector_schema_is_the_message_schema_and_the_headers() -> None:
    """§5.5.1: with only `<selector-schema class='JMS'/>`, the message schema's names and the
    ps: headers are selectable, typed; anything else is 567."""
    checked = TopicSchemas.of(topic(QUOTE_SCHEMA, "<selector-schema class='JMS'/>", name="d"))
    check_selector(jms("best-bid-price > 10 AND publisher = 'a@b' AND message-id > 3"), checked)
    with pytest.raises(SelectorError):
        check_selector(jms("color = 'red'"), checked)
    with pytest.raises(UnsupportedSelectorClass):
        check_selector(selectors.compile("RFC-2254", "(symbol=XMPL)"), checked)


def test_without_any_schema_a_selector_may_name_anything() -> None:
    """No message schema and no selector schema: nothing to check against."""
    sel = jms("anything > 1")
    assert check_selector(sel, TopicSchemas.of(topic(name="none"))) is sel


def test_several_selector_schemas_are_stored_together_and_read_as_one() -> None:
    """Two <selector-schema> elements: their classes and names are read as the union."""
    ldap = ("<selector-schema class='RFC-2254' "
            f"{XS}><xsd:element name='volume' type='xsd:int'/></selector-schema>")
    stored = topic(None, SELECTOR_SCHEMA, ldap, name="two")
    assert stored.selector_schema is not None
    assert stored.selector_schema.startswith("<selector-schemas>")
    checked = TopicSchemas.of(stored)
    check_selector(selectors.compile("RFC-2254", "(&(symbol=XMPL)(volume>=100))"), checked)
    check_selector(jms("volume > 100 AND net-change-pct > 1"), checked)


def test_a_selector_schema_for_a_class_apexps_lacks_is_566_and_a_uri_553() -> None:
    """createtopic may not offer a class the broker cannot evaluate, nor a schema to fetch."""
    with pytest.raises(UnsupportedSelectorClass):
        prepare(None, ["<selector-schema class='XPath'/>"])
    with pytest.raises(InvalidSchema, match="fetches no uri"):
        prepare(None, ["<selector-schema class='JMS' uri='http://example.com/s.xsd'/>"])


def test_repetition_is_accepted_once_per_content_model() -> None:
    """What stays linear is accepted: a repeating choice of single elements, a counted element,
    and repetition again inside a repeated element's own type (a new content model)."""
    one_level = (f"<message-schema {XS}><xsd:element name='a'><xsd:complexType>"
                 "<xsd:choice maxOccurs='unbounded'><xsd:element name='c'/>"
                 "<xsd:element name='d' maxOccurs='1'/></xsd:choice></xsd:complexType>"
                 "</xsd:element></message-schema>")
    counted = (f"<message-schema {XS}><xsd:element name='a'><xsd:complexType><xsd:sequence>"
               "<xsd:element name='c' maxOccurs='100000'><xsd:complexType><xsd:sequence"
               " maxOccurs='unbounded'><xsd:element name='e'/></xsd:sequence></xsd:complexType>"
               "</xsd:element></xsd:sequence></xsd:complexType></xsd:element></message-schema>")
    in_type = (f"<message-schema {XS}><xsd:element name='a'><xsd:complexType><xsd:sequence"
               " maxOccurs='unbounded'><xsd:element name='c'><xsd:complexType><xsd:choice"
               " maxOccurs='unbounded'><xsd:element name='e'/></xsd:choice></xsd:complexType>"
               "</xsd:element></xsd:sequence></xsd:complexType></xsd:element></message-schema>")
    for text in (one_level, counted, in_type):
        message, _ = prepare(text)
        assert message is not None
    checked = TopicSchemas.of(topic(counted, name="counted"))
    checked.validate(b"<a>" + b"<c><e/><e/></c>" * 1000 + b"</a>")
    with pytest.raises(MessageNotConforming):
        checked.validate(b"<a>" + b"<c><e/></c>" * 1000 + b"<f/></a>")
