"""A data operation in its canonical layout, read and written without the MIME parser or lxml.

Theory of operation
-------------------
Nearly every data a relay sees was written by `encode()` -- ours, or a peer's copying RFC 3340
§4.1's example: a two-part `multipart/related` entity, the control document first with one
`originator` and one or more `recipient`s and no option, the content second. Decoding that
through `_multipart` and lxml cost about 50 µs, a quarter of what a relay spent on a data.
`match_data` recognises exactly that layout (octet comparisons in C, the parties by a regex)
and returns its pieces; `_codec` turns them into a `Data`. Anything else, however legitimate, is
declined (None) and goes the general way, which stays the one definition of what is accepted.

The contract: `match_data` accepts only input the general path accepts with an equal result.
Each guard below exists for one clause of that:

* The entity's Content-Type is matched whole, with quoted `boundary` and `start` values of
  characters that need no unquoting, so `content_type_params` would find the same three
  parameters (it would read more layouts; we do not).
* The general path splits `CRLF + body` on every `CRLF--boundary`, whatever follows it, and
  treats a part beginning with `--` as the close delimiter. So the first delimiter after the
  start part's headers must be the one closing the control document, and the next one must be
  the close delimiter that ends the body: a content holding `CRLF--boundary` is declined. The
  `find`s start early enough to see a delimiter straddling a header block's last CRLF.
* Header blocks are literal (names in our spelling, one space after the colon, `binary`), their
  values hold no CR or LF (no folding, no blank line ends them early) and no leading or
  trailing blank (the general path strips), and are short enough for `MAX_PART_HEADER_SIZE`.
* Content-IDs and the `start` value are of a class without `%` (`unquote` of `cid:` is then the
  identity), `<`, `>` (nothing to strip), quotes, `&` or blanks; the start part's Content-ID
  must equal `start`, the content part's must equal the `cid:` of the `content` attribute.
* The control document: `<data content='cid:…'>`, an `<originator identity='…' />`, one or
  more `<recipient identity='…' />`, `</data>`, with XML white space (never `\\f` or `\\v`,
  which XML forbids) where XML allows it. Attribute values exclude `&`, `<`, `>`, both quotes
  and every control character, so no entity, declaration, comment or markup can hide in them
  and lxml's attribute-value normalisation has nothing to change: the text is the value. The
  document must be ASCII (the C leaves any other octet to the general path).

* The data's own options, if any, after the recipients: each exactly as `encode_xml` writes
  one whose content is a single empty element (`<option internal='N' targetHop='all'
  mustUnderstand='true' transID='7'>` around `<dataHopping noMoreThan='8' reportErrors='true'
  />`: what a broker puts on every delivery), with attribute values of letters and digits
  only. The general path keeps an option's content as lxml serializes it, which for such an
  element is `<dataHopping noMoreThan="8" reportErrors="true"/>`; that is what is returned.
* A recipient's options, if any, each in the form `encode_xml` writes an option with no
  attribute but its name (an InRe: `<option internal='InRe'>` around `<subscription-id>1
  </subscription-id>` elements, text of letters, digits, `.`, `_` and `-`). Their content is
  the source from the first element to the last: lxml writes such elements back as they were,
  and the white space between them (the tails) with each CR LF or CR read as LF, as XML reads
  line ends. A document with any option goes this way, a few regular expressions in a loop
  (`_rich`); the usual one without keeps the single cached match.

The endpoints are parsed here (`Endpoint.parse`; one that does not parse is declined), cached
with the text they came from. The caller passes the control document's size limit (checked
before any regex runs over it); the other limits are `_codec`'s to check.

There is one fast reader, and it is compiled (`match_layout` in `_speedups.c`, see
`adapters.speedups`): it does every check above but the parties', which stay here (`_parties`,
cached by their text), and hands back the pieces. What it leaves undecided (a control document
that is not ASCII, where strict UTF-8 and the XML character rules decide; arguments of
unexpected types) is declined, and so is everything where it is not built (no C compiler, or
`APEXPS_PURE_PYTHON=1`): the general path reads those, slower and with the same result. The
layout rules above, spelled as regular expressions, live on as the test oracle in
tests/apex/canonical_oracle.py; tests/apex/test_canonical_speedups.py holds the C to it and
tests/apex/test_codec_fast.py holds `match_data` to the general path, on arbitrary input.

Writing (`write_data`) produces the layout `_multipart.encode_related` does, octet for octet.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Literal, NamedTuple

from adapters import speedups
from common.errors import InvalidParameter

from .endpoint import Endpoint

__all__ = ["FAST_CONTENT_TYPE_PREFIX", "DataLayout", "OptionFields", "match_data", "write_data"]

#: What the Content-Type of every entity `match_data` could accept starts with.
FAST_CONTENT_TYPE_PREFIX = 'multipart/related; boundary="'
#: Longest Content-ID (and `start`) accepted; keeps either header block far below
#: `_multipart.MAX_PART_HEADER_SIZE` (4096).
_MAX_ID = 256
#: Longest content type of the content part accepted, for the same reason.
_MAX_MEDIA = 256

# The control document's parties, matched once the C has found it ASCII.
_WS = r"[ \t\r\n]"
# An attribute value: no control character, no quote, no "&", "<" or ">".
_VALUE = r"[^\x00-\x1f\x7f\"&'<>]+"


def _party(tag: str, value: str) -> str:
    return rf"{_WS}*<{tag}{_WS}+identity{_WS}*={_WS}*{value}{_WS}*/>"


# The rest of the document after <data ...>: the parties and the end tag.
_PARTIES = re.compile(
    # the originator and the first recipient have groups of their own (one recipient is usual),
    _party("originator", rf"(['\"])({_VALUE})\1")
    + _party("recipient", rf"(['\"])({_VALUE})\3")
    # further recipients share one (_RECIPIENT then finds each)
    + "((?:" + _party("recipient", f"(?:'{_VALUE}'|\"{_VALUE}\")") + ")*)"
    + rf"{_WS}*</data{_WS}*>{_WS}*")
_RECIPIENT = re.compile(rf"<recipient{_WS}+identity{_WS}*={_WS}*['\"]({_VALUE})")
# A data's own option in `encode_xml`'s form, its content one empty element (module docstring).
_NAME = r"[A-Za-z][A-Za-z0-9]{0,63}"
_OPTION = re.compile(
    rf"{_WS}*<option internal='({_NAME})' targetHop='(this|final|all)'"
    rf" mustUnderstand='(true|false)' transID='([1-9][0-9]{{0,8}})'>"
    rf"{_WS}*<({_NAME})((?: {_NAME}='[A-Za-z0-9]{{0,64}}')*) />{_WS}*</option>")
_OPTION_ATTR = re.compile(rf" ({_NAME})='([A-Za-z0-9]*)'")
#: What closes the document after the options (as `_PARTIES` ends).
_END = re.compile(rf"{_WS}*</data{_WS}*>{_WS}*")
_ORIGINATOR = re.compile(_party("originator", rf"(['\"])({_VALUE})\1"))
_RECIPIENT_OPEN = re.compile(rf"{_WS}*<recipient{_WS}+identity{_WS}*={_WS}*(['\"])({_VALUE})\1"
                             rf"{_WS}*(/?)>")
_RECIPIENT_CLOSE = re.compile(rf"{_WS}*</recipient{_WS}*>")
# A recipient's option (module docstring): its name only, elements of plain text inside.
_NAMED_OPTION = re.compile(
    rf"{_WS}*<option internal='({_NAME})'>{_WS}*"
    rf"((?:<([A-Za-z][A-Za-z0-9-]{{0,63}})>[A-Za-z0-9._-]{{1,64}}</\3>{_WS}*)+)</option>")
#: (name, transID, targetHop, mustUnderstand, content) of one option, as the general path
#: would have read it
OptionFields = tuple[str, int | None, str, bool, str]
#: Longest rest of a document whose parties are cached (`_cached_parties`): a few dozen
#: recipients; bounds the cache's memory whatever peers send.
_MAX_CACHED_REST = 2048

_Parties = tuple[Endpoint, tuple[Endpoint, ...]]
#: `match_layout(content_type, body, max_xml_size)`: `match_data`'s checks of all but the
#: parties in C (None if not built). It returns `(content_ref, rest, media_type, content)`,
#: None to decline, or True where it leaves the decision to the general path (a non-ASCII
#: document).
_c = speedups.load("adapters.apex._speedups")
_match_layout: Callable[[str, bytes, int],
                        tuple[str, str, str, bytes] | Literal[True] | None] | None = \
    _c.match_layout if _c is not None else None


class DataLayout(NamedTuple):
    """The pieces of a canonical data, as the general path would have read them."""

    #: The `content` attribute ("cid:" and the content part's Content-ID).
    content_ref: str
    originator: Endpoint
    recipients: tuple[Endpoint, ...]
    content_type: str
    content: bytes
    #: the data's own options (none: the usual case)
    options: tuple[OptionFields, ...] = ()
    #: each recipient's options, in order (empty: none has any)
    recipient_options: tuple[tuple[OptionFields, ...], ...] = ()


def _options(text: str) -> tuple[OptionFields, ...] | None:
    """The options `text` (the document from the first `<option` to its end) holds, then the
    end of the document; None if it is anything else."""
    found, at = [], 0
    while (m := _OPTION.match(text, at)) is not None:
        inner = "".join(f' {a}="{v}"' for a, v in _OPTION_ATTR.findall(m[6]))
        found.append((m[1], int(m[4]), m[2], m[3] == "true", f"<{m[5]}{inner}/>"))
        at = m.end()
    if not found or _END.fullmatch(text, at) is None:
        return None
    return tuple(found)


def _rich(rest: str) -> tuple[_Parties, tuple[tuple[OptionFields, ...], ...],
                              tuple[OptionFields, ...]] | None:
    """The parties, each recipient's options and the data's own, of a document with options
    (module docstring), if it is in that form and they parse; else None."""
    m = _ORIGINATOR.match(rest)
    if m is None:
        return None
    at, identities, per_recipient = m.end(), [m[2]], []
    while (r := _RECIPIENT_OPEN.match(rest, at)) is not None:
        identities.append(r[2])
        at, found = r.end(), []
        if not r[3]:  # <recipient ...> with options inside
            while (o := _NAMED_OPTION.match(rest, at)) is not None:
                content = o[2].rstrip(" \t\r\n").replace("\r\n", "\n").replace("\r", "\n")
                found.append((o[1], None, "final", False, content))
                at = o.end()
            close = _RECIPIENT_CLOSE.match(rest, at)
            if not found or close is None:
                return None
            at = close.end()
        per_recipient.append(tuple(found))
    if len(identities) < 2:
        return None
    options: tuple[OptionFields, ...] = ()
    if _END.fullmatch(rest, at) is None:
        found_options = _options(rest[at:])
        if found_options is None:
            return None
        options = found_options
    try:
        parties = (_endpoint(identities[0]), tuple(map(_endpoint, identities[1:])))
    except InvalidParameter:
        return None  # the general path says which endpoint
    return parties, tuple(per_recipient) if any(per_recipient) else (), options


#: Endpoints by their text: a document with options is not cached whole (`_rich`).
_endpoint = functools.lru_cache(maxsize=1024)(Endpoint.parse)


def _parties(rest: str) -> _Parties | None:
    """The originator and recipients the rest of a document after `<data ...>` names, if it is
    canonical and they parse."""
    document = _PARTIES.fullmatch(rest)
    if document is None:
        return None
    recipients = [document[4]]
    if document[5]:
        recipients += _RECIPIENT.findall(document[5])
    try:
        return Endpoint.parse(document[2]), tuple(map(Endpoint.parse, recipients))
    except InvalidParameter:
        return None  # the general path says which endpoint


#: The same few parties send most data, and all but the `cid:` of their documents repeats:
#: reading and parsing them was a third of decoding a data. Refusals are cached too.
_cached_parties = functools.lru_cache(maxsize=1024)(_parties)


def match_data(content_type: str, body: bytes, max_xml_size: int) -> DataLayout | None:
    """The pieces of `body` if it is a data in the canonical layout whose control document is
    at most `max_xml_size` octets; None to decline (always, where the twin is not built)."""
    if _match_layout is None:
        return None
    got = _match_layout(content_type, body, max_xml_size)
    if got is None or got is True:
        return None
    content_ref, rest, media_type, content = got
    if "<option" in rest:  # values hold no "<": this is an option element somewhere
        rich = _rich(rest)
        if rich is None:
            return None
        (originator, recipients), per_recipient, options = rich
        return DataLayout(content_ref, originator, recipients, media_type, content, options,
                          per_recipient)
    parties = _cached_parties(rest) if len(rest) <= _MAX_CACHED_REST else _parties(rest)
    if parties is None:
        return None
    return DataLayout(content_ref, parties[0], parties[1], media_type, content)


def write_data(parties: bytes, content_type: str, content: bytes, *, xml_ref: str,
               content_id: str, start_id: str, boundary: str) -> tuple[str, bytes]:
    """`(Content-Type, body)` exactly as `encode_related` writes a data without options: the
    document `<data content='cid:{xml_ref}'>` around the `parties` lines, then the content.

    `boundary` and `start_id` are ours, ASCII, so the first line may be encoded as UTF-8 whole
    (the document is UTF-8, headers Latin-1).
    """
    body = b"".join((
        f"--{boundary}\r\nContent-Type: application/beep+xml\r\nContent-ID: <{start_id}>\r\n"
        f"\r\n<data content='cid:{xml_ref}'>\r\n".encode(),
        parties,
        f"</data>\r\n--{boundary}\r\nContent-Type: {content_type}\r\n"
        f"Content-Transfer-Encoding: binary\r\nContent-ID: <{content_id}>\r\n\r\n"
        .encode("latin-1"),
        content,
        f"\r\n--{boundary}--\r\n".encode("latin-1"),
    ))
    return (f'multipart/related; boundary="{boundary}"; start="<{start_id}>";'
            ' type="application/beep+xml"'), body
