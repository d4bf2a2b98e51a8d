"""A `<batch>` in the layout the broker writes, read without lxml.

Theory of operation
-------------------
Every live delivery a batching subscriber gets is a `<batch>` (docs/robust-binding.md §5.4), and
at a trickle each holds one item: the hardened lxml parse, the walk over its elements and the
stamp checks cost a subscriber more than everything else it does per delivery. Nearly every
batch was written by `BatchPacker` from `data_stamp_link` / `encode_stamp` parts, so it has
one exact layout:

    <batch link='L'><item><seq link='L'[ epoch='E'] linkseq='N' kind='data' source='S'
    sourceseq='N' type='T' topic='T'[ token='K'][ messageid='M'][ time='N'][ snapshot='true']
    [ refill='true'] /><content type='C'>BASE64</content></item>…</batch>

(one line, no blanks between tags), and heartbeat items `<item><seq link='L'[ epoch='E']
linkseq='N' kind='heartbeat'[ time='N'][ refill='true'] /><heartbeat interval='N' /></item>`.
`match_batch` recognises exactly that with one compiled regex per item and returns the `Batch`;
anything else, however legitimate (another attribute order, blanks, an entity, a withheld item,
a non-ASCII octet), is declined (None) and `decode_batch` parses it the general way, which stays
the one definition of what is accepted.

The contract: `match_batch` accepts only input the general path accepts, with an equal result,
and never raises. Each guard below serves one clause of that:

* The document is ASCII (no encoding question, no character XML forbids beyond the controls)
  and at most `MAX_BATCH_XML` octets; it starts with `<batch` and ends with `</batch>`, so no
  declaration, DOCTYPE, comment or processing instruction can sit anywhere.
* Attribute values exclude `&`, `<`, `>`, `'` and every control character, so no entity or
  markup hides in them and lxml's attribute-value normalisation (tabs and newlines to blanks)
  has nothing to change: the text is the value. Each attribute appears at most once, in its
  fixed place, so duplicates (which lxml refuses) cannot match.
* Every item names the batch's link (the general path refuses another), there are
  1..`MAX_BATCH_ITEMS` of them, and the content is strict base64 (or the batch is declined).
* The values are checked with the general path's own functions: the link, source (normalised
  by `Endpoint.parse` as there), publish type, topic and token once per combination (a data
  `Stamp` built by its checking constructor, then remembered, as `StampReader` does), the
  numbers and message-id of every item against the same bounds; any failure declines.

Where the optional C twin is built (`_speedups.c`, see `adapters.speedups`), `scan_batch` does
the layout recognition -- every guard above but the checks of the values by the general path's
functions -- and `match_batch` finishes with those (`_known`, `varied_stamp`).
`match_batch_python` stays the definition: the C hands it anything awkward (a heartbeat item,
base64 not in its canonical form), and tests/apex/test_batch_speedups.py holds the two to the
same answers on arbitrary input.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable
from typing import Literal

from adapters import speedups
from broker.errors import ApexpsError
from broker.names import validate_topic
from broker.records import PublishType
from broker.robust.linkid import validate_link_id

from ._robust_codec import (
    MAX_BATCH_ITEMS,
    MAX_LINK_SEQ,
    MAX_LONG,
    MAX_MESSAGE_ID_LEN,
    Heartbeat,
    Stamp,
    StampKind,
    Withheld,
    _source,
    varied_stamp,
)

__all__ = ["ItemFields", "match_batch", "match_batch_python"]

#: An attribute value whose text is its value (see the module docstring), on ASCII text.
_V = r"[^\x00-\x1f\x7f&<>']"
#: A decimal of at most 20 digits (every bound here fits in 20); the range is checked after.
_N = r"([0-9]{1,20})"
#: The general path's content type ([!-~]{1,255}) without what the encoder escapes.
_MEDIA = r"[!-%(-;=?-~]{1,255}"

_HEAD = re.compile(rf"<batch link='({_V}+)'>")
_END = "</batch>"
_DATA_ITEM = re.compile(
    rf"<item><seq link='({_V}+)'(?: epoch='{_N}')? linkseq='{_N}' kind='data'"
    rf" source='({_V}+)' sourceseq='{_N}' type='([a-z]{{1,16}})' topic='({_V}+)'"
    rf"(?: token='({_V}+)')?(?: messageid='({_V}+)')?(?: time='{_N}')?"
    rf"( snapshot='true')?( refill='true')? /><content type='({_MEDIA})'>")
#: What ends a data item: its content runs up to the first of these, and strict base64 refuses
#: any `<` (or anything else but the alphabet) that would hide markup in it.
_DATA_END = "</content></item>"
_HEARTBEAT_ITEM = re.compile(
    rf"<item><seq link='({_V}+)'(?: epoch='{_N}')? linkseq='{_N}' kind='heartbeat'"
    rf"(?: time='{_N}')?( refill='true')? /><heartbeat interval='{_N}' /></item>")

#: One item as `BatchItem`'s fields: stamp, content, content type, heartbeat or withheld
#: document (the fast path reads no withheld item).
ItemFields = tuple[Stamp, bytes, str, Heartbeat | Withheld | None]

#: Data stamps checked so far, by what repeats from one item to the next: link,
#: epoch, source, type, topic, token, snapshot and refill, as the match groups spell them.
_known: dict[tuple[str | None, ...], Stamp] = {}
#: Most combinations remembered: hostile batches naming ever-new sources start it over.
_KNOWN_LIMIT = 1024

#: One data item as `scan_batch` reads it: `_known`'s key, link seq, source seq, time,
#: message-id, decoded content and content type.
_ScannedItem = tuple[tuple[str | None, ...], int, int, int | None, str | None, bytes, str]
#: `scan_batch(content, max_bytes)`: `match_batch`'s layout checks in C (None if not built,
#: or built from an older source without it: tests/test_speedups.py says so). It returns
#: `(link, items)`, None to decline, or True where `match_batch_python` must decide.
_scan_batch: Callable[[bytes, int],
                      tuple[str, list[_ScannedItem]] | Literal[True] | None] | None = \
    getattr(speedups.load("adapters.apex._speedups"), "scan_batch", None)


def _bounded(digits: str, low: int, high: int) -> int:
    number = int(digits)
    if not low <= number <= high:
        raise ValueError(digits)
    return number


def _checked_proto(key: tuple[str | None, ...]) -> Stamp | None:
    """A data stamp with the fixed values of `key` (see `_known`), built as `stamp_element`
    builds one (its checking constructor included); None where the general path refuses
    them."""
    link, epoch, source, ptype, topic, token, snapshot, refill = key
    assert link is not None and source is not None and ptype is not None and topic is not None
    try:
        return Stamp(link=validate_link_id(link), link_seq=1, kind=StampKind.DATA,
                      epoch=0 if epoch is None else _bounded(epoch, 0, MAX_LONG),
                      source=_source(source), source_seq=1, publish_type=PublishType(ptype),
                      topic=validate_topic(topic), token=token, refill=refill is not None,
                      snapshot=snapshot is not None)
    except (ApexpsError, ValueError):
        return None


def _remembered(key: tuple[str | None, ...]) -> Stamp | None:
    """`_checked_proto(key)`, remembered in `_known` if the general path takes it."""
    proto = _checked_proto(key)
    if proto is not None:
        if len(_known) >= _KNOWN_LIMIT:
            _known.clear()
        _known[key] = proto
    return proto


def match_batch(content: bytes, max_bytes: int) -> tuple[str, list[ItemFields]] | None:
    """The link and items of `content` if it is a batch of at most `max_bytes` octets in the
    broker's layout; None to decline. Never raises."""
    if _scan_batch is None:
        return match_batch_python(content, max_bytes)
    scanned = _scan_batch(content, max_bytes)
    if scanned is None:
        return None
    if scanned is True:
        return match_batch_python(content, max_bytes)
    link, scanned_items = scanned
    items: list[ItemFields] = []
    known, varied = _known, varied_stamp
    for key, seq, number, at, message_id, data, media in scanned_items:
        proto = known.get(key)
        if proto is None:
            proto = _remembered(key)
            if proto is None:
                return None
        items.append((varied(proto, seq, number, at, message_id), data, media, None))
    return link, items


def match_batch_python(content: bytes, max_bytes: int) -> tuple[str, list[ItemFields]] | None:
    """`match_batch()` in Python: what the compiled twin must equal, and the fallback."""
    if len(content) > max_bytes or not content.isascii():
        return None
    text = content.decode("ascii")
    head = _HEAD.match(text)
    if head is None or not text.endswith(_END):
        return None
    link = head[1]
    pos, end = head.end(), len(text) - len(_END)
    items: list[ItemFields] = []
    data_item, known, a2b_base64 = _DATA_ITEM.match, _known, binascii.a2b_base64
    try:
        while pos < end:
            m = data_item(text, pos, end)
            if m is None:
                heartbeat = _heartbeat(text, pos, end, link)
                if heartbeat is None:
                    return None
                pos = heartbeat[0]
                items.append(heartbeat[1])
                continue
            (item_link, epoch, link_seq, source, source_seq, ptype, topic, token, message_id,
             time, snapshot, refill, media) = m.groups()
            if item_link != link:
                return None
            key = (link, epoch, source, ptype, topic, token, snapshot, refill)
            proto = known.get(key)
            if proto is None:
                proto = _remembered(key)
                if proto is None:
                    return None
            if message_id is not None and len(message_id) > MAX_MESSAGE_ID_LEN:
                return None
            seq, number = int(link_seq), int(source_seq)
            if not (0 < seq <= MAX_LINK_SEQ and 0 < number <= MAX_LONG):
                return None
            if time is not None:
                at = int(time)
                if at > MAX_LONG:
                    return None
            else:
                at = None
            start = m.end()
            stop = text.find(_DATA_END, start, end)
            if stop < 0:
                return None
            items.append((varied_stamp(proto, seq, number, at, message_id),
                          a2b_base64(text[start:stop], strict_mode=True), media, None))
            pos = stop + len(_DATA_END)
    except (ValueError, binascii.Error):
        return None
    if pos != end or not 0 < len(items) <= MAX_BATCH_ITEMS:
        return None
    return link, items


def _heartbeat(text: str, pos: int, end: int, link: str) -> tuple[int, ItemFields] | None:
    """A heartbeat item at `pos` (idle links: rare), checked by the constructors alone."""
    m = _HEARTBEAT_ITEM.match(text, pos, end)
    if m is None or m[1] != link:
        return None
    _, epoch, link_seq, time, refill, interval = m.groups()
    try:
        stamp = Stamp(link, _bounded(link_seq, 0, MAX_LINK_SEQ), StampKind.HEARTBEAT,
                      0 if epoch is None else _bounded(epoch, 0, MAX_LONG),
                      time=None if time is None else _bounded(time, 0, MAX_LONG),
                      refill=refill is not None)
        document = Heartbeat(_bounded(interval, 1, MAX_LONG))
    except (ApexpsError, ValueError):
        return None
    return m.end(), (stamp, b"", "application/octet-stream", document)
