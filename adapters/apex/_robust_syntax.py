"""The syntax robust delivery's elements share (adapters/apex/robust_stamp.py, robust_codec.py):
their limits, the attribute and number checkers that turn bad input into 501 or 553, the
hardened parse (500), and the escaping of what is written. One place, so that the stamp's and
the documents' decoders cannot come to disagree on what a number, a name or a limit is.
"""

from __future__ import annotations

import binascii
import re

from lxml import etree

from common.errors import (
    BadGapRange,
    InvalidParameter,
    ParameterSyntaxError,
    SyntaxError_,
)
from common.xml_safe import UnsafeXml, checked_attributes, parse_hardened

from .endpoint import Endpoint

__all__ = [
    "CONTENT_TYPE",
    "MAX_BATCH_ITEMS",
    "MAX_IN_RE",
    "MAX_LINK_SEQ",
    "MAX_LONG",
    "MAX_MESSAGE_ID_LEN",
    "MAX_REPAIR_SOURCES",
    "MAX_ROBUST_XML",
    "MAX_SELECTOR_CLASSES",
    "MAX_STAMP_XML",
    "MAX_TEXT_LEN",
    "MAX_TOKEN_LEN",
    "MAX_TRANS_ID",
    "NAME",
    "SUBSCRIPTION_ID",
    "XML_LANG",
    "attr",
    "attributes",
    "bad",
    "check_batch",
    "check_int",
    "check_text",
    "content_of",
    "content_xml",
    "decimal",
    "empty_element",
    "esc",
    "linkseq",
    "optional",
    "parse",
    "source_name",
]


#: The widest link seq of any resolution (64 bits).
MAX_LINK_SEQ = 2**64 - 1


#: Source seqs, epochs and times are Avro longs in the journal and the link log.
MAX_LONG = 2**63 - 1


MAX_TRANS_ID = 2_147_483_647


#: A repair names each source the subscriber has seen once; a desk sees hundreds. 4096 sources
#: of ordinary length fit well inside MAX_ROBUST_XML.
MAX_REPAIR_SOURCES = 4096


#: A repair's source list is the largest document here; 1 MiB as for pubsub documents.
MAX_ROBUST_XML = 1024 * 1024


#: A stamp is one empty element of a dozen attributes; endpoints cap its size.
MAX_STAMP_XML = 8 * 1024


#: Permission tokens and message-ids are short names; anything longer is not one.
MAX_TOKEN_LEN = 256


MAX_MESSAGE_ID_LEN = 1024


MAX_TEXT_LEN = 4096


MAX_SELECTOR_CLASSES = 64


#: Most items one `<batch>` may hold, and so the most a gap or repair request may ask for (§5.4).
MAX_BATCH_ITEMS = 4096


_DIGITS = re.compile(r"[0-9]+")


_SIGNED = re.compile(r"-?[0-9]+")


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}")


_NO_CONTROL = re.compile(r"[^\x00-\x1f\x7f]+")


#: A subscription id as a stamp's inre names it (the service's numbers; a topic name for a
#: subscription recorded before ids existed): no blank, quote or markup.
SUBSCRIPTION_ID = re.compile(r"[\w.:=/@+-]{1,256}")


#: Subscription ids one inre names at most.
MAX_IN_RE = 1024


XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"


#: Digits beyond this are absurd for any number here; never build a huge int from them.
_MAX_DIGITS = 40


def bad(what: str) -> ParameterSyntaxError:
    return ParameterSyntaxError(what)


def check_int(value: int, what: str, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise bad(f"{what} {value!r} is outside {low}..{high}")


def check_text(value: str, what: str, limit: int) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= limit \
            or not _NO_CONTROL.fullmatch(value):
        raise InvalidParameter(f"{what} has 1..{limit} characters and no control characters")


def check_batch(batch: int | None) -> None:
    if batch is not None:
        check_int(batch, "batch", 1, MAX_BATCH_ITEMS)


def attributes(elem: etree._Element, allowed: set[str], required: set[str]) -> dict[str, str]:
    return checked_attributes(elem, allowed, required, bad)


def empty_element(elem: etree._Element) -> None:
    if len(elem) or (elem.text or "").strip():
        raise bad(f"<{elem.tag}> is empty by the DTD")


def decimal(value: str, what: str, low: int = 0, high: int = MAX_LONG) -> int:
    """A decimal without sign or spaces in low..high, else 501."""
    if not _DIGITS.fullmatch(value) or len(value) > _MAX_DIGITS:
        raise bad(f"{what} {value[:24]!r} is not an unsigned decimal number")
    number = int(value)
    if not low <= number <= high:
        raise bad(f"{what} {number} is outside {low}..{high}")
    return number


def linkseq(value: str, what: str) -> int:
    """A link seq: a decimal, else 501; negative or beyond 64 bits, 553 (a bad range)."""
    if not _SIGNED.fullmatch(value):
        raise bad(f"{what} {value[:24]!r} is not a number")
    if value.startswith("-"):
        raise BadGapRange(f"{what} {value[:24]} is negative")
    if len(value) > _MAX_DIGITS or int(value) > MAX_LINK_SEQ:
        raise BadGapRange(f"{what} {value[:24]}… is beyond any link seq resolution")
    return int(value)


def optional(attrs: dict[str, str], name: str, what: str | None = None, low: int = 0,
         high: int = MAX_LONG) -> int | None:
    return decimal(attrs[name], what or name, low, high) if name in attrs else None


def source_name(value: str) -> str:
    return str(Endpoint.parse(value))


def parse(content: bytes, limit: int, depth: int, what: str) -> etree._Element:
    try:
        return parse_hardened(content, max_bytes=limit, max_depth=depth, what=what)
    except UnsafeXml as exc:
        raise SyntaxError_(str(exc)) from None


#: The MIME type of a `<content>` element (a batch item's, a publication's).
CONTENT_TYPE = re.compile(r"[!-~]{1,255}")


def content_xml(content: bytes, content_type: str) -> str:
    """`<content type='T'>BASE64</content>`: any octets, with their MIME type (a batch item's
    content, robust-binding.md §5.4, and a publication's, §2.6)."""
    return (f"<content type='{esc(content_type)}'>"
            f"{binascii.b2a_base64(content, newline=False).decode('ascii')}</content>")


def content_of(elem: etree._Element, what: str) -> tuple[bytes, str]:
    """A `<content>` element's octets and MIME type; 501 (`bad`, the message naming `what`)
    for other attributes, a type that is not one, or text that is not strict base64."""
    attrs = elem.attrib
    content_type = attrs.get("type")
    if content_type is None or len(attrs) != 1:
        raise bad(f"{what}: <content> has exactly its type attribute")
    if not CONTENT_TYPE.fullmatch(content_type):
        raise bad(f"{what}: {content_type[:40]!r} is not a MIME type")
    try:
        return (binascii.a2b_base64((elem.text or "").encode("ascii"), strict_mode=True),
                content_type)
    except (binascii.Error, UnicodeError):
        raise bad(f"{what}: its content is not base64") from None


def esc(value: str) -> str:
    return (value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("'", "&apos;"))


def attr(name: str, value: object) -> str:
    """` name='value'`, or nothing for None."""
    if value is None:
        return ""
    return f" {name}='{esc(value) if isinstance(value, str) else value}'"
