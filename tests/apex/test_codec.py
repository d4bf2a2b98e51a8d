"""The APEX vocabulary: RFC 3340's example documents, round trips, and hostile payloads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.apex.codec import (
    BEEP_XML,
    DEFAULT_MAX_XML_DEPTH,
    Attach,
    Bind,
    Data,
    Error,
    Ok,
    Option,
    TargetHop,
    Terminate,
    decode,
    encode,
    encode_xml,
)
from adapters.apex.endpoint import Endpoint
from common.errors import ApexpsError, ReplyCode

FRED, BARNEY = Endpoint.parse("fred@example.com"), Endpoint.parse("barney@example.com")


def _xml(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode()


@pytest.mark.parametrize(
    ("xml", "operation"),
    [
        ("<attach endpoint='fred@example.com' transID='1' />", Attach(FRED, 1)),
        ("<bind relay='example.com' transID='1' />", Bind("example.com", 1)),
        ("<terminate transID='1' />", Terminate(1)),
        ("<ok />", Ok()),
        ("<error code='537'>access denied</error>", Error(537, "access denied")),
        ("<error code='550'>unknown transaction-identifier</error>",
         Error(550, "unknown transaction-identifier")),
        ("<data content='cid:1@example.com'>\n"
         "    <originator identity='fred@example.com' />\n"
         "    <recipient identity='barney@example.com' />\n"
         "    <option internal='statusRequest' targetHop='final' mustUnderstand='true'"
         " transID='86' />\n"
         "</data>",
         Data(FRED, (BARNEY,), options=(Option("statusRequest", 86, must_understand=True),),
              content_ref="cid:1@example.com")),
    ],
)
def test_rfc_examples_encode_exactly(xml: str, operation: object) -> None:
    """Encoding reproduces the RFC 3340 §4.4/§5.1 example documents (CRLF line ends)."""
    assert encode_xml(operation).encode() == _xml(xml)  # type: ignore[arg-type]


def test_rfc_examples_decode() -> None:
    """The §4.4 examples, as the RFC prints them, decode to the expected operations."""
    assert decode(BEEP_XML, b"<attach endpoint='fred@example.com' transID='1' />") == Attach(
        FRED, 1)
    assert decode(BEEP_XML, b"<terminate transID='13' />") == Terminate(13)
    assert decode(BEEP_XML, b"<ok />") == Ok()
    assert decode(BEEP_XML, b"<error code='537'>access denied</error>") == Error(
        537, "access denied")


def test_data_content_example_of_section_4_1() -> None:
    """§4.1's data-content example decodes, its XML content kept as octets, and round-trips."""
    body = b"""<data content='#Content'>
    <originator identity='fred@example.com' />
    <recipient identity='barney@example.com' />
    <data-content Name='Content'>
        <statusResponse transID='86'>
            <destination identity='barney@example.com'>
                <reply code='250' />
            </destination>
        </statusResponse>
    </data-content>
</data>"""
    data = decode(BEEP_XML, body)
    assert isinstance(data, Data) and data.content_ref == "#Content"
    assert data.content.startswith(b"<statusResponse transID=\"86\">")
    assert decode(*encode(data)) == data


def test_binary_content_travels_as_multipart_related() -> None:
    """Arbitrary octets go in a multipart/related part named by a cid: URL, and come back."""
    data = Data(FRED, (BARNEY, FRED), b"\x00\xff--\r\n\r\nGIF89a", "image/gif")
    content_type, body = encode(data)
    assert content_type.startswith("multipart/related; boundary=")
    back = decode(content_type, body)
    assert isinstance(back, Data)
    assert (back.content, back.content_type, back.recipients) == (
        data.content, "image/gif", data.recipients)
    assert back.content_ref is not None and back.content_ref.startswith("cid:")


def test_multipart_example_of_section_4_1() -> None:
    """§4.1's multipart/related example (headers as printed) yields the image part."""
    content_type = ('multipart/related; boundary="boundary"; start="<1@example.com>";'
                    ' type="application/beep+xml"')
    body = _xml("""--boundary
Content-Type: application/beep+xml
Content-ID: <1@example.com>

<data content='cid:2@example.com'>
    <originator identity='fred@example.com' />
    <recipient identity='barney@example.com' />
</data>

--boundary
Content-Type: image/gif
Content-Transfer-Encoding: binary
Content-ID: <2@example.com>

...
--boundary--
""")
    data = decode(content_type, body)
    assert isinstance(data, Data)
    assert (data.content, data.content_type) == (b"...", "image/gif")


def test_options_and_terminate_attributes_round_trip() -> None:
    """Options in every container and terminate's code/lang survive encode then decode."""
    opt = Option("urn:x:o", 5, external=True, target_hop=TargetHop.ALL)
    ops = [
        Attach(FRED, 7, (Option("attachOverride"),)),
        Terminate(0, 550, "going away & <bye>", "en"),
        Data(FRED, (BARNEY,), b"x", options=(opt,), originator_options=(opt,),
             recipient_options=((Option("statusRequest", 9),),)),
        Error(555, "in progress", 3),
        Ok(4),
    ]
    for op in ops:
        back = decode(*encode(op))
        if isinstance(op, Data):
            assert isinstance(back, Data)
            assert (back.options, back.originator_options, back.recipient_options) == (
                op.options, op.originator_options, op.recipient_options)
        else:
            assert back == op


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;">]>
<data content='#c'><originator identity='a@b.c'/><recipient identity='&lol2;@b.c'/></data>"""


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"<attach endpoint='fred@example.com'", ReplyCode.SYNTAX_ERROR),
        (BILLION_LAUGHS, ReplyCode.SYNTAX_ERROR),
        (b"<!DOCTYPE ok><ok />", ReplyCode.SYNTAX_ERROR),
        (b"<ok>&xxe;</ok>", ReplyCode.SYNTAX_ERROR),
        (b"<a>" * (DEFAULT_MAX_XML_DEPTH + 1) + b"</a>" * (DEFAULT_MAX_XML_DEPTH + 1),
         ReplyCode.SYNTAX_ERROR),
        (b"<hello />", ReplyCode.PARAMETER_SYNTAX_ERROR),
        (b"<attach endpoint='fred@example.com' />", ReplyCode.PARAMETER_SYNTAX_ERROR),
        (b"<attach endpoint='fred@example.com' transID='0' />",
         ReplyCode.PARAMETER_SYNTAX_ERROR),
        (b"<attach endpoint='fred' transID='1' />", ReplyCode.PARAMETER_INVALID),
        (b"<data content='cid:9@x'><originator identity='a@b.c'/>"
         b"<recipient identity='d@e.f'/></data>", ReplyCode.PARAMETER_SYNTAX_ERROR),
        (b"<data content='#c'><originator identity='a@b.c'/></data>",
         ReplyCode.PARAMETER_SYNTAX_ERROR),
        (b"<terminate code='99x' />", ReplyCode.PARAMETER_SYNTAX_ERROR),
    ],
)
def test_hostile_and_invalid_documents(body: bytes, code: ReplyCode) -> None:
    """Poorly-formed XML, DTDs and entities get 500; non-valid documents 501; bad names 553."""
    with pytest.raises(ApexpsError) as info:
        decode(BEEP_XML, body)
    assert info.value.code is code


def test_wrong_media_type_is_invalid() -> None:
    """A control document must be application/beep+xml."""
    with pytest.raises(ApexpsError) as info:
        decode("text/plain", b"<ok />")
    assert info.value.code is ReplyCode.PARAMETER_SYNTAX_ERROR


@settings(max_examples=300)
@given(st.sampled_from([BEEP_XML, "multipart/related; boundary=b", "text/plain"]),
       st.binary(max_size=400))
def test_arbitrary_bytes_decode_or_raise_coded_error(content_type: str, body: bytes) -> None:
    """Any bytes decode to an operation or raise an ApexpsError, never anything else."""
    try:
        decode(content_type, body)
    except ApexpsError as exc:
        assert 500 <= exc.code < 600


_pieces = st.sampled_from([
    b"<data content='cid:1@x'>", b"<data content='#c'>", b"</data>", b"<originator ",
    b"<recipient ", b"identity='a@b.c'", b"identity='a'", b"/>", b">", b"<option ",
    b"internal='x'", b"mustUnderstand='true'", b"<data-content Name='c'>", b"</data-content>",
    b"<attach ", b"endpoint='f@e.c' ", b"transID='1' ", b"<ok", b"<error code='550'>",
    b"</error>", b"&amp;", b"&lol;", b"<![CDATA[x]]>", b"<!DOCTYPE x>", b"\xff", b"\r\n",
    b"--b\r\n", b"--b--\r\n", b"Content-ID: <1@x>\r\n", b"Content-Type: application/beep+xml",
])


@settings(max_examples=300)
@given(st.sampled_from([BEEP_XML, "multipart/related; boundary=b"]),
       st.lists(_pieces, max_size=25).map(b"".join))
def test_xml_like_garbage_decodes_or_raises_coded_error(content_type: str, body: bytes) -> None:
    """Near-miss documents built from APEX fragments never raise a non-ApexpsError."""
    try:
        decode(content_type, body)
    except ApexpsError as exc:
        assert 500 <= exc.code < 600
