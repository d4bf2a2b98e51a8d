"""Rendering the delivery core's actions as APEX data: stamps, data and `<batch>` documents
(docs/robust-binding.md §2, §5.4).

A `Send` becomes, in its order: resets and heartbeats as data from `apex=pubsub@D`, one data per
journal entry addressed to all its recipients, each with its own stamp (the fan-out's one
socket write per subscriber), and for a link that takes batches its items packed into
`<batch>` documents. Within a `Send` a link's reset precedes its items, and a link's heartbeat
is never behind its data (the core puts none on a link with data waiting), so sending the
singles first keeps every link's order.

Each data on a link is sent with a tag per recipient: the link record it carries last (an
`AckTag`). The server tells the fan-out when that recipient answers `ok`, and that goes to the
acknowledgement log (broker/robust/acks.py): Kafka's evidence of what the subscriber took.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from typing import Protocol

from adapters.apex.batch_codec import (
    BATCH_ITEM_CONTENT,
    BatchPacker,
    batch_item,
    batch_item_content,
)
from adapters.apex.codec import BEEP_XML, Data, Option, TargetHop, plain_data
from adapters.apex.endpoint import Endpoint
from adapters.apex.inre import in_re_option
from adapters.apex.robust_codec import Heartbeat, LinkReset, RobustDocument, Withheld, encode_robust
from adapters.apex.robust_stamp import (
    STAMP_OPTION,
    Stamp,
    StampKind,
    data_stamp_link,
    data_stamp_message,
    data_stamp_xml,
    encode_stamp,
    stamp_option,
)
from broker.delivery import Outgoing, RepairReset, Send
from broker.names import DEFAULT_HOPS, SERVICE
from broker.records import JournalEntry
from broker.robust.acks import AckTag
from broker.robust.link_records import LinkKind, LinkRecord

__all__ = ["InRe", "Renderer", "SendData"]

#: Topics whose origin endpoint is kept (past it the cache starts over).
_ORIGINS_LIMIT = 65_536
_DATA, _HEARTBEAT, _RESET = LinkKind.DATA, LinkKind.HEARTBEAT, LinkKind.RESET


#: (entry, subscriber, link) -> the subscription ids the delivery satisfied, None: no InRe
InRe = Callable[[JournalEntry, str, str], "tuple[str, ...] | None"]


class SendData(Protocol):
    """`ApexServer.send`: route data; `tags`, per recipient, what its `ok` acknowledges."""

    def __call__(self, data: Data, tags: Mapping[Endpoint, object] | None = None) -> None: ...


def ack_tag(record: LinkRecord) -> AckTag:
    return AckTag(record.link, record.epoch, record.ordinal, record.link_seq)


def _no_in_re(_entry: JournalEntry, _who: str, _link: str) -> tuple[str, ...] | None:
    return None


@functools.lru_cache(maxsize=65536)
def endpoint_of(who: str) -> Endpoint:
    """Subscribers recur on every delivery; parse each once."""
    return Endpoint.parse(who)


def _stamp_xml(rec: LinkRecord, entry: JournalEntry, refilled: bool = False) -> str:
    return data_stamp_xml(
        rec.link, rec.link_seq, epoch=rec.epoch, source=entry.source,
        source_seq=entry.source_seq, publish_type=str(entry.publish_type), topic=entry.topic,
        token=entry.permission_token, message_id=entry.message_id, time=entry.appended_at,
        refill=refilled, snapshot=rec.snapshot)


#: id(entry) -> (entry, its stamp's message part, its batch item's content part), for the
#: messages of one fan-out turn; the entry is kept so that a reused id never matches
_ItemParts = dict[int, tuple[JournalEntry, str, str]]


def _batch_data_item(rec: LinkRecord, entry: JournalEntry, refilled: bool,
                     known: _ItemParts, in_re: tuple[str, ...] | None = None) -> str:
    """`batch_data_item(_stamp_xml(rec, entry, refilled), …)`, with what depends only on the
    message (its stamp's message part, its content in base64) made once per message however
    many links of a fan-out turn it goes to (`known` keeps them for the turn)."""
    parts = known.get(id(entry))
    if parts is None or parts[0] is not entry:
        message = data_stamp_message(
            entry.source, entry.source_seq, str(entry.publish_type), entry.topic,
            token=entry.permission_token, message_id=entry.message_id, time=entry.appended_at)
        parts = known[id(entry)] = (
            entry, message, batch_item_content(entry.content, entry.content_type))
    stamp = data_stamp_link(rec.link, rec.link_seq, parts[1], epoch=rec.epoch,
                            refill=refilled, snapshot=rec.snapshot, in_re=in_re or ())
    return f"<item>{stamp}{parts[2]}"


def _data_stamp(rec: LinkRecord, entry: JournalEntry, refilled: bool = False) -> Option:
    return Option(STAMP_OPTION, content=_stamp_xml(rec, entry, refilled))


def _hop_option(entry: JournalEntry, trans_id: int) -> Option:
    hops = int(entry.options.get("dataHopping", DEFAULT_HOPS))
    return Option("dataHopping", trans_id, target_hop=TargetHop.ALL, must_understand=True,
                  content=f"<dataHopping noMoreThan='{hops}' reportErrors='true' />")


def withheld_stamp(record: LinkRecord) -> Stamp:
    """§2.4: the stamp of a refilled seq whose message the subscriber may no longer see."""
    return Stamp(record.link, record.link_seq, StampKind.WITHHELD, record.epoch, refill=True)


class Packer:
    """Sends one link's items packed into `<batch>` documents (§5.4), in link order: what
    cannot travel in a batch (a reset, content over BATCH_ITEM_CONTENT) goes on its own, after
    what was packed before it."""

    def __init__(self, renderer: Renderer, link: str, limit: int,
                 known: _ItemParts | None = None) -> None:
        """`known`: the message parts of the turn, shared by the turn's packers."""
        self._renderer = renderer
        self._known: _ItemParts = {} if known is None else known
        self._send = renderer.send
        self._packer = BatchPacker(link, limit)
        self._to: Endpoint | None = None
        #: the record the batch being packed carries last
        self._tag: AckTag | None = None

    def data(self, to: Endpoint, record: LinkRecord, entry: JournalEntry,
             refilled: bool = False, who: str | None = None) -> None:
        renderer = self._renderer
        if len(entry.content) > BATCH_ITEM_CONTENT:
            self.single(to, renderer.delivery(to, record, entry, refilled, who), record)
        else:
            in_re = renderer.in_re(entry, who or str(to), record.link)
            self._add(to, _batch_data_item(record, entry, refilled, self._known, in_re),
                      ack_tag(record))

    def item(self, to: Endpoint, stamp: Stamp, doc: RobustDocument, record: LinkRecord,
             ) -> None:
        """A heartbeat or withheld item."""
        self._add(to, batch_item(encode_stamp(stamp), encode_robust(doc)), ack_tag(record))

    def single(self, to: Endpoint, data: Data, record: LinkRecord) -> None:
        self.close()
        self._send(data, {to: ack_tag(record)})

    def close(self) -> None:
        done = self._packer.flush()
        if done is not None and self._to is not None:
            self._batch(self._to, done)

    def _batch(self, to: Endpoint, doc: bytes) -> None:
        tags = None if self._tag is None else {to: self._tag}
        self._send(plain_data(self._renderer.endpoint, (to,), doc, BEEP_XML), tags)

    def _add(self, to: Endpoint, item: str, tag: AckTag) -> None:
        if self._to is not None and to is not self._to and to != self._to:
            self.close()  # a batch goes to one subscriber
        self._to = to
        done = self._packer.add(item)
        if done is not None:  # the batch before this item
            self._batch(to, done)
        self._tag = tag


class Renderer:
    """Turns delivery actions into data for `send` (ApexServer.send)."""

    def __init__(self, domain: str, heartbeat_ms: int, send: SendData,
                 trans_ids: itertools.count[int], in_re: InRe = _no_in_re) -> None:
        """`in_re`: the subscription ids a delivery satisfied, for its InRe (None: none)."""
        self.endpoint = Endpoint(SERVICE, domain)
        self.in_re = in_re
        self.domain = domain
        self.heartbeat_ms = heartbeat_ms
        self.send = send
        self._trans_ids = trans_ids
        #: topic -> the endpoint its data come from (`origin`)
        self._origins: dict[str, Endpoint] = {}

    def packer(self, link: str, limit: int) -> Packer:
        return Packer(self, link, limit)

    def render(self, action: Send) -> None:
        """Send what the core assigned, in its order (see the module docstring)."""
        by_entry: dict[int, tuple[JournalEntry, list[Endpoint], list[tuple[Option, ...]],
                                  dict[Endpoint, object]]] = {}
        packers: dict[str, Packer] = {}
        known: _ItemParts = {}
        packed, send = action.packed, self.send
        for item in action.items:
            who, record, entry, repair = item
            to = endpoint_of(who)
            link = record.link
            packer = packers.get(link)
            if packer is None and link in packed:
                packer = packers[link] = Packer(self, link, packed[link], known=known)
            if entry is None:
                if packer is not None and record.kind is _HEARTBEAT:
                    packer.item(to, *self.link_stamp(record), record)
                    continue
                data = self.link_data(to, record, repair=repair)
                if packer is not None:
                    packer.single(to, data, record)
                else:
                    send(data, {to: ack_tag(record)})
                continue
            if packer is not None:
                packer.data(to, record, entry, who=who)
                continue
            group = by_entry.get(id(entry))
            if group is None:
                group = by_entry[id(entry)] = (entry, [], [], {})
            group[1].append(to)
            group[3][to] = ack_tag(record)
            ids = self.in_re(entry, who, link)
            group[2].append((_data_stamp(record, entry),) if ids is None else
                            (_data_stamp(record, entry), in_re_option(ids)))
        for entry, recipients, options, tags in by_entry.values():
            send(Data(self.origin(entry.topic), tuple(recipients), entry.content,
                      entry.content_type, options=(_hop_option(entry, next(self._trans_ids)),),
                      recipient_options=tuple(options),
                      content_ref="#Content" if entry.content_type == BEEP_XML else None), tags)
        for packer in packers.values():
            packer.close()

    def refill(self, to: Endpoint, item: Outgoing, withheld: bool,
               packer: Packer | None) -> None:
        """One item of a gap fill (refill='true'): its data, a heartbeat or reset again, or
        for a message the subscriber may no longer see a `withheld` stamp without content."""
        record, entry = item.record, item.entry
        if entry is None:
            if packer is not None and record.kind is not _RESET:
                packer.item(to, *self.link_stamp(record, refilled=True), record)
                return
            data = self.link_data(to, record, refilled=True)
        elif withheld:
            if packer is not None:
                packer.item(to, withheld_stamp(record), Withheld(), record)
                return
            data = Data(self.endpoint, (to,), encode_robust(Withheld()), BEEP_XML,
                        recipient_options=((stamp_option(withheld_stamp(record)),),),
                        content_ref="#Content")
        elif packer is not None:
            packer.data(to, record, entry, refilled=True, who=item.who)
            return
        else:
            data = self.delivery(to, record, entry, refilled=True, who=item.who)
        if packer is not None:
            packer.single(to, data, record)
        else:
            self.send(data, {to: ack_tag(record)})

    def origin(self, topic: str) -> Endpoint:
        """apex=pubsub/TOPIC@D, what a topic's data come from (built once per topic: an
        Endpoint checks its parts)."""
        origin = self._origins.get(topic)
        if origin is None:
            if len(self._origins) >= _ORIGINS_LIMIT:
                self._origins.clear()
            origin = self._origins[topic] = Endpoint(SERVICE, self.domain, topic)
        return origin

    def delivery(self, to: Endpoint, record: LinkRecord, entry: JournalEntry,
                 refilled: bool = False, who: str | None = None) -> Data:
        """One data carrying `entry` on `record`'s link seq to `to` alone (`who`: `to` as the
        subscription names it), with its InRe."""
        ids = self.in_re(entry, who or str(to), record.link)
        stamp = _data_stamp(record, entry, refilled)
        return Data(self.origin(entry.topic), (to,), entry.content, entry.content_type,
                    recipient_options=((stamp,) if ids is None else
                                       (stamp, in_re_option(ids)),),
                    content_ref="#Content" if entry.content_type == BEEP_XML else None)

    def link_data(self, to: Endpoint, record: LinkRecord, refilled: bool = False, *,
                  repair: RepairReset | None = None) -> Data:
        """A heartbeat or reset of `record`'s link, as data from apex=pubsub@D; `repair`: the
        reset answers that source repair."""
        stamp, doc = self.link_stamp(record, refilled, repair)
        return Data(self.endpoint, (to,), encode_robust(doc), BEEP_XML,
                    recipient_options=((stamp_option(stamp),),), content_ref="#Content")

    def link_stamp(self, record: LinkRecord, refilled: bool = False,
                   repair: RepairReset | None = None) -> tuple[Stamp, RobustDocument]:
        doc: RobustDocument
        if record.kind is _RESET and repair is not None:
            stamp = Stamp(record.link, 0, StampKind.RESET, record.epoch,
                          time=min(repair.time, record.recorded_at), repair=repair.trans_id)
            doc = LinkReset("source repair")
        elif record.kind is _RESET:
            stamp = Stamp(record.link, 0, StampKind.RESET, record.epoch, time=record.recorded_at)
            doc = LinkReset("new link" if record.ordinal == 0 else None)
        else:
            stamp = Stamp(record.link, record.link_seq, StampKind.HEARTBEAT, record.epoch,
                          time=record.recorded_at, refill=refilled)
            doc = Heartbeat(self.heartbeat_ms)
        return stamp, doc
