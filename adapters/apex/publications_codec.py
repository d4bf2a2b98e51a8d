"""The `<publications>` document (docs/robust-binding.md §2.6): the messages a publisher
sends in one event-loop turn, in one data to `apex=pubsub@D`.

One data per message costs both ends a MSG, an APEX data and its parties, a relay decision and
an RPY each: on a flat-out publisher that was a third of the broker's CPU per message and
nearly half the publisher's (docs/bench-peers.md, "Publications in one data"). A batch costs
those once:

    <publications>
      <publication topic='equity.quote'><content type='application/xml'>PHEvPg==</content>
      </publication>
      <publication topic='equity.quote'><publish type='image' messageid='IBM' pubseq='7' />
        <content type='text/plain'>aGk=</content></publication>
    </publications>

A `<publication>` is what one data to `apex=pubsub/TOPIC@D` would have been: its topic, what
its `apexps.publish` option said (the same `<publish>` element, robust-binding.md §2.3), and
its content (base64, so any octets survive, with its MIME type: the `<content>` of a
delivery batch's items, robust-binding.md §5.4).

The service sends the same document the other way, a plain subscriber's live data packed
(adapters/pubsub/_plain_packs.py), each `<publication>` then with `inre`: the ids of the
subscriber's subscriptions it satisfied, which a publisher's document may not hold.

A publisher's document is answered by the data's reply, once every publication has its
outcome: `ok` when all are durable; otherwise the error of the first that is not, whose text
ends with the publications that are durable (`durable_note`), so that a publisher resolves
each exactly and sends again only the rest. Decoding is strict: the one hardened parser
(500), 501 for what does not fit the DTD (docs/apexps-robust.dtd), 553 for a topic name that
is not one; one bad publication refuses the document.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from lxml import etree

from broker.names import validate_topic
from common.errors import ParameterSyntaxError

from ._robust_syntax import (
    MAX_IN_RE,
    MAX_ROBUST_XML,
    SUBSCRIPTION_ID,
    attributes,
    content_of,
    content_xml,
    esc,
    parse,
)
from .robust_stamp import PublishMeta, publish_element, publish_meta_element

__all__ = [
    "MAX_PUBLICATIONS",
    "MAX_PUBLICATIONS_XML",
    "PUBLICATIONS",
    "Publication",
    "decode_publications",
    "durable_items",
    "durable_note",
    "encode_publications",
    "publication_content",
    "publication_element",
    "publications_document",
]

#: The document's root element (what `on_data` dispatches on).
PUBLICATIONS = "publications"
#: Publications in one document at most.
MAX_PUBLICATIONS = 4096
#: The largest document the broker reads (a client packs far less: client-library.md).
MAX_PUBLICATIONS_XML = MAX_ROBUST_XML

_HEAD, _TAIL = b"<publications>", b"</publications>"
#: One publication's head as the writer lays it out: a topic and a MIME type with nothing to
#: escape (a topic name never has: broker/names.py); then base64 up to _ITEM_END, which
#: `a2b_base64` checks strictly.
_ITEM = re.compile(rb"<publication topic='([A-Za-z][A-Za-z0-9_.-]{0,254})'"
                   rb"(?: inre='([A-Za-z0-9_.:=/@+-]{1,256}(?: [A-Za-z0-9_.:=/@+-]{1,256})*)')?>"
                   rb"<content type='([!-%(-;=?-~]{1,255})'>")
_ITEM_END = b"</content></publication>"
#: broker/names.py's topic names (the WKT= ones excluded: the general path refuses them).
_TOPIC = re.compile(rb"[A-Za-z][A-Za-z0-9_-]*(?:\.[A-Za-z0-9][A-Za-z0-9_-]*)*")
_NOTE = " (durable: "
_RANGE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")


class Publication(NamedTuple):
    """One publication of the document: what one data to its topic would have carried. (A
    tuple: a frozen dataclass's constructor costs several times as much, once per message.)"""

    topic: str
    content: bytes
    content_type: str = "application/octet-stream"
    #: its `<publish>` element (None: a plain update, as a data without the option)
    meta: PublishMeta | None = None
    #: the subscriber's subscriptions it satisfied (a delivery's `inre`, draft-content
    #: §5.10.1.1: only the service writes it); None: none named
    in_re: tuple[str, ...] | None = None


def _bad(what: str) -> ParameterSyntaxError:
    return ParameterSyntaxError(f"publications: {what}")


# --- encoding -------------------------------------------------------------------------------


def encode_publications(publications: Iterable[Publication]) -> bytes:
    return publications_document(
        publication_element(p.topic, publication_content(p.content, p.content_type), p.meta,
                            p.in_re) for p in publications)


def publications_document(elements: Iterable[str]) -> bytes:
    """The document of these `publication_element`s."""
    return f"<publications>{''.join(elements)}</publications>".encode()


def publication_element(topic: str, content: str, meta: PublishMeta | None = None,
                        in_re: tuple[str, ...] | None = None) -> str:
    """One publication, its content already made (`publication_content`: the service makes
    it once per message for every subscriber it packs the message for)."""
    head = f"<publication topic='{esc(topic)}'"
    if in_re:
        head += f" inre='{esc(' '.join(in_re))}'"
    return f"{head}>{'' if meta is None else publish_element(meta)}{content}</publication>"


def publication_content(content: bytes, content_type: str) -> str:
    """A publication's `<content>`, as a batch item's is written (`content_xml`)."""
    return content_xml(content, content_type)


# --- decoding -------------------------------------------------------------------------------


def decode_publications(content: bytes) -> list[Publication]:
    """The publications `content` holds, in order (500/501/553: the module docstring).

    A document in the layout `encode_publications` writes, with no `<publish>` element, is
    read by one regular expression per publication, without lxml, to what the general path
    gives (tests/apex/test_publications_codec.py holds the two equal); anything else goes
    that way."""
    fast = _decode_fast(content)
    return fast if fast is not None else _decode_general(content)


def _decode_fast(content: bytes) -> list[Publication] | None:
    """None: not in the writer's layout (the general path decides, errors included)."""
    if not content.startswith(_HEAD) or not content.endswith(_TAIL) \
            or len(content) > MAX_PUBLICATIONS_XML:
        return None
    end = len(content) - len(_TAIL)
    at = len(_HEAD)
    out: list[Publication] = []
    match = _ITEM.match
    a2b = binascii.a2b_base64
    is_topic = _TOPIC.fullmatch
    find = content.find
    while at < end:
        m = match(content, at, end)
        if m is None or len(out) >= MAX_PUBLICATIONS:
            return None
        topic, in_re, content_type = m.groups()
        if is_topic(topic) is None:
            return None  # a reserved or malformed name: the general path says which
        ids = None
        if in_re is not None:
            ids = tuple(in_re.decode("ascii").split(" "))
            if len(ids) > MAX_IN_RE:
                return None
        stop = find(_ITEM_END, m.end(), end)
        if stop < 0:
            return None
        try:  # strict: any octet outside the alphabet (a '<' included) is refused
            data = a2b(content[m.end():stop], strict_mode=True)
        except binascii.Error:
            return None
        out.append(Publication(topic.decode("ascii"), data, content_type.decode("ascii"), None,
                               ids))
        at = stop + len(_ITEM_END)
    return out


def _decode_general(content: bytes) -> list[Publication]:
    root = parse(content, MAX_PUBLICATIONS_XML, 3, "publications document")
    if root.tag != PUBLICATIONS:
        raise _bad(f"the document is <{PUBLICATIONS}>, not <{str(root.tag)[:40]}>")
    attributes(root, set(), set())
    if (root.text or "").strip():
        raise _bad("<publications> holds <publication>s only")
    if len(root) > MAX_PUBLICATIONS:
        raise _bad(f"more than {MAX_PUBLICATIONS} publications")
    return [_publication(elem, n) for n, elem in enumerate(root)]


def _publication(elem: etree._Element, n: int) -> Publication:
    if elem.tag != "publication":
        raise _bad(f"<publications> holds <publication>s, not <{str(elem.tag)[:40]}>")
    if (elem.tail or "").strip() or (elem.text or "").strip():
        raise _bad(f"publication {n} holds elements only")
    a = attributes(elem, {"topic", "inre"}, {"topic"})
    topic = validate_topic(a["topic"])
    in_re = _in_re(a["inre"], n) if "inre" in a else None
    children = list(elem)
    meta = None
    if len(children) == 2 and children[0].tag == "publish":
        meta = publish_meta_element(children[0])
        children = children[1:]
    if len(children) != 1 or children[0].tag != "content" or len(children[0]) \
            or (children[0].tail or "").strip():
        raise _bad(f"publication {n} holds an optional <publish> and then its <content>")
    data, content_type = content_of(children[0], f"publications: publication {n}")
    return Publication(topic, data, content_type, meta, in_re)


def _in_re(value: str, n: int) -> tuple[str, ...]:
    ids = tuple(value.split(" "))
    if len(ids) > MAX_IN_RE or not all(SUBSCRIPTION_ID.fullmatch(i) for i in ids):
        raise _bad(f"publication {n}: inre is up to {MAX_IN_RE} subscription ids, one space"
                   " apart")
    return ids


# --- the answer -----------------------------------------------------------------------------


def durable_note(durable: Sequence[int]) -> str:
    """What an error reply's text ends with: the publications (by place, from 0) that are
    durable although another is not, as ranges (`" (durable: 0-4,6)"`); "" for none."""
    if not durable:
        return ""
    ranges: list[str] = []
    start = prev = durable[0]
    for n in [*durable[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        ranges.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return f"{_NOTE}{','.join(ranges)})"


def durable_items(text: str | None, count: int) -> set[int]:
    """The places `durable_note` named at the end of an error reply's `text` (those below
    `count`); none when the text names none or is not in that form."""
    if not text or not text.endswith(")"):
        return set()
    at = text.rfind(_NOTE)
    if at < 0:
        return set()
    found: set[int] = set()
    for part in text[at + len(_NOTE):-1].split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            return set()
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if high < low or high >= count:
            return set()
        found.update(range(low, high + 1))
    return found
