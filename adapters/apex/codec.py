"""The APEX profile's vocabulary (RFC 3340 §4.4, DTD §9.1): BEEP payloads <-> frozen dataclasses.

Theory of operation
-------------------
MSGs on an APEX channel carry `attach`, `bind`, `terminate` or `data`; RPYs carry `ok`, ERRs
`error` (§8.1). `decode(content_type, body)` turns a received payload into one of the dataclasses
below, `encode(operation)` turns one back into `(content_type, body)` for
`BeepConnection.send_msg()`. A `data` whose content is arbitrary octets travels as
`multipart/related` with the control document as the start part and the content referenced by a
`cid:` URL; XML content may instead sit inside the control document as `data-content`,
referenced by `#Name` (§4.1). No lxml object leaves this module.

Decoding is hardened the way `adapters.beep._management` is (an APEX channel is reachable by any
peer that completed a greeting): the XML is bounded (`DEFAULT_MAX_XML_SIZE`) before lxml sees it,
any DOCTYPE or ENTITY declaration is refused outright, the parser resolves no entity, loads no
DTD and fetches nothing, and the tree's depth is bounded (`DEFAULT_MAX_XML_DEPTH`). XML that does
not parse is 500 (`SyntaxError_`, "poorly-formed XML"); XML that parses but does not fit the DTD
is 501 (`ParameterSyntaxError`, "non-valid XML"); an endpoint that does not parse is 553. Every
other failure is a bug: `decode` raises nothing but `ApexpsError`.

Encoding reproduces the RFC's layout (single-quoted attributes, " />", four-space indentation),
so the RFC's examples are golden test data.

Data is most of the traffic, and nearly all of it arrives in the layout `encode` writes: `decode`
first tries `_canonical`, which reads that layout with a few regexes and no lxml and declines
anything else, and only then the general path above. The fast path may only accept what the
general one accepts, with an equal result (tests/apex/test_codec_fast.py holds it to that).
`encode` writes a data without options the same way, its parties' XML cached.

Why one module of this length: the four operations and two replies of RFC 3340 share one
entity layout and one set of checks; the canonical-layout fast path and the multipart reader
are in modules of their own.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import unquote

from lxml import etree

from common.errors import ApexpsError, ParameterSyntaxError, SyntaxError_
from common.xml_safe import UnsafeXml, checked_attributes, parse_hardened

from ._canonical import FAST_CONTENT_TYPE_PREFIX, OptionFields, match_data, write_data
from ._multipart import (
    MULTIPART_RELATED,
    Part,
    content_type_params,
    decode_related,
    encode_related,
    new_boundary,
    new_content_id,
    new_data_ids,
)
from .endpoint import Endpoint

__all__ = [
    "APEX_PROFILE",
    "BEEP_XML",
    "DEFAULT_MAX_CONTENT_SIZE",
    "DEFAULT_MAX_RECIPIENTS",
    "DEFAULT_MAX_XML_DEPTH",
    "DEFAULT_MAX_XML_SIZE",
    "Attach",
    "Bind",
    "Data",
    "Error",
    "Ok",
    "Operation",
    "Option",
    "TargetHop",
    "Terminate",
    "decode",
    "encode",
    "plain_data",
]

#: RFC 3340 §4.2: the profile URI.
APEX_PROFILE = "http://iana.org/beep/APEX"
#: The media type of every APEX control document.
BEEP_XML = "application/beep+xml"
#: A control document is a handful of elements; 256 KiB leaves room for thousands of recipients
#: or a sizeable `data-content` and still stops a multi-megabyte tree from being built.
DEFAULT_MAX_XML_SIZE = 256 * 1024
#: Deepest element nesting accepted. The DTD needs 3 (data/recipient/option); `data-content` and
#: `option` may hold ANY, so leave room, but stop pathological nesting well before libxml2's 256.
DEFAULT_MAX_XML_DEPTH = 32
#: Largest content of one data operation: BEEP's DEFAULT_MAX_MESSAGE_SIZE bounds the message.
DEFAULT_MAX_CONTENT_SIZE = 4 * 1024 * 1024
#: Recipients of one data element; each costs a delivery.
DEFAULT_MAX_RECIPIENTS = 1024

_NUMBER = re.compile(r"[0-9]{1,10}")
_CODE = re.compile(r"[1-5][0-9][0-9]")
_NMTOKEN = re.compile(r"[\w.:-]+")
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_MAX_ID = 2**31 - 1




class TargetHop(StrEnum):
    """RFC 3340 §5: which relays process an option."""

    #: "the option applies to this relay, and must be removed prior to transmitting".
    THIS = "this"
    #: "applies to this relay, only if the relay will transmit ... directly to the recipient".
    FINAL = "final"
    #: "the option applies to this relay and is retained for the next".
    ALL = "all"


@dataclass(frozen=True, slots=True)
class Option:
    """An `option` element (§5): `name` is the `internal` NMTOKEN, or the `external` URI.

    `content` is the element's inner XML (e.g. RFC 3342's `<dataTiming noLaterThan='6000' />`),
    kept verbatim so an option this relay does not interpret travels on unchanged.
    """

    name: str
    trans_id: int | None = None
    external: bool = False
    target_hop: TargetHop = TargetHop.FINAL
    must_understand: bool = False
    localize: str | None = None
    content: str = ""


@dataclass(frozen=True, slots=True)
class Attach:
    """Attach to the relaying mesh as `endpoint` (§4.4.1)."""

    endpoint: Endpoint
    trans_id: int
    options: tuple[Option, ...] = ()


@dataclass(frozen=True, slots=True)
class Bind:
    """Serve as a relay for the administrative domain `relay` (§4.4.2)."""

    relay: str
    trans_id: int
    options: tuple[Option, ...] = ()


@dataclass(frozen=True, slots=True)
class Terminate:
    """Release the attachment or binding made by `trans_id` (0: all of them) (§4.4.3)."""

    trans_id: int = 0
    code: int = 250
    text: str = ""
    lang: str | None = None


@dataclass(frozen=True, slots=True)
class Data:
    """Data from `originator` to `recipients` (§4.4.4).

    `content` is the octets the `content` URI-reference names; `content_ref` that reference
    (None: a fresh `cid:` is made when encoding; "#Name": `content` is XML carried in a
    `data-content` element; any other absolute URI is kept but not fetched, `content` empty).
    `recipient_options`, when not empty, holds each recipient's options, in order.
    """

    originator: Endpoint
    recipients: tuple[Endpoint, ...]
    content: bytes = b""
    content_type: str = "application/octet-stream"
    options: tuple[Option, ...] = ()
    originator_options: tuple[Option, ...] = ()
    recipient_options: tuple[tuple[Option, ...], ...] = ()
    content_ref: str | None = None

    def __post_init__(self) -> None:
        if not self.recipients:
            raise ParameterSyntaxError("a data element needs one or more recipients")
        if self.recipient_options and len(self.recipient_options) != len(self.recipients):
            raise ParameterSyntaxError("recipient_options must match recipients one to one")

    def options_of(self, index: int) -> tuple[Option, ...]:
        """The per-recipient options of recipient `index`."""
        return self.recipient_options[index] if self.recipient_options else ()

    def for_recipients(self, indexes: list[int]) -> Data:
        """The same data addressed to a subset of its recipients (§4.4.4.1 step 5.3)."""
        opts = tuple(self.options_of(i) for i in indexes) if self.recipient_options else ()
        return Data(self.originator, tuple(self.recipients[i] for i in indexes), self.content,
                    self.content_type, self.options, self.originator_options, opts,
                    self.content_ref)


# A data decoded or sent on the common path is put together from its slots: a frozen
# dataclass's __init__ goes through object.__setattr__ once per field (eight here) and then
# __post_init__, which cost as much as the rest of decoding it. `plain_data` is for callers that
# know what `__post_init__` checks to hold: recipients, and no per-recipient options.
_set_data_fields = tuple(Data.__dict__[name].__set__ for name in (
    "originator", "recipients", "content", "content_type", "options", "originator_options",
    "recipient_options", "content_ref"))
_set_options, _set_recipient_options = _set_data_fields[4], _set_data_fields[6]


def plain_data(originator: Endpoint, recipients: tuple[Endpoint, ...], content: bytes,
               content_type: str, content_ref: str | None = None) -> Data:
    """`Data(originator, recipients, content, content_type, content_ref=content_ref)`, without
    options, for one or more `recipients` (not checked: the caller's to ensure)."""
    data: Data = object.__new__(Data)
    set_originator, set_recipients, set_content, set_type, set_options, set_originator_options, \
        set_recipient_options, set_ref = _set_data_fields
    set_originator(data, originator)
    set_recipients(data, recipients)
    set_content(data, content)
    set_type(data, content_type)
    set_options(data, ())
    set_originator_options(data, ())
    set_recipient_options(data, ())
    set_ref(data, content_ref)
    return data


@dataclass(frozen=True, slots=True)
class Ok:
    """Positive reply (RFC 3080 `ok`; APEX's DTD gives it no attributes, `trans_id` is an
    apexps extension, decoded if present and encoded only when set)."""

    trans_id: int | None = None


@dataclass(frozen=True, slots=True)
class Error:
    """Negative reply: a three-digit code (§10) and a diagnostic."""

    code: int
    text: str = ""
    trans_id: int | None = None
    lang: str | None = field(default=None)

    def exception(self) -> ApexpsError:
        """The `ApexpsError` this reply code stands for."""
        return ApexpsError.for_code(self.code, self.text or None)

    @classmethod
    def from_exception(cls, exc: ApexpsError, trans_id: int | None = None) -> Error:
        return cls(int(exc.code), str(exc), trans_id)


Operation = Attach | Bind | Terminate | Data | Ok | Error


# --- decoding -------------------------------------------------------------------------------


def _attrs(elem: etree._Element, allowed: set[str], required: set[str]) -> dict[str, str]:
    return checked_attributes(elem, allowed, required, ParameterSyntaxError)


def _number(value: str, what: str, minimum: int = 1) -> int:
    if not _NUMBER.fullmatch(value) or not minimum <= int(value) <= _MAX_ID:
        raise ParameterSyntaxError(f"{what} {value[:20]!r} is not a number in"
                                   f" {minimum}..{_MAX_ID}")
    return int(value)


def _code(value: str) -> int:
    if not _CODE.fullmatch(value):
        raise ParameterSyntaxError(f"reply code {value[:20]!r} is not three digits")
    return int(value)


def _text_only(elem: etree._Element) -> str:
    if len(elem):
        raise ParameterSyntaxError(f"<{elem.tag}> may contain only character data")
    return elem.text or ""


def _no_text(elem: etree._Element) -> None:
    if (elem.text or "").strip() or any((c.tail or "").strip() for c in elem):
        raise ParameterSyntaxError(f"<{elem.tag}> may not contain character data")


def _option(elem: etree._Element) -> Option:
    attrs = _attrs(elem, {"internal", "external", "targetHop", "mustUnderstand", "transID",
                          "localize"}, set())
    internal, external = attrs.get("internal", ""), attrs.get("external", "")
    if bool(internal) == bool(external):
        raise ParameterSyntaxError("exactly one of 'internal' and 'external' names an option")
    if internal and not _NMTOKEN.fullmatch(internal):
        raise ParameterSyntaxError(f"option name {internal[:40]!r} is not an NMTOKEN")
    if external and ":" not in external:
        raise ParameterSyntaxError("an external option is an absolute URI (RFC 3340 §5)")
    try:
        hop = TargetHop(attrs.get("targetHop", "final"))
    except ValueError:
        raise ParameterSyntaxError("targetHop must be this, final or all") from None
    must = attrs.get("mustUnderstand", "false")
    if must not in ("true", "false"):
        raise ParameterSyntaxError("mustUnderstand must be true or false")
    trans_id = _number(attrs["transID"], "transID") if "transID" in attrs else None
    return Option(internal or external, trans_id, bool(external), hop, must == "true",
                  attrs.get("localize"), _inner_xml(elem).decode("utf-8"))


def _options(elems: list[etree._Element], where: str) -> tuple[Option, ...]:
    for elem in elems:
        if elem.tag != "option":
            raise ParameterSyntaxError(f"unexpected element <{str(elem.tag)[:40]}> in <{where}>")
    return tuple(_option(e) for e in elems)


def _endpoint(value: str) -> Endpoint:
    return Endpoint.parse(value)


def _parse_xml(body: bytes) -> etree._Element:
    try:
        return parse_hardened(body, max_bytes=DEFAULT_MAX_XML_SIZE,
                              max_depth=DEFAULT_MAX_XML_DEPTH, what="control document")
    except UnsafeXml as exc:
        raise SyntaxError_(str(exc)) from None


def _inner_xml(elem: etree._Element) -> bytes:
    out = (elem.text or "").encode("utf-8")
    for child in elem:
        out += etree.tostring(child, encoding="utf-8", with_tail=True)
    return out.strip()


def _data(root: etree._Element, parts: list[Part]) -> Data:
    attrs = _attrs(root, {"content"}, {"content"})
    _no_text(root)
    children = list(root)
    if len(children) < 2 or children[0].tag != "originator":
        raise ParameterSyntaxError("<data> starts with <originator>, then <recipient>s")
    origin = children[0]
    _no_text(origin)
    originator = _endpoint(_attrs(origin, {"identity"}, {"identity"})["identity"])
    originator_options = _options(list(origin), "originator")
    recipients: list[Endpoint] = []
    per_recipient: list[tuple[Option, ...]] = []
    index = 1
    while index < len(children) and children[index].tag == "recipient":
        elem = children[index]
        _no_text(elem)
        recipients.append(_endpoint(_attrs(elem, {"identity"}, {"identity"})["identity"]))
        per_recipient.append(_options(list(elem), "recipient"))
        index += 1
    if not recipients:
        raise ParameterSyntaxError("<data> needs one or more <recipient> elements")
    if len(recipients) > DEFAULT_MAX_RECIPIENTS:
        raise ParameterSyntaxError(f"more than {DEFAULT_MAX_RECIPIENTS} recipients")
    rest = children[index:]
    holder = rest.pop() if rest and rest[-1].tag == "data-content" else None
    options = _options(rest, "data")
    ref = attrs["content"]
    content, content_type = b"", "application/octet-stream"
    if ref.startswith("#"):
        if holder is None:
            raise ParameterSyntaxError(f"content {ref[:60]!r} names no <data-content>")
        name = _attrs(holder, {"Name"}, {"Name"})["Name"]
        if name != ref[1:]:
            raise ParameterSyntaxError(f"content {ref[:60]!r} names no <data-content>")
        content, content_type = _inner_xml(holder), BEEP_XML
    elif holder is not None:
        raise ParameterSyntaxError("<data-content> present but content does not reference it")
    elif ref.startswith("cid:"):
        cid = unquote(ref[4:])
        found = [p for p in parts if p.content_id == cid]
        if not found:
            raise ParameterSyntaxError(f"content {ref[:60]!r} names no body part")
        content, content_type = found[0].body, found[0].content_type
    elif ":" not in ref:
        raise ParameterSyntaxError("content is an absolute URI or a #fragment (RFC 3340 §4.1)")
    if len(content) > DEFAULT_MAX_CONTENT_SIZE:
        raise ParameterSyntaxError(f"content exceeds {DEFAULT_MAX_CONTENT_SIZE} octets")
    has_opts = any(per_recipient)
    return Data(originator, tuple(recipients), content, content_type, options,
                originator_options, tuple(per_recipient) if has_opts else (), ref)


def _operation(root: etree._Element, parts: list[Part]) -> Operation:
    tag = root.tag
    if tag == "attach":
        attrs = _attrs(root, {"endpoint", "transID"}, {"endpoint", "transID"})
        _no_text(root)
        return Attach(_endpoint(attrs["endpoint"]), _number(attrs["transID"], "transID"),
                      _options(list(root), "attach"))
    if tag == "bind":
        attrs = _attrs(root, {"relay", "transID"}, {"relay", "transID"})
        _no_text(root)
        relay = attrs["relay"]
        Endpoint("x", relay)  # validates the domain the same way (553 if not one)
        return Bind(relay.lower(), _number(attrs["transID"], "transID"),
                    _options(list(root), "bind"))
    if tag == "terminate":
        attrs = _attrs(root, {"code", "transID", _XML_LANG}, set())
        return Terminate(_number(attrs.get("transID", "0"), "transID", 0),
                         _code(attrs.get("code", "250")), _text_only(root).strip(),
                         attrs.get(_XML_LANG))
    if tag == "data":
        return _data(root, parts)
    if tag == "ok":
        attrs = _attrs(root, {"transID"}, set())
        if len(root) or (root.text or "").strip():
            raise ParameterSyntaxError("<ok> is empty")
        return Ok(_number(attrs["transID"], "transID") if "transID" in attrs else None)
    if tag == "error":
        attrs = _attrs(root, {"code", "transID", _XML_LANG}, {"code"})
        trans_id = _number(attrs["transID"], "transID") if "transID" in attrs else None
        return Error(_code(attrs["code"]), _text_only(root).strip(), trans_id,
                     attrs.get(_XML_LANG))
    raise ParameterSyntaxError(f"<{str(tag)[:40]}> is not an APEX element")


#: Replies whose octets are known in advance and make up most of the traffic (every data a
#: peer accepts is answered with exactly this): decoded without the XML parser.
_KNOWN_REPLIES: dict[bytes, Operation] = {b"<ok />": Ok()}


def decode(content_type: str, body: bytes) -> Operation:
    """Decode one APEX payload (a BEEP message's Content-Type and body).

    Raises:
        ApexpsError: 500 poorly-formed, 501 not valid, 553 a bad endpoint, 504 an unsupported
            transfer encoding. Nothing else, whatever `body` holds.
    """
    if content_type == BEEP_XML and (known := _KNOWN_REPLIES.get(body)) is not None:
        return known
    if (content_type.startswith(FAST_CONTENT_TYPE_PREFIX)
            and (data := _decode_fast(content_type, body)) is not None):
        return data
    return _decode_general(content_type, body)


def _decode_fast(content_type: str, body: bytes) -> Data | None:
    """A data in the canonical layout (`_canonical`), or None: then `_decode_general` decides.

    Accepts only what `_decode_general` accepts, with an equal result (tests/apex/
    test_codec_fast.py holds it to that); raises nothing.
    """
    layout = match_data(content_type, body, DEFAULT_MAX_XML_SIZE)
    if (layout is None or len(layout.recipients) > DEFAULT_MAX_RECIPIENTS
            or len(layout.content) > DEFAULT_MAX_CONTENT_SIZE):
        return None
    # match_data found at least one recipient, and options (if any) only of the data's own
    data = plain_data(layout.originator, layout.recipients, layout.content,
                      layout.content_type, layout.content_ref)
    if layout.options:
        _set_options(data, _fast_options(layout.options))
    if layout.recipient_options:
        _set_recipient_options(data, tuple(_fast_options(o) for o in layout.recipient_options))
    return data


def _fast_options(fields: tuple[OptionFields, ...]) -> tuple[Option, ...]:
    return tuple(Option(name, trans_id, False, TargetHop(hop), must, None, content)
                 for name, trans_id, hop, must, content in fields)


def _decode_general(content_type: str, body: bytes) -> Operation:
    """`decode` for every layout: the MIME parser, then the hardened XML parser."""
    try:
        media, _ = content_type_params(content_type)
        parts: list[Part] = []
        if media == MULTIPART_RELATED:
            start, parts = decode_related(content_type, body)
            media, _ = content_type_params(start.content_type)
            body = start.body
        if media not in (BEEP_XML, "text/xml", "application/xml"):
            raise ParameterSyntaxError(f"APEX control documents are {BEEP_XML},"
                                       f" not {media[:60]!r}")
        return _operation(_parse_xml(body), parts)
    except (RecursionError, MemoryError, UnicodeError) as exc:
        raise SyntaxError_(f"undecodable payload: {type(exc).__name__}") from None


# --- encoding -------------------------------------------------------------------------------


def _esc(value: str) -> str:
    return (value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("'", "&apos;").replace("\r", "&#13;"))


def _lang(lang: str | None) -> str:
    return "" if lang is None else f" xml:lang='{_esc(lang)}'"


def _option_xml(option: Option, indent: str) -> str:
    attrs = f" {'external' if option.external else 'internal'}='{_esc(option.name)}'"
    if option.target_hop is not TargetHop.FINAL or option.must_understand:
        attrs += f" targetHop='{option.target_hop.value}'"
    if option.must_understand:
        attrs += " mustUnderstand='true'"
    if option.trans_id is not None:
        attrs += f" transID='{option.trans_id}'"
    if option.localize is not None:
        attrs += f" localize='{_esc(option.localize)}'"
    if option.content:
        return f"{indent}<option{attrs}>\r\n{indent}    {option.content}\r\n{indent}</option>\r\n"
    return f"{indent}<option{attrs} />\r\n"


def _container(tag: str, attrs: str, options: tuple[Option, ...], indent: str) -> str:
    if not options:
        return f"{indent}<{tag}{attrs} />\r\n"
    inner = "".join(_option_xml(o, indent + "    ") for o in options)
    return f"{indent}<{tag}{attrs}>\r\n{inner}{indent}</{tag}>\r\n"


def _diagnostic(tag: str, attrs: str, text: str) -> str:
    return f"<{tag}{attrs}>{_esc(text)}</{tag}>" if text else f"<{tag}{attrs} />"


def encode_xml(operation: Operation, content_ref: str | None = None) -> str:
    """The control document alone (for `data`, `content_ref` overrides `operation`'s)."""
    if isinstance(operation, Attach | Bind):
        tag, name = ("attach", "endpoint") if isinstance(operation, Attach) else ("bind", "relay")
        value = str(operation.endpoint) if isinstance(operation, Attach) else operation.relay
        attrs = f" {name}='{_esc(value)}' transID='{operation.trans_id}'"
        return _container(tag, attrs, operation.options, "").rstrip("\r\n")
    if isinstance(operation, Terminate):
        attrs = f" transID='{operation.trans_id}'"
        if operation.code != 250:
            attrs = f" code='{operation.code}'" + attrs
        return _diagnostic("terminate", attrs + _lang(operation.lang), operation.text)
    if isinstance(operation, Ok):
        return "<ok />" if operation.trans_id is None else f"<ok transID='{operation.trans_id}' />"
    if isinstance(operation, Error):
        attrs = f" code='{operation.code}'"
        if operation.trans_id is not None:
            attrs += f" transID='{operation.trans_id}'"
        return _diagnostic("error", attrs + _lang(operation.lang), operation.text)
    ref = content_ref or operation.content_ref or ""
    lines = [f"<data content='{_esc(ref)}'>\r\n",
             _container("originator", f" identity='{_esc(str(operation.originator))}'",
                        operation.originator_options, "    ")]
    lines += [_container("recipient", f" identity='{_esc(str(r))}'", operation.options_of(i),
                         "    ") for i, r in enumerate(operation.recipients)]
    lines += [_option_xml(o, "    ") for o in operation.options]
    if ref.startswith("#"):
        lines.append(f"    <data-content Name='{_esc(ref[1:])}'>\r\n"
                     f"{operation.content.decode('utf-8')}\r\n    </data-content>\r\n")
    lines.append("</data>")
    return "".join(lines)


#: The reply to nearly every operation, written once.
_OK = (BEEP_XML, b"<ok />")
#: Parties of up to this many recipients have their XML cached (`_parties_xml`); more are rare
#: and would make the cache's memory depend on what peers send.
_MAX_CACHED_PARTIES = 64


def _parties(originator: Endpoint, recipients: tuple[Endpoint, ...]) -> bytes:
    lines = [_container("originator", f" identity='{_esc(str(originator))}'", (), "    ")]
    lines += [_container("recipient", f" identity='{_esc(str(r))}'", (), "    ")
              for r in recipients]
    return "".join(lines).encode("utf-8")


#: The `originator` and `recipient` lines of a data without options: the same few parties
#: send most data, and their escaping and formatting was a third of encoding one.
_parties_xml = functools.lru_cache(maxsize=1024)(_parties)
#: The parties last written, by identity: a client sends data after data with the same
#: originator and recipients objects, and `is` costs less than hashing endpoints for the cache.
_recent_parties: list[tuple[Endpoint | None, tuple[Endpoint, ...] | None, bytes]] = [
    (None, None, b"")]


def encode(operation: Operation) -> tuple[str, bytes]:
    """`(content_type, body)` of the BEEP message carrying `operation`."""
    if type(operation) is Ok and operation.trans_id is None:
        return _OK
    if type(operation) is Data and (fast := _encode_fast(operation)) is not None:
        return fast
    return _encode_general(operation)


def _encode_fast(data: Data) -> tuple[str, bytes] | None:
    """`_encode_general(data)` for a data carried in a `cid:` part (none on the originator);
    else None.

    The same octets, the same Content-IDs and boundary drawn in the same order; only the
    parties' XML comes from a cache and the entity is written in one piece. Options are
    written as `encode_xml` writes them, by the same functions: a broker's every delivery
    carries its dataHopping option, and a selected one an InRe per recipient; both took the
    general path for it.
    """
    if data.originator_options:
        return None
    ref = data.content_ref
    if ref is None:
        cid, start_id, boundary = new_data_ids()
        xml_ref = cid  # ours: hex digits and a domain, nothing to escape
    elif ref.startswith("cid:"):
        cid = unquote(ref[4:])
        xml_ref = _esc(cid)
        start_id, boundary = new_content_id(), new_boundary()
    else:
        return None
    originator, recipients = data.originator, data.recipients
    recent = _recent_parties[0]
    if data.recipient_options:  # different with every data (the ids it satisfied): no cache
        parties = "".join([
            _container("originator", f" identity='{_esc(str(originator))}'", (), "    "),
            *(_container("recipient", f" identity='{_esc(str(r))}'", data.options_of(i),
                         "    ") for i, r in enumerate(recipients))]).encode("utf-8")
    elif recent[0] is originator and recent[1] is recipients:
        parties = recent[2]
    else:
        parties = (_parties_xml(originator, recipients)
                   if len(recipients) <= _MAX_CACHED_PARTIES
                   else _parties(originator, recipients))
        _recent_parties[0] = (originator, recipients, parties)
    if data.options:
        parties += "".join(_option_xml(o, "    ") for o in data.options).encode("utf-8")
    return write_data(parties, data.content_type, data.content, xml_ref=xml_ref,
                      content_id=cid, start_id=start_id, boundary=boundary)


def _encode_general(operation: Operation) -> tuple[str, bytes]:
    """`encode` for every operation."""
    if not isinstance(operation, Data):
        return BEEP_XML, encode_xml(operation).encode("utf-8")
    ref = operation.content_ref
    if ref is not None and ref.startswith("#"):
        _parse_xml(b"<x>" + operation.content + b"</x>")  # refuse to send broken XML
        return BEEP_XML, encode_xml(operation).encode("utf-8")
    if ref is not None and not ref.startswith("cid:"):
        return BEEP_XML, encode_xml(operation).encode("utf-8")  # external, not carried
    cid = unquote(ref[4:]) if ref else new_content_id()
    xml = encode_xml(operation, f"cid:{cid}").encode("utf-8")
    start = Part(BEEP_XML, new_content_id(), xml)
    return encode_related(start, [Part(operation.content_type, cid, operation.content)])
