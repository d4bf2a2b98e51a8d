"""The channel-zero vocabulary (RFC 3080 §2.3.1, DTD in §7.1): XML <-> frozen dataclasses.

Theory of operation
-------------------
Channel zero speaks `application/beep+xml`: MSGs carry `start` or `close`, RPYs carry `greeting`,
`profile` or `ok`, ERRs carry `error`. `parse_management()` turns a payload into one of the
dataclasses below and `serialize()` turns one back into bytes. No lxml object leaves this module.

Parsing is hardened because this is the first thing an unauthenticated peer reaches:

* the payload is bounded (`max_size`) before lxml sees it;
* any DOCTYPE or ENTITY declaration is refused outright -- even inside CDATA, which costs a
  false positive nobody sends and saves context-sensitive scanning; no DTD is loaded, no entity
  is resolved, nothing is fetched (`XMLParser(resolve_entities=False, no_network=True,
  load_dtd=False)`), so neither an XML bomb nor an external entity can work;
* the shape is validated against the DTD by hand: unknown elements, attributes or children are
  refused. XML that does not parse is a 500 ("general syntax error", e.g. poorly-formed XML);
  XML that parses but is not valid is a 501 ("syntax error in parameters", e.g. non-valid XML),
  the RFC 3080 §8 distinction.

Serialization reproduces the RFC's own layout byte for byte (single-quoted attributes, " />",
three-space indentation, CRLF line ends), so the examples in RFC 3080 are golden test data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from lxml import etree

from common.errors import ReplyCode
from common.xml_safe import UnsafeXml, checked_attributes, parse_hardened

from ._config import MAX_NUMBER
from ._errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "MAX_PROFILE_CONTENT",
    "Close",
    "Error",
    "Greeting",
    "ManagementMessage",
    "Ok",
    "Profile",
    "ProfileEncoding",
    "Start",
    "parse_management",
    "serialize",
]

#: RFC 3080 §2.3.1.2: profile content "must be no longer than 4K octets in length".
MAX_PROFILE_CONTENT = 4096
_CODE = re.compile(r"[1-5][0-9][0-9]")  # DTD: XYZ, "[1-5][0-9][0-9]"
_NUMBER = re.compile(r"0|[1-9][0-9]{0,9}")
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"


class ProfileEncoding(StrEnum):
    """The `encoding` attribute of a `profile` element (RFC 3080 §2.3.1.2)."""

    #: The content is the initialization message itself.
    NONE = "none"
    #: The content is base64 of the initialization message.
    BASE64 = "base64"


def _check_text(value: str, what: str) -> None:
    # Characters XML 1.0 cannot carry at all; refusing them here beats emitting broken XML.
    if any(ord(c) < 0x20 and c not in "\t\r\n" for c in value):
        raise LocalProtocolError(f"{what} contains control characters XML cannot carry")


@dataclass(frozen=True, slots=True)
class Profile:
    """A `profile` element: a profile URI and optional initialization content (piggybacking)."""

    uri: str
    content: str = ""
    encoding: ProfileEncoding = ProfileEncoding.NONE

    def __post_init__(self) -> None:
        if not self.uri or any(c.isspace() for c in self.uri):
            raise LocalProtocolError(f"profile URI {self.uri!r} is empty or contains spaces")
        _check_text(self.content, "profile content")
        if len(self.content.encode("utf-8")) > MAX_PROFILE_CONTENT:
            raise LocalProtocolError("profile content exceeds 4K octets (RFC 3080 §2.3.1.2)")


@dataclass(frozen=True, slots=True)
class Greeting:
    """`greeting`: the profiles we can serve, optional feature and language tokens (§2.3.1.1)."""

    profiles: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    localize: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Start:
    """`start`: create channel `number` with one of `profiles` (§2.3.1.2)."""

    number: int
    profiles: tuple[Profile, ...]
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """`close`: close channel `number`, or the whole session when it is 0 (§2.3.1.3)."""

    number: int
    code: int = 200
    text: str = ""
    lang: str | None = None
    #: Write `number='0'` for a session release too. The DTD defaults it and RFC 3080 §2.4's
    #: example leaves it out (so by default we do), but beepcore-java answers the implied form
    #: with 501 "bad channel number". Not part of what a close says, so not compared.
    explicit_number: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class Ok:
    """`ok`: the close is accepted (§2.3.1.4)."""


@dataclass(frozen=True, slots=True)
class Error:
    """`error`: a negative reply with a reply code and a diagnostic (§2.3.1.5)."""

    code: int
    text: str = ""
    lang: str | None = field(default=None)


ManagementMessage = Greeting | Start | Close | Ok | Error | Profile




def _invalid(text: str) -> RemoteProtocolError:
    return RemoteProtocolError(text, code=ReplyCode.PARAMETER_SYNTAX_ERROR, terminate=False)


def _attrs(elem: etree._Element, allowed: set[str], required: set[str]) -> dict[str, str]:
    return checked_attributes(elem, allowed, required, _invalid)


def _number(value: str, what: str, minimum: int) -> int:
    if not _NUMBER.fullmatch(value) or not minimum <= int(value) <= MAX_NUMBER:
        raise _invalid(f"{what} {value[:20]!r} is not a number in {minimum}..{MAX_NUMBER}")
    return int(value)


def _code(value: str) -> int:
    if not _CODE.fullmatch(value):
        raise _invalid(f"reply code {value[:20]!r} is not three digits [1-5][0-9][0-9]")
    return int(value)


def _text_only(elem: etree._Element) -> str:
    if len(elem):
        raise _invalid(f"<{elem.tag}> may contain only character data")
    return elem.text or ""


def _profile(elem: etree._Element, in_greeting: bool) -> Profile:
    if elem.tag != "profile":
        raise _invalid(f"unexpected element <{elem.tag}> where <profile> belongs")
    attrs = _attrs(elem, {"uri", "encoding"}, {"uri"})
    content = _text_only(elem).strip()
    if in_greeting and content:
        raise _invalid("a <profile> in a greeting may not carry content (RFC 3080 §2.3.1.1)")
    if len(content.encode("utf-8")) > MAX_PROFILE_CONTENT:
        raise _invalid("profile content exceeds 4K octets (RFC 3080 §2.3.1.2)")
    try:
        encoding = ProfileEncoding(attrs.get("encoding", "none"))
        return Profile(attrs["uri"], content, encoding)
    except (ValueError, LocalProtocolError) as exc:
        raise _invalid(f"invalid <profile>: {exc}") from None


def parse_management(payload: bytes, max_size: int) -> ManagementMessage:
    """Parse one channel-zero XML body (without MIME headers).

    Raises:
        RemoteProtocolError: 500 if it is not well-formed XML (or too big, or declares a DTD),
            501 if it is not valid per the RFC 3080 §7.1 DTD. Always `terminate=False`.
    """
    try:
        root = parse_hardened(payload, max_bytes=max_size, what="channel-zero message")
    except UnsafeXml as exc:
        raise RemoteProtocolError(str(exc), code=ReplyCode.SYNTAX_ERROR,
                                  terminate=False) from None
    tag = root.tag
    if tag == "greeting":
        attrs = _attrs(root, {"features", "localize"}, set())
        if (root.text or "").strip():
            raise _invalid("<greeting> may contain only <profile> elements")
        return Greeting(
            tuple(_profile(child, in_greeting=True).uri for child in root),
            tuple(attrs.get("features", "").split()),
            tuple(attrs.get("localize", "").split()),
        )
    if tag == "start":
        attrs = _attrs(root, {"number", "serverName"}, {"number"})
        if (root.text or "").strip() or not len(root):
            raise _invalid("<start> must contain one or more <profile> elements")
        return Start(
            _number(attrs["number"], "channel number", 1),
            tuple(_profile(child, in_greeting=False) for child in root),
            attrs.get("serverName"),
        )
    if tag == "profile":
        return _profile(root, in_greeting=False)
    if tag == "close":
        attrs = _attrs(root, {"number", "code", _XML_LANG}, {"code"})
        return Close(_number(attrs.get("number", "0"), "channel number", 0),
                     _code(attrs["code"]), _text_only(root), attrs.get(_XML_LANG))
    if tag == "ok":
        _attrs(root, set(), set())
        if _text_only(root).strip():
            raise _invalid("<ok> has no content")
        return Ok()
    if tag == "error":
        attrs = _attrs(root, {"code", _XML_LANG}, {"code"})
        return Error(_code(attrs["code"]), _text_only(root), attrs.get(_XML_LANG))
    raise _invalid(f"unexpected element <{str(tag)[:40]}>")


# --- serialization, in the RFC's own layout ----------------------------------------------------


def _esc_text(value: str) -> str:
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _esc_attr(value: str) -> str:
    _check_text(value, "attribute value")
    return (_esc_text(value).replace("'", "&apos;").replace("\r", "&#13;")
            .replace("\n", "&#10;").replace("\t", "&#9;"))


def _profile_xml(profile: Profile, indent: str) -> str:
    attrs = f" uri='{_esc_attr(profile.uri)}'"
    if profile.encoding is not ProfileEncoding.NONE:
        attrs += f" encoding='{profile.encoding}'"
    if not profile.content:
        return f"{indent}<profile{attrs} />\r\n"
    if profile.encoding is ProfileEncoding.BASE64:
        body = _esc_text(profile.content)
    else:
        body = "<![CDATA[" + profile.content.replace("]]>", "]]]]><![CDATA[>") + "]]>"
    return f"{indent}<profile{attrs}>\r\n{indent}    {body}\r\n{indent}</profile>\r\n"


def _diagnostic(name: str, attrs: str, text: str) -> str:
    _check_text(text, "diagnostic")
    if not text:
        return f"<{name}{attrs} />\r\n"
    return f"<{name}{attrs}>{_esc_text(text)}</{name}>\r\n"


def _lang(lang: str | None) -> str:
    return "" if lang is None else f" xml:lang='{_esc_attr(lang)}'"


def serialize(message: ManagementMessage) -> bytes:
    """The XML body of a channel-zero message (UTF-8, without MIME headers)."""
    if isinstance(message, Greeting):
        attrs = ""
        if message.features:
            attrs += f" features='{_esc_attr(' '.join(message.features))}'"
        if message.localize:
            attrs += f" localize='{_esc_attr(' '.join(message.localize))}'"
        if not message.profiles:
            xml = f"<greeting{attrs} />\r\n"
        else:
            lines = "".join(_profile_xml(Profile(uri), "   ") for uri in message.profiles)
            xml = f"<greeting{attrs}>\r\n{lines}</greeting>\r\n"
    elif isinstance(message, Start):
        if not message.profiles:
            raise LocalProtocolError("a <start> needs at least one profile")
        attrs = f" number='{message.number}'"
        if message.server_name is not None:
            attrs += f" serverName='{_esc_attr(message.server_name)}'"
        lines = "".join(_profile_xml(p, "   ") for p in message.profiles)
        xml = f"<start{attrs}>\r\n{lines}</start>\r\n"
    elif isinstance(message, Profile):
        xml = _profile_xml(message, "")
    elif isinstance(message, Close):
        number = f" number='{message.number}'" \
            if message.number or message.explicit_number else ""
        xml = _diagnostic("close", f"{number} code='{message.code}'{_lang(message.lang)}",
                          message.text)
    elif isinstance(message, Ok):
        xml = "<ok />\r\n"
    else:
        xml = _diagnostic("error", f" code='{message.code}'{_lang(message.lang)}", message.text)
    return xml.encode("utf-8")
