"""The `<batch>` layout of `adapters/apex/batch_fast.py`, spelled as regular expressions: the
oracle its compiled twin (`scan_batch` in adapters/apex/_speedups.c) is held to.

This was the product's pure-Python fast path until the general path (lxml) and the C twin were
made the only two readers; it stays here because a regex per item states the layout more
plainly than the C's octet-by-octet scan, so a property test comparing the two on arbitrary
input finds a guard the C lost. `match_batch_python` returns what `match_batch` would if the
C decided everything itself: None to decline, or the link and items; it also reads heartbeat
items (the C leaves those to the general path). It shares `_batch_fast`'s checks of the values
(`_remembered`), which are the general path's functions.
"""

from __future__ import annotations

import binascii
import re

from adapters.apex.batch_fast import ItemFields, _bounded, _known, _remembered
from adapters.apex.robust_codec import (
    MAX_BATCH_ITEMS,
    MAX_LINK_SEQ,
    MAX_LONG,
    MAX_MESSAGE_ID_LEN,
    Heartbeat,
)
from adapters.apex.robust_stamp import Stamp, StampKind, varied_stamp
from common.errors import ApexpsError

__all__ = ["match_batch_python"]

#: An attribute value whose text is its value (see `_batch_fast`'s docstring), on ASCII text.
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
    rf"( snapshot='true')?(?: inre='({_V}+)')?( refill='true')? /><content type='({_MEDIA})'>")
#: What ends a data item: its content runs up to the first of these, and strict base64 refuses
#: any `<` (or anything else but the alphabet) that would hide markup in it.
_DATA_END = "</content></item>"
_HEARTBEAT_ITEM = re.compile(
    rf"<item><seq link='({_V}+)'(?: epoch='{_N}')? linkseq='{_N}' kind='heartbeat'"
    rf"(?: time='{_N}')?( refill='true')? /><heartbeat interval='{_N}' /></item>")


def match_batch_python(content: bytes, max_bytes: int) -> tuple[str, list[ItemFields]] | None:
    """The link and items of `content` if it is a batch of at most `max_bytes` octets in the
    broker's layout (heartbeat items too); None to decline. Never raises."""
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
             time, snapshot, in_re, refill, media) = m.groups()
            if item_link != link:
                return None
            key = (link, epoch, source, ptype, topic, token, snapshot, refill, in_re)
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
