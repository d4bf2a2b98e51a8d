"""`PublishGate`: the journal's front door for publications, dropping copies (robust-binding §8).

Theory of operation
-------------------
The pubsub service appends what arrived in one event-loop turn as one batch. The gate asks the
`PubseqLedger` about every publication that carries a publisher seq and hands the journal only
those to APPEND, in their order; a DUPLICATE is answered at once (`AlreadyDurable`), a copy
that must WAIT is answered when its original's outcome comes. The caller gets one callback per
batch, with one outcome per publication in the order given, exactly as from
`Journal.append_many`: `Appended`, `AlreadyDurable`, or the `ApexpsError` that refused it. So
the batch of a copy that waits is answered no sooner than the batch its original is in, which
is (the same source in the same partition) no later than it would have been anyway.

Publications without a publisher seq pass straight through (a batch of only those is one
`Journal.append_many` call, as before the gate). A batch the journal refuses as a whole
(invalid input) is retried one publication at a time, so one bad publication does not sink the
rest; the bad one's outcome is its error.

Threads. Nothing here is thread-safe: every call, and every outcome, is on one thread (the
event loop). Journal outcomes arrive on Kafka's poll thread; the gate hops them over with
`defer` (the event loop's `call_soon_threadsafe`), so the ledger never needs a lock and a
failed original's takeover is appended from the loop, never from inside a delivery report.
Two connections attached as the same endpoint share the one ledger of their source.

`position(source, callback)` answers the `pubstatus` query: once every publication of the source
that was in flight when it was asked has its outcome, the journal's `PublisherPosition`. A
restarted publisher continues after that pubseq; what it sends is then never mistaken for a
copy of something of its previous life still in flight.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import structlog

from broker.journal import Appended, BatchCallback, PublisherPosition
from broker.pubseq import PubseqLedger, Verdict
from broker.records import Publication
from common.errors import ApexpsError, JournalUnavailable

__all__ = ["AlreadyDurable", "GateCallback", "JournalPort", "Outcome", "PublishGate"]

log = structlog.get_logger(__name__)


class AlreadyDurable(NamedTuple):
    """A publication answered `ok` without being appended: its (source, pubseq) is durable."""

    source: str
    publisher_seq: int


Outcome = Appended | AlreadyDurable | ApexpsError
#: One outcome per publication of a `PublishGate.append_many`, in the order given.
GateCallback = Callable[[list[Outcome]], None]


class JournalPort(Protocol):
    """What the gate needs of `broker.journal.Journal`."""

    def append_many(self, pubs: Sequence[Publication], callback: BatchCallback) -> list[int]:
        ...

    def publisher_position(self, source: str) -> PublisherPosition: ...


def _now(call: Callable[[], None]) -> None:
    call()


class _Batch:
    """One `append_many` call: its publications and the outcomes known so far."""

    __slots__ = ("callback", "left", "outcomes", "pubs")

    def __init__(self, pubs: Sequence[Publication], callback: GateCallback) -> None:
        self.pubs = pubs
        self.callback = callback
        self.outcomes: list[Outcome | None] = [None] * len(pubs)
        self.left = len(pubs)

    def resolve(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome
        self.left -= 1
        if self.left == 0:
            try:
                self.callback(self.outcomes)  # type: ignore[arg-type]  # no None is left
            except Exception:  # the caller's bug must not stop other outcomes
                log.exception("publish gate callback failed")


#: A publication of a batch: the batch and its index there (the ledger's waiter).
_Ref = tuple[_Batch, int]


class PublishGate:
    """See the module docstring."""

    def __init__(self, journal: JournalPort,
                 defer: Callable[[Callable[[], None]], object] = _now) -> None:
        """`defer(call)` runs `call` on the gate's thread (for an asyncio caller:
        `loop.call_soon_threadsafe`); the default runs it at once, for single-threaded use."""
        self._journal = journal
        self._defer = defer
        self._ledger: PubseqLedger[_Ref] = PubseqLedger(self._seed)
        #: source -> queries waiting for these pubseqs to settle
        self._watchers: dict[str, list[tuple[set[int], Callable[[PublisherPosition], None]]]] \
            = {}
        #: copies answered ok without a record of their own so far (for logs and tests)
        self.copies = 0

    def _seed(self, source: str) -> tuple[int, frozenset[int]]:
        pos = self._journal.publisher_position(source)
        return pos.publisher_seq, pos.failed

    def append_many(self, pubs: Sequence[Publication], callback: GateCallback) -> None:
        """Append what is new of `pubs`; `callback` gets one outcome per publication once all
        are known (at once for an empty batch)."""
        if not pubs:
            callback([])
            return
        batch = _Batch(pubs, callback)
        todo: list[_Ref] = []
        copies: list[int] = []
        admit = self._ledger.admit
        for i, pub in enumerate(pubs):
            pubseq = pub.publisher_seq
            if pubseq is None:
                todo.append((batch, i))
                continue
            verdict = admit(pub.source, pubseq, (batch, i))
            if verdict is Verdict.APPEND:
                todo.append((batch, i))
            elif verdict is Verdict.DUPLICATE:
                copies.append(i)
        if copies:
            self.copies += len(copies)
            log.info("publications already durable, not journaled again", count=len(copies),
                     source=pubs[copies[0]].source, first=pubs[copies[0]].publisher_seq)
        self._append(todo)
        for i in copies:
            pub = pubs[i]
            batch.resolve(i, AlreadyDurable(pub.source, pub.publisher_seq or 0))

    def position(self, source: str, callback: Callable[[PublisherPosition], None]) -> None:
        """Call back with `source`'s journal position once what is in flight now settled."""
        pending = set(self._ledger.in_flight(source))
        if not pending:
            callback(self._journal.publisher_position(source))
            return
        self._watchers.setdefault(source, []).append((pending, callback))

    # --- internals ----------------------------------------------------------------------

    def _append(self, todo: list[_Ref]) -> None:
        if not todo:
            return
        pubs = [batch.pubs[i] for batch, i in todo]

        def durable(results: list[Appended | JournalUnavailable]) -> None:
            self._defer(functools.partial(self._settled, todo, results))

        try:
            self._journal.append_many(pubs, durable)
        except ApexpsError as exc:
            if len(todo) == 1:
                self._settled(todo, [exc])
                return
            for ref in todo:  # one bad publication must not sink the rest
                self._append([ref])

    def _settled(self, todo: list[_Ref], results: Sequence[Appended | ApexpsError]) -> None:
        takeovers: list[_Ref] = []
        touched: set[str] = set()
        for (batch, i), result in zip(todo, results, strict=True):
            pub = batch.pubs[i]
            pubseq = pub.publisher_seq
            if pubseq is not None:
                released = self._ledger.settle(pub.source, pubseq,
                                               durable=isinstance(result, Appended))
                self.copies += len(released.acked)
                for waiter, index in released.acked:
                    waiter.resolve(index, AlreadyDurable(pub.source, pubseq))
                if released.takeover is not None:
                    takeovers.append(released.takeover)
                touched.add(pub.source)
            batch.resolve(i, result)
        self._append(takeovers)
        for source in touched & self._watchers.keys():
            self._answer_watchers(source)

    def _answer_watchers(self, source: str) -> None:
        flying = self._ledger.in_flight(source)
        waiting: list[tuple[set[int], Callable[[PublisherPosition], None]]] = []
        ready: list[Callable[[PublisherPosition], None]] = []
        for pending, callback in self._watchers.pop(source):
            left = pending & flying
            if left:
                waiting.append((left, callback))
            else:
                ready.append(callback)
        if waiting:
            self._watchers[source] = waiting
        if ready:
            pos = self._journal.publisher_position(source)
            for callback in ready:
                try:
                    callback(pos)
                except Exception:  # the caller's bug must not stop other outcomes
                    log.exception("publisher position callback failed")
