"""The `<batch>` document (docs/robust-binding.md §5.4): many items of one link in one data.

A gap fill or a source repair's catch-up of thousands of items would otherwise be thousands of
APEX data, each encoded, framed, parsed and answered with an `ok` — about half a millisecond of
Python per item on the two ends together, seconds for a 10,000-item gap. A requester that says
`batch='N'` takes them packed instead, up to N items (and `BATCH_BYTES`) per data from
`apex=pubsub@D`, whose content is

    <batch link='L'>
      <item><seq … kind='data' … /><content type='text/plain'>aGVsbG8=</content></item>
      <item><seq … kind='heartbeat' refill='true' /><heartbeat interval='5000' /></item>
      <item><seq … kind='withheld' refill='true' /><withheld /></item>
    </batch>

Each item is exactly what one data would have carried: the stamp its recipient element held,
then the content (base64, so any octets survive, with its MIME type) or the heartbeat or
withheld document. Resets never travel in a batch: each starts an epoch and goes on its own.
A batch is the items of one link, in link order.

Decoding is as strict as the rest of the binding: the one hardened parser, 500 for XML that
is not or is hostile, 501 for what does not fit the DTD (and for base64 that is not), 553 for
a link id, topic or endpoint that is not one; one bad item refuses the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lxml import etree

from broker.robust.linkid import validate_link_id
from common.errors import ParameterSyntaxError, SyntaxError_
from common.xml_safe import UnsafeXml, checked_attributes, parse_hardened

from ._robust_syntax import content_of, content_xml, esc
from .batch_fast import ItemFields, match_batch
from .robust_codec import MAX_BATCH_ITEMS, Heartbeat, Withheld, document_element
from .robust_stamp import Stamp, StampKind, stamp_element

__all__ = [
    "BATCH_BYTES",
    "BATCH_ITEM_CONTENT",
    "DEFAULT_BATCH",
    "MAX_BATCH_XML",
    "Batch",
    "BatchItem",
    "BatchPacker",
    "ItemFields",
    "batch_data_item",
    "batch_item",
    "batch_item_content",
    "batch_items",
    "decode_batch",
]

#: What the client library and the stub ask for (`batch='1024'`).
DEFAULT_BATCH = 1024
#: What the broker packs into one batch at most (octets of the document).
BATCH_BYTES = 128 * 1024
#: Content larger than this goes in a data of its own, so a batch stays under BATCH_BYTES.
BATCH_ITEM_CONTENT = 64 * 1024
#: The largest batch document a subscriber reads: BATCH_BYTES with room to spare.
MAX_BATCH_XML = 1024 * 1024



def _bad(what: str) -> ParameterSyntaxError:
    return ParameterSyntaxError(f"batch: {what}")


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One item of a batch: a DATA stamp with its content, or a heartbeat or withheld stamp
    with its document."""

    stamp: Stamp
    content: bytes = b""
    content_type: str = "application/octet-stream"
    document: Heartbeat | Withheld | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    link: str
    items: tuple[BatchItem, ...]


# --- encoding -------------------------------------------------------------------------------


def batch_data_item(stamp_xml: str, content: bytes, content_type: str) -> str:
    """One data item from its stamp (`data_stamp_xml`) and content."""
    return f"<item>{stamp_xml}{batch_item_content(content, content_type)}"


def batch_item_content(content: bytes, content_type: str) -> str:
    """A data item's end, from its content on: the same for every link a message goes to, so
    the fan-out encodes it once per message."""
    return f"{content_xml(content, content_type)}</item>"


def batch_item(stamp_xml: str, document: bytes) -> str:
    """A heartbeat or withheld item from its stamp and document (`encode_robust`)."""
    return f"<item>{stamp_xml}{document.decode('utf-8')}</item>"


class BatchPacker:
    """Packs one link's items, in order, into batch documents of at most `limit` items and
    about `BATCH_BYTES` octets: `add` and `flush` return a finished document when there is
    one to send."""

    def __init__(self, link: str, limit: int) -> None:
        self._head = f"<batch link='{esc(link)}'>"
        self._limit = max(1, min(limit, MAX_BATCH_ITEMS))
        self._items: list[str] = []
        self._size = 0

    def add(self, item: str) -> bytes | None:
        done = None
        if self._items and (len(self._items) >= self._limit
                            or self._size + len(item) > BATCH_BYTES):
            done = self.flush()
        self._items.append(item)
        self._size += len(item)
        return done

    def flush(self) -> bytes | None:
        if not self._items:
            return None
        doc = f"{self._head}{''.join(self._items)}</batch>".encode()
        self._items, self._size = [], 0
        return doc


# --- decoding -------------------------------------------------------------------------------


def _item(elem: etree._Element, link: str) -> ItemFields:
    if elem.tag != "item":
        raise _bad(f"<batch> holds <item>s, not <{str(elem.tag)[:40]}>")
    if elem.attrib:
        raise _bad("an <item> has no attributes")
    if len(elem) != 2:
        raise _bad("an <item> holds a <seq> and then its content, heartbeat or withheld")
    seq, payload = elem
    # Text around the two is whitespace at most (None, as the broker writes it, is cheapest).
    if (elem.text and elem.text.strip()) or (seq.tail and seq.tail.strip()) \
            or (payload.tail and payload.tail.strip()):
        raise _bad("an <item> holds a <seq> and then its content, heartbeat or withheld")
    stamp = stamp_element(seq)
    if stamp.link != link:
        raise _bad(f"an item of link {stamp.link!r} in the batch of link {link!r}")
    if stamp.kind is StampKind.DATA:
        if payload.tag != "content" or len(payload):
            raise _bad("a data item's <seq> is followed by its <content>")
        content, content_type = content_of(payload, "batch: a data item")
        return stamp, content, content_type, None
    if stamp.kind is StampKind.RESET:
        raise _bad("a reset never travels in a batch")
    document = document_element(payload)
    wanted = Heartbeat if stamp.kind is StampKind.HEARTBEAT else Withheld
    if not isinstance(document, wanted):
        raise _bad(f"a {stamp.kind} item holds <{str(payload.tag)[:40]}>")
    return stamp, b"", "application/octet-stream", document  # BatchItem's defaults


def decode_batch(content: bytes) -> Batch:
    """The batch `content` holds (500/501/553 as the module docstring says).

    A batch in the layout the broker writes is read by `batch_fast.match_batch` (compiled),
    without lxml, to the result this function's general path gives; anything else goes that
    way."""
    link, items = batch_items(content)
    return Batch(link, tuple(BatchItem(*item) for item in items))


def batch_items(content: bytes) -> tuple[str, Sequence[ItemFields]]:
    """`decode_batch`'s link and items, each as `BatchItem`'s fields (stamp, content, content
    type, document): what a client unpacking every delivery takes, one object less per item."""
    fast = match_batch(content, MAX_BATCH_XML)
    return fast if fast is not None else _decode_general(content)


def _decode_general(content: bytes) -> tuple[str, Sequence[ItemFields]]:
    try:
        # No depth walk (a tenth of the decode): the structure checks below admit nothing
        # deeper than batch/item/seq, and libxml2 bounds the nesting while it parses.
        root = parse_hardened(content, max_bytes=MAX_BATCH_XML, what="batch")
    except UnsafeXml as exc:
        raise SyntaxError_(str(exc)) from None
    if root.tag != "batch":
        raise _bad(f"the document is <{str(root.tag)[:40]}>, not <batch>")
    link = validate_link_id(checked_attributes(root, {"link"}, {"link"}, _bad)["link"])
    if (root.text or "").strip() or any((c.tail or "").strip() for c in root):
        raise _bad("<batch> holds only <item>s")
    if not 0 < len(root) <= MAX_BATCH_ITEMS:
        raise _bad(f"a batch holds 1..{MAX_BATCH_ITEMS} items")
    try:
        return link, [_item(elem, link) for elem in root]
    except (RecursionError, MemoryError, UnicodeError) as exc:
        raise SyntaxError_(f"undecodable batch: {type(exc).__name__}") from None
