"""The canonical-layout fast paths of `decode` and `encode` against the general ones.

The fast decoder may decline anything; what it accepts, the general decoder must accept with an
equal result. The fast encoder must write the general encoder's octets.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.apex.codec import (
    BEEP_XML,
    DEFAULT_MAX_CONTENT_SIZE,
    DEFAULT_MAX_RECIPIENTS,
    DEFAULT_MAX_XML_SIZE,
    Data,
    Ok,
    Operation,
    Option,
    TargetHop,
    _decode_fast,
    _decode_general,
    _encode_fast,
    _encode_general,
    decode,
    encode,
    plain_data,
)
from adapters.apex.endpoint import Endpoint
from common.errors import ApexpsError, ReplyCode
from tests.apex.canonical_data import (
    datas,
    deterministic_ids,
    endpoints,
    mutated_entities,
    near_canonical_entities,
    plain_endpoints,
)

FRED, BARNEY = Endpoint.parse("fred@example.com"), Endpoint.parse("barney@example.com")


def _same_but_ref(back: Operation, data: Data) -> bool:
    return isinstance(back, Data) and (
        back.originator, back.recipients, back.content, back.content_type) == (
        data.originator, data.recipients, data.content, data.content_type)


# --- round trips ----------------------------------------------------------------------------


@settings(max_examples=400)
@given(datas(endpoints))
def test_round_trip_fast_equals_general(data: Data) -> None:
    """Whatever the endpoints hold, the general path gets the data back, and the fast path
    either declines or gets exactly the same."""
    content_type, body = encode(data)
    general = _decode_general(content_type, body)
    assert _same_but_ref(general, data)
    fast = _decode_fast(content_type, body)
    assert fast is None or fast == general
    assert decode(content_type, body) == general


@settings(max_examples=300)
@given(datas(plain_endpoints))
def test_canonical_data_takes_the_fast_path(data: Data) -> None:
    """A data of plain endpoints as encode() writes it is decoded by the fast path, to the
    general path's result: the data itself, content_ref aside."""
    content_type, body = encode(data)
    fast = _decode_fast(content_type, body)
    assert fast is not None
    assert fast == _decode_general(content_type, body)
    assert _same_but_ref(fast, data) and fast.content_ref is not None


def test_rfc_multipart_example_takes_the_fast_path() -> None:
    """RFC 3340 §4.1's example (a blank line after </data>, headers as printed) is canonical."""
    content_type = ('multipart/related; boundary="boundary"; start="<1@example.com>";'
                    ' type="application/beep+xml"')
    body = (b"--boundary\r\nContent-Type: application/beep+xml\r\nContent-ID: <1@example.com>"
            b"\r\n\r\n<data content='cid:2@example.com'>\r\n"
            b"    <originator identity='fred@example.com' />\r\n"
            b"    <recipient identity='barney@example.com' />\r\n</data>\r\n\r\n"
            b"--boundary\r\nContent-Type: image/gif\r\nContent-Transfer-Encoding: binary\r\n"
            b"Content-ID: <2@example.com>\r\n\r\n...\r\n--boundary--\r\n")
    fast = _decode_fast(content_type, body)
    assert fast == _decode_general(content_type, body)
    assert fast == Data(FRED, (BARNEY,), b"...", "image/gif", content_ref="cid:2@example.com")


def test_many_recipients_take_the_fast_path() -> None:
    """Recipients past the first are found too, in order, past the encoder's cache size."""
    recipients = tuple(Endpoint.parse(f"r{i}/s@example.com") for i in range(100))
    content_type, body = encode(Data(FRED, recipients, b"x"))
    fast = _decode_fast(content_type, body)
    assert fast is not None and fast.recipients == recipients
    assert fast == _decode_general(content_type, body)


# --- mutations ------------------------------------------------------------------------------

def _check_agreement(content_type: str, body: bytes) -> Operation | None:
    fast = _decode_fast(content_type, body)  # must not raise, whatever the input
    try:
        general = _decode_general(content_type, body)
    except ApexpsError:
        assert fast is None, "the fast path accepted what the general path refuses"
        return None
    assert fast is None or fast == general
    return fast


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_entities())
def test_mutations_are_declined_or_decoded_alike(mutated: tuple[str, bytes]) -> None:
    """Byte flips, insertions, deletions, truncations, case changes and Content-Type edits of
    an encoded data: the fast path declines, or agrees with the general path; when the
    general path refuses, the fast path has declined."""
    _check_agreement(*mutated)


@settings(max_examples=700)
@given(near_canonical_entities())
def test_near_canonical_edits_are_declined_or_decoded_alike(mutated: tuple[str, bytes]) -> None:
    """Edits that keep an entity at the edge of the canonical layout: the fast path declines,
    or agrees with the general path; when the general path refuses, the fast path declined."""
    _check_agreement(*mutated)


# --- guards, one by one ---------------------------------------------------------------------

_CT = ('multipart/related; boundary="B"; start="<s@x>"; type="application/beep+xml"')
_DOC = (b"<data content='cid:c@x'>\r\n    <originator identity='fred@example.com' />\r\n"
        b"    <recipient identity='barney@example.com' />\r\n</data>")
_CONTENT_HEAD = (b"Content-Type: image/gif\r\nContent-Transfer-Encoding: binary\r\n"
                 b"Content-ID: <c@x>\r\n\r\n")


def _entity(doc: bytes = _DOC, content: bytes = b"GIF89a", content_head: bytes = _CONTENT_HEAD,
            start_head: bytes = b"Content-Type: application/beep+xml\r\nContent-ID: <s@x>\r\n",
            tail: bytes = b"\r\n--B--\r\n") -> bytes:
    return (b"--B\r\n" + start_head + b"\r\n" + doc + b"\r\n--B\r\n" + content_head + content
            + tail)


def test_hand_made_entity_takes_the_fast_path() -> None:
    """The entity the guard cases below vary is itself accepted (so each case tests its guard)."""
    fast = _check_agreement(_CT, _entity())
    assert fast == Data(FRED, (BARNEY,), b"GIF89a", "image/gif", content_ref="cid:c@x")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        # the content holds the delimiter: the general path splits it there
        (_CT, _entity(content=b"GIF\r\n--B\r\n89a")),
        (_CT, _entity(content=b"GIF\r\n--Bxyz89a")),
        # empty content whose close delimiter starts in the headers' blank line
        (_CT, _entity(content=b"", content_head=_CONTENT_HEAD[:-2], tail=b"\r\n--B--\r\n")),
        (_CT, _entity(content=b"--B--\r\n", tail=b"")),
        # a delimiter closing the document early
        (_CT, _entity(doc=_DOC.replace(b"</data>", b"\r\n--B\r\n</data>"))),
        # Content-IDs that do not pair up, or need unquoting
        (_CT.replace("<s@x>", "<t@x>"), _entity()),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"<c@x>", b"<d@x>"))),
        (_CT.replace("s@x", "s%40x"), _entity(start_head=b"Content-Type: application/beep+xml"
                                               b"\r\nContent-ID: <s%40x>\r\n")),
        (_CT, _entity(doc=_DOC.replace(b"cid:c@x", b"cid:c%40x"))),
        # transfer encodings, header spellings, folding
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"binary", b"base64"))),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"binary", b"quoted-printable"))),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"Content-ID", b"Content-Id"))),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"image/gif", b"image/gif\r\n x=y"))),
        (_CT, _entity(content_head=_CONTENT_HEAD.replace(b"image/gif", b" image/gif"))),
        # markup, entities and declarations in the document
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr&apos;ed"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr&#65;ed"))),
        (_CT, _entity(doc=b"<!DOCTYPE data>" + _DOC)),
        (_CT, _entity(doc=_DOC.replace(b"\r\n</data>", b"<!-- c --></data>"))),
        (_CT, _entity(doc=_DOC.replace(b"\r\n</data>", b"x</data>"))),
        (_CT, _entity(doc=_DOC.replace(b"</data>", b"<option internal='x' /></data>"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr\x01ed"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr\xc2\x85ed"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr\xef\xbf\xbeed"))),
        (_CT, _entity(doc=_DOC.replace(b"fred", b"fr\xffed"))),
        (_CT, _entity(doc=_DOC.replace(b"\r\n", b"\x0c"))),
        # endpoints that do not parse
        (_CT, _entity(doc=_DOC.replace(b"fred@example.com", b"fred"))),
        (_CT, _entity(doc=_DOC.replace(b"barney@example.com", b"a/b/c@example.com"))),
        # the media type of the start part, the multipart parameters
        (_CT, _entity(start_head=b"Content-Type: text/plain\r\nContent-ID: <s@x>\r\n")),
        (_CT.replace("related", "Related"), _entity()),
        (_CT.replace('"B"', "B"), _entity()),
    ],
)
def test_guard_declines(content_type: str, body: bytes) -> None:
    """Each departure from the canonical layout is declined, whatever the general path
    makes of it."""
    assert _decode_fast(content_type, body) is None
    _check_agreement(content_type, body)


def test_limits_still_apply() -> None:
    """Too many recipients, too much content, too large a document: declined, and refused."""
    many = tuple(Endpoint.parse(f"r{i}@example.com") for i in range(DEFAULT_MAX_RECIPIENTS + 1))
    big_names = tuple(Endpoint.parse(f"{'r' * 300}{i}@example.com") for i in range(1000))
    for data, code in [
        (Data(FRED, many, b"x"), ReplyCode.PARAMETER_SYNTAX_ERROR),
        (Data(FRED, (BARNEY,), b"x" * (DEFAULT_MAX_CONTENT_SIZE + 1)),
         ReplyCode.PARAMETER_SYNTAX_ERROR),
        (Data(FRED, big_names, b"x"), ReplyCode.SYNTAX_ERROR),
    ]:
        content_type, body = encode(data)
        assert _decode_fast(content_type, body) is None
        with pytest.raises(ApexpsError) as info:
            decode(content_type, body)
        assert info.value.code is code
    assert len(encode(Data(FRED, big_names, b"x"))[1]) > DEFAULT_MAX_XML_SIZE


# --- encoding -------------------------------------------------------------------------------


_refs = st.none() | st.builds("cid:{}".format, st.text(
    st.characters(blacklist_categories=("Cs",), max_codepoint=0x17F), max_size=12))


def _outcome(encoder: Callable[[Data], object], data: Data) -> object:
    try:
        return encoder(data)
    except UnicodeEncodeError as exc:  # a Content-ID or content type that is not Latin-1
        return type(exc)


@settings(max_examples=400)
@given(datas(endpoints), _refs)
def test_fast_encode_writes_the_general_octets(data: Data, ref: str | None) -> None:
    """With the same ids drawn, the fast encoder's Content-Type and octets are the general
    encoder's (or it fails alike), for any endpoints and `cid:` reference."""
    data = Data(data.originator, data.recipients, data.content, data.content_type,
                content_ref=ref)
    with deterministic_ids():
        general = _outcome(_encode_general, data)
    with deterministic_ids():
        fast = _outcome(_encode_fast, data)
    assert fast == general


def test_fast_encode_of_many_recipients_and_its_scope() -> None:
    """Past the parties cache the octets are still the general ones; the originator's
    options, `#` and external references are left to the general encoder; `<ok />` is
    written once."""
    data = Data(FRED, tuple(Endpoint.parse(f"r{i}@example.com") for i in range(70)), b"x")
    with deterministic_ids():
        general = _encode_general(data)
    with deterministic_ids():
        assert _encode_fast(data) == general
    option = (Option("x"),)
    for declined in [Data(FRED, (BARNEY,), originator_options=option),
                     Data(FRED, (BARNEY,), b"<x/>", content_ref="#c"),
                     Data(FRED, (BARNEY,), content_ref="http://example.com/x")]:
        assert _encode_fast(declined) is None
        with deterministic_ids():
            general = _encode_general(declined)
        with deterministic_ids():
            assert encode(declined) == general
    assert encode(Ok()) == _encode_general(Ok()) == (BEEP_XML, b"<ok />")
    assert encode(Ok(3)) == _encode_general(Ok(3))


_options = st.lists(st.builds(
    Option, st.sampled_from(["dataHopping", "dataTiming", "x-y.z"]),
    st.none() | st.integers(1, 2**31 - 1), st.just(False), st.sampled_from(list(TargetHop)),
    st.booleans(), st.none() | st.sampled_from(["en", "i-default"]),
    st.sampled_from(["", "<dataHopping noMoreThan='8' reportErrors='true' />",
                     "<dataTiming noLaterThan='6000' />"])), min_size=1, max_size=3)


@settings(max_examples=300)
@given(datas(endpoints), _refs, _options, st.data())
def test_fast_encode_of_options_writes_the_general_octets(
        data: Data, ref: str | None, options: list[Option], draw: st.DataObject) -> None:
    """A data with options of its own (a broker's deliveries carry dataHopping) and per
    recipient (a selected delivery's InRe) is written by the fast encoder, to the general
    encoder's octets, and the general decoder reads the options back (where the reference is
    ours)."""
    per_recipient = draw.draw(st.none() | st.lists(
        st.lists(_options.flatmap(st.just), max_size=1).map(
            lambda found: tuple(found[0]) if found else ()),
        min_size=len(data.recipients), max_size=len(data.recipients)))
    data = Data(data.originator, data.recipients, data.content, data.content_type,
                options=tuple(options), content_ref=ref,
                recipient_options=tuple(per_recipient) if per_recipient else ())
    with deterministic_ids():
        general = _outcome(_encode_general, data)
    with deterministic_ids():
        fast = _outcome(_encode_fast, data)
    assert fast == general
    if isinstance(fast, tuple) and ref is None:  # (a random `cid:` may not be XML-safe)
        back = _decode_general(*fast)
        assert isinstance(back, Data)
        assert [(o.name, o.trans_id, o.target_hop) for o in back.options] == \
            [(o.name, o.trans_id, o.target_hop) for o in options]


@given(content=st.binary(max_size=64), content_type=st.sampled_from(["text/plain", "a/b"]),
       ref=st.sampled_from([None, "cid:1@x"]), many=st.booleans())
def test_plain_data_is_the_constructors_data(content: bytes, content_type: str,
                                             ref: str | None, many: bool) -> None:
    """`plain_data` (the fast decoder's and the client's constructor) builds a Data equal to,
    hashing like and as frozen as the dataclass constructor's."""
    recipients = (BARNEY, FRED) if many else (BARNEY,)
    fast = plain_data(FRED, recipients, content, content_type, ref)
    slow = Data(FRED, recipients, content, content_type, content_ref=ref)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    with pytest.raises(AttributeError):
        fast.content = b"changed"  # type: ignore[misc]


# --- a data's own options on the fast decoder (a broker's deliveries carry dataHopping) -------


_hop_like = st.builds(
    Option, st.sampled_from(["dataHopping", "dataTiming", "x1"]), st.integers(1, 999_999_999),
    st.just(False), st.sampled_from([TargetHop.ALL, TargetHop.THIS]), st.just(True),
    st.none(), st.sampled_from([
        "<dataHopping noMoreThan='8' reportErrors='true' />",
        "<dataHopping noMoreThan='255' />", "<x />", "<dataTiming noLaterThan='6000' />"]))


@settings(max_examples=300)
@given(datas(plain_endpoints), st.lists(_hop_like, min_size=1, max_size=3))
def test_a_datas_own_options_take_the_fast_path_to_the_general_result(
        data: Data, options: list[Option]) -> None:
    """A data with options of its own as encode() writes them (one empty element each, as a
    broker's dataHopping) is decoded by the fast path, equal to the general path's result."""
    data = Data(data.originator, data.recipients, data.content, data.content_type,
                options=tuple(options))
    content_type, body = encode(data)
    fast = _decode_fast(content_type, body)
    assert fast is not None
    general = _decode_general(content_type, body)
    assert fast == general
    assert all(o.content.endswith("/>") for o in fast.options)


def test_a_brokers_delivery_takes_the_fast_path() -> None:
    """The delivery the broker sends a plain subscriber (captured from the wire): its
    dataHopping option read as the general path reads it, content as lxml serializes it."""
    body = (b"--b1\r\nContent-Type: application/beep+xml\r\nContent-ID: <s1@apexps.invalid>\r\n"
            b"\r\n<data content='cid:c1@apexps.invalid'>\r\n"
            b"    <originator identity='apex=pubsub/t.q@bench.example' />\r\n"
            b"    <recipient identity='s@bench.example' />\r\n"
            b"    <option internal='dataHopping' targetHop='all' mustUnderstand='true'"
            b" transID='1'>\r\n        <dataHopping noMoreThan='8' reportErrors='true' />\r\n"
            b"    </option>\r\n</data>\r\n--b1\r\nContent-Type: application/xml\r\n"
            b"Content-Transfer-Encoding: binary\r\nContent-ID: <c1@apexps.invalid>\r\n\r\n"
            b"<q symbol='S1'/>\r\n--b1--\r\n")
    content_type = ('multipart/related; boundary="b1"; start="<s1@apexps.invalid>";'
                    ' type="application/beep+xml"')
    fast = _decode_fast(content_type, body)
    assert fast is not None and fast == _decode_general(content_type, body)
    assert fast.options == (Option("dataHopping", 1, False, TargetHop.ALL, True, None,
                                   '<dataHopping noMoreThan="8" reportErrors="true"/>'),)


@pytest.mark.parametrize("option", [
    # text or markup the general path keeps as content, and a form this one does not write
    b"<option internal='dataHopping' targetHop='all' mustUnderstand='true' transID='1'>"
    b"hops <dataHopping noMoreThan='8' /></option>",
    b"<option internal='dataHopping' targetHop='all' mustUnderstand='true' transID='1'>"
    b"<dataHopping noMoreThan=\"8\" /></option>",
    b"<option internal='dataHopping' targetHop='all' mustUnderstand='true' transID='1'>"
    b"<dataHopping noMoreThan='&#56;' /></option>",
    b"<option internal='dataHopping' targetHop='all' mustUnderstand='true' transID='0'>"
    b"<x /></option>",
    b"<option internal='dataHopping' targetHop='all' mustUnderstand='true' transID='1'>"
    b"<x /><y /></option>",
    b"<option internal='dataHopping' mustUnderstand='true' targetHop='all' transID='1'>"
    b"<x /></option>",
    b"<option internal='dataHopping' targetHop='all' mustUnderstand='true' transID='1' />",
    b"<option internal='a' targetHop='all' mustUnderstand='true' transID='1'><x /></option>"
    b"<data-content Name='c'>x</data-content>",
])
def test_other_option_forms_are_declined_or_read_alike(option: bytes) -> None:
    """Whatever else stands after the recipients, the fast path declines it or reads what
    the general path reads."""
    body = (b"--b1\r\nContent-Type: application/beep+xml\r\nContent-ID: <s1@x>\r\n"
            b"\r\n<data content='cid:c1@x'>\r\n    <originator identity='a@example.com' />\r\n"
            b"    <recipient identity='b@example.com' />\r\n    " + option +
            b"\r\n</data>\r\n--b1\r\nContent-Type: text/plain\r\n"
            b"Content-Transfer-Encoding: binary\r\nContent-ID: <c1@x>\r\n\r\nhi\r\n--b1--\r\n")
    content_type = ('multipart/related; boundary="b1"; start="<s1@x>";'
                    ' type="application/beep+xml"')
    fast = _decode_fast(content_type, body)
    try:
        general: object = _decode_general(content_type, body)
    except ApexpsError as exc:
        general = exc
    assert fast is None or fast == general


_ids = st.lists(st.text("abcXYZ019._-", min_size=1, max_size=8), min_size=1, max_size=3)


@settings(max_examples=300)
@given(datas(plain_endpoints), st.data())
def test_selected_deliveries_with_in_re_take_the_fast_path_to_the_general_result(
        data: Data, draw: st.DataObject) -> None:
    """A data whose recipients carry InRe options (some of them, or none) beside the data's
    own dataHopping, as encode() writes a selected delivery, is decoded by the fast path,
    equal to the general path's result."""
    from adapters.apex.inre import in_re_option

    per_recipient = tuple(draw.draw(st.none() | _ids.map(lambda i: (in_re_option(tuple(i)),)))
                          or () for _ in data.recipients)
    hop = draw.draw(st.lists(_hop_like, max_size=1))
    data = Data(data.originator, data.recipients, data.content, data.content_type,
                options=tuple(hop), recipient_options=per_recipient)
    content_type, body = encode(data)
    fast = _decode_fast(content_type, body)
    assert fast is not None
    assert fast == _decode_general(content_type, body)


@pytest.mark.parametrize("inside", [
    b"<subscription-id>1</subscription-id>\r\n            <subscription-id>2</subscription-id>",
    b"<subscription-id>1</subscription-id>\r<subscription-id>2</subscription-id>\n",
    b"<subscription-id> 1</subscription-id>",
    b"<subscription-id>1&amp;</subscription-id>",
    b"<subscription-id a='1'>1</subscription-id>",
    b"x<subscription-id>1</subscription-id>",
    b"<subscription-id>1</subscription-id>x",
    b"<subscription-id>1</other-id>",
    b"<!-- c --><subscription-id>1</subscription-id>",
])
def test_in_re_forms_are_read_alike_or_declined(inside: bytes) -> None:
    """Line ends inside the option are read as XML reads them; anything else than plain
    elements of plain text is declined or read as the general path reads it."""
    body = (b"--b1\r\nContent-Type: application/beep+xml\r\nContent-ID: <s1@x>\r\n"
            b"\r\n<data content='cid:c1@x'>\r\n    <originator identity='a@example.com' />\r\n"
            b"    <recipient identity='b@example.com'>\r\n        <option internal='InRe'>\r\n"
            b"            " + inside + b"\r\n        </option>\r\n    </recipient>\r\n"
            b"    <recipient identity='c@example.com' />\r\n</data>\r\n--b1\r\n"
            b"Content-Type: text/plain\r\nContent-Transfer-Encoding: binary\r\n"
            b"Content-ID: <c1@x>\r\n\r\nhi\r\n--b1--\r\n")
    content_type = ('multipart/related; boundary="b1"; start="<s1@x>";'
                    ' type="application/beep+xml"')
    fast = _decode_fast(content_type, body)
    try:
        general: object = _decode_general(content_type, body)
    except ApexpsError as exc:
        general = exc
    assert fast is None or fast == general
    if inside.startswith(b"<subscription-id>1</subscription-id>\r"):
        assert fast is not None  # the line ends are ours to read
