"""A `<batch>` in the layout the broker writes, read by the compiled twin of the general path.

Theory of operation
-------------------
Every live delivery a batching subscriber gets is a `<batch>` (docs/robust-binding.md §5.4), and
at a trickle each holds one item: the hardened lxml parse, the walk over its elements and the
stamp checks cost a subscriber more than everything else it does per delivery. Nearly every
batch was written by `BatchPacker` from `data_stamp_link` / `encode_stamp` parts, so it has
one exact layout:

    <batch link='L'><item><seq link='L'[ epoch='E'] linkseq='N' kind='data' source='S'
    sourceseq='N' type='T' topic='T'[ token='K'][ messageid='M'][ time='N'][ snapshot='true']
    [ inre='I'][ refill='true'] /><content type='C'>BASE64</content></item>…</batch>

(`inre`, the ids of the subscriptions a message satisfied, comes on the items of a link that
carries a selecting subscription: W3's every item.)

(one line, no blanks between tags). `match_batch` recognises exactly that and returns the link
and items; anything else, however legitimate (another attribute order, blanks, an entity, a
heartbeat or withheld item, a non-ASCII octet), is declined (None) and `decode_batch` parses it
the general way (`_batch_codec._decode_general`), which is the one definition of what is
accepted. There is one fast reader, and it is compiled: `scan_batch` in `_speedups.c`. Where it
is not built (no C compiler, or `APEXPS_PURE_PYTHON=1`) every batch takes the general path,
slower and with the same results.

The contract: `match_batch` accepts only input the general path accepts, with an equal result,
and never raises. The C checks the layout:

* The document is ASCII (no encoding question, no character XML forbids beyond the controls)
  and at most `MAX_BATCH_XML` octets; it starts with `<batch` and ends with `</batch>`, so no
  declaration, DOCTYPE, comment or processing instruction can sit anywhere.
* Attribute values exclude `&`, `<`, `>`, `'` and every control character, so no entity or
  markup hides in them and lxml's attribute-value normalisation (tabs and newlines to blanks)
  has nothing to change: the text is the value. Each attribute appears at most once, in its
  fixed place, so duplicates (which lxml refuses) cannot match.
* Every item names the batch's link (the general path refuses another), there are
  1..`MAX_BATCH_ITEMS` of them, the numbers and message-id are within the general path's
  bounds, and the content is strict base64 in its canonical form.

What only the general path's own functions can judge is checked here, in Python: the link,
source (normalised by `Endpoint.parse` as there), publish type, topic, token and inre, once per
combination (a data `Stamp` built by its checking constructor, then remembered in `_known`);
any failure declines. Each item's stamp is that checked one with its numbers put in
(`varied_stamp`).

What the C leaves undecided (it returns True: a heartbeat item, base64 that is not canonical,
arguments of unexpected types) is declined too, so the general path decides it. The layout
rules above, spelled as regular expressions, live on as the test oracle in
tests/apex/batch_oracle.py; tests/apex/test_batch_speedups.py holds the C to it, and
tests/apex/test_batch_fast.py holds `match_batch` to the general path, on arbitrary input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from adapters import speedups
from broker.names import validate_topic
from broker.records import PublishType
from broker.robust.linkid import validate_link_id
from common.errors import ApexpsError

from ._robust_syntax import MAX_LONG, source_name
from .robust_codec import Heartbeat, Withheld
from .robust_stamp import Stamp, StampKind, varied_stamp

__all__ = ["ItemFields", "match_batch"]

#: One item as `BatchItem`'s fields: stamp, content, content type, heartbeat or withheld
#: document (the fast path reads only data items).
ItemFields = tuple[Stamp, bytes, str, Heartbeat | Withheld | None]

#: Data stamps checked so far, by what repeats from one item to the next: link,
#: epoch, source, type, topic, token, snapshot, refill and inre, as `scan_batch` spells them.
_known: dict[tuple[str | None, ...], Stamp] = {}
#: Most combinations remembered: hostile batches naming ever-new sources start it over.
_KNOWN_LIMIT = 1024

#: One data item as `scan_batch` reads it: `_known`'s key, link seq, source seq, time,
#: message-id, decoded content and content type.
_ScannedItem = tuple[tuple[str | None, ...], int, int, int | None, str | None, bytes, str]
#: `scan_batch(content, max_bytes)`: the layout checks in C (None if not built, or built from
#: an older source without it: tests/test_speedups.py says so). It returns `(link, items)`,
#: None to decline, or True where it leaves the decision to the general path.
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
    link, epoch, source, ptype, topic, token, snapshot, refill, in_re = key
    assert link is not None and source is not None and ptype is not None and topic is not None
    try:
        return Stamp(link=validate_link_id(link), link_seq=1, kind=StampKind.DATA,
                      epoch=0 if epoch is None else _bounded(epoch, 0, MAX_LONG),
                      source=source_name(source), source_seq=1, publish_type=PublishType(ptype),
                      topic=validate_topic(topic), token=token, refill=refill is not None,
                      snapshot=snapshot is not None,
                      in_re=() if in_re is None else tuple(in_re.split(" ")))
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
    broker's layout; None to decline (always, where the twin is not built). Never raises."""
    if _scan_batch is None:
        return None
    scanned = _scan_batch(content, max_bytes)
    if scanned is None or scanned is True:
        return None
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
