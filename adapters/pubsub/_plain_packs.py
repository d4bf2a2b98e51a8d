"""A plain subscriber's live data packed: one forward turn's messages for it in `<publications>`
documents (docs/robust-binding.md §2.6, "Deliveries"), for a subscriber that said `batch='N'`.

A plain delivery is otherwise one APEX data per message and subscriber, each with its own
dataHopping option, relay decision, MSG and RPY: flat out that was most of what a plain
subscriber cost the broker beyond the publication itself, and the reason a plain subscriber
spent 18 µs a message where a robust one, whose link packs a `<batch>`, spent 11
(docs/bench-peers.md). A robust link's `<batch>` needs a link and its stamps; a plain
subscription has neither, so its messages travel as the publications they were: topic,
content, and the ids of the subscriber's subscriptions each satisfied (`inre`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from adapters.apex.batch_codec import BATCH_BYTES
from adapters.apex.codec import BEEP_XML, Data, Option, TargetHop
from adapters.apex.endpoint import Endpoint
from adapters.apex.publications_codec import (
    publication_content,
    publication_element,
    publications_document,
)
from broker.names import DEFAULT_HOPS
from broker.records import JournalEntry

from ._deliveries import SendData, endpoint_of

__all__ = ["PlainPacks"]

#: What a publication element takes beyond its base64 content, about (its tags, topic, type).
_ELEMENT = 160


class PlainPacks:
    """One forward turn's packs: `add` each message for each subscriber that takes them packed,
    in order; `flush` one subscriber's (before a message goes to it on its own), `close` all.
    A pack of one message goes as the data of its own it would have been (`alone`), as a
    publisher's lone publication does; a message's content is encoded once per turn, whatever
    the number of subscribers it is packed for."""

    def __init__(self, endpoint: Endpoint, send: SendData, ids: itertools.count[int],
                 limit: Callable[[str], int],
                 alone: Callable[[str, JournalEntry, tuple[str, ...] | None], None]) -> None:
        """`endpoint`: the service's (the documents' originator); `ids`: the data options'
        ids; `limit(subscriber)`: the most publications it takes in one data; `alone`: send
        one message to one subscriber as a data of its own."""
        self._endpoint, self._send, self._ids = endpoint, send, ids
        self._limit, self._alone = limit, alone
        #: subscriber -> (its messages with their InRe, about how many octets they take)
        self._packs: dict[str, tuple[list[tuple[JournalEntry, tuple[str, ...] | None]], int]] = {}
        #: id(entry) -> the entry and its content element, for this turn
        self._contents: dict[int, tuple[JournalEntry, str]] = {}

    def add(self, subscriber: str, entry: JournalEntry, in_re: tuple[str, ...] | None) -> None:
        size = len(entry.content) * 4 // 3 + _ELEMENT
        pack = self._packs.get(subscriber)
        if pack is not None and (len(pack[0]) >= self._limit(subscriber)
                                 or pack[1] + size > BATCH_BYTES):
            self.flush(subscriber)
            pack = None
        if pack is None:
            self._packs[subscriber] = ([(entry, in_re)], size)
        else:
            pack[0].append((entry, in_re))
            self._packs[subscriber] = (pack[0], pack[1] + size)

    def flush(self, subscriber: str) -> None:
        pack = self._packs.pop(subscriber, None)
        if pack is None:
            return
        items = pack[0]
        if len(items) == 1:
            self._alone(subscriber, *items[0])
            return
        hops = min(int(e.options.get("dataHopping", DEFAULT_HOPS)) for e, _ in items)
        option = Option("dataHopping", next(self._ids), target_hop=TargetHop.ALL,
                        must_understand=True,
                        content=f"<dataHopping noMoreThan='{hops}' reportErrors='true' />")
        self._send(Data(self._endpoint, (endpoint_of(subscriber),),
                        publications_document([publication_element(e.topic, self._content(e),
                                                                   None, in_re)
                                               for e, in_re in items]),
                        BEEP_XML, options=(option,)))  # a MIME part: the fast readers'

    def close(self) -> None:
        for subscriber in list(self._packs):
            self.flush(subscriber)

    def _content(self, entry: JournalEntry) -> str:
        known = self._contents.get(id(entry))
        if known is not None and known[0] is entry:
            return known[1]
        # the entry is kept with it: an id is only unique among live objects
        content = publication_content(entry.content, entry.content_type)
        self._contents[id(entry)] = (entry, content)
        return content
