"""Publisher seqs: which publications to journal and which are copies (robust-binding §8).

Theory of operation
-------------------
A publisher numbers its publications with a rising publisher seq (pubseq: 1, 2, 3, …; skipping
is allowed, going back is not) and, on a new connection, first sends again everything it has no
`ok` for, oldest first, then what is new. The broker journals each (source, pubseq) at most
once and answers every copy `ok` once that one record is durable. Per source the ledger knows:

- `durable`: the highest pubseq durable in the journal, the *high-water mark*;
- `failed`: pubseqs whose append failed and that no copy has made durable since. Below the mark
  these are the one exception to "below the mark is a copy": their resend is journaled;
- `in_flight`: pubseqs being appended right now, each with the copies waiting for its outcome.

`admit(source, pubseq, waiter)` decides for one arriving copy, in this order:

1. in flight                    → WAIT: `waiter` is answered with the original's outcome;
2. ≤ the mark and not failed    → DUPLICATE: answer `ok` now, append nothing;
3. otherwise                    → APPEND: in flight from now on.

So a pubseq that arrives after a higher one of its source became durable is a duplicate even if
it never arrived before: that is the price of a rule the broker can keep in one number per
source, and why pubseqs must rise (the publisher's part of the contract).

`settle(source, pubseq, durable)` books the outcome of an APPEND. Durable: the mark rises to
it (if higher), and every waiter is answered `ok`. Failed: the first waiter is appended in the
original's place (the pubseq stays in flight; the other waiters now wait on that one), or, with
nobody waiting, the pubseq joins `failed` until a copy of it arrives.

Invariants (tests/broker/test_pubseq.py drives random interleavings against them):
- a pubseq is appended only while it is neither durable nor in flight, so the journal holds
  each (source, pubseq) at most once;
- a copy answered `ok` is durable, given a publisher that keeps its side (rising pubseqs,
  resends first on a new connection) and Kafka's order within a partition (a source's record
  is durable only with every earlier one of it that Kafka did not refuse);
- every pubseq that became durable is answered `ok` to the copy that was appended.

Sans-I/O and not thread-safe: `broker.publish_gate` drives it from one thread. The waiter is
whatever the caller needs to find the copy again; the ledger only hands it back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, NamedTuple, TypeVar

__all__ = ["PubseqLedger", "Settled", "Verdict"]

W = TypeVar("W")


class Verdict(Enum):
    """What to do with one arriving copy of a publication."""

    #: journal it: nothing of this pubseq is durable or in flight
    APPEND = "append"
    #: answer ok without journaling: this pubseq is durable already
    DUPLICATE = "duplicate"
    #: answer with the outcome of the copy in flight
    WAIT = "wait"


class Settled(NamedTuple, Generic[W]):
    """What an outcome releases."""

    #: waiters to answer ok (their pubseq is durable now)
    acked: list[W]
    #: the waiter to append in place of an original that failed, if any waited
    takeover: W | None


@dataclass(slots=True)
class _Source(Generic[W]):
    durable: int = 0
    failed: set[int] = field(default_factory=set)
    #: pubseq in flight -> the copies waiting for its outcome
    in_flight: dict[int, list[W]] = field(default_factory=dict)


class PubseqLedger(Generic[W]):
    """The dedupe state of every source; see the module docstring."""

    def __init__(self, seed: Callable[[str], tuple[int, Iterable[int]]] | None = None) -> None:
        """`seed(source)`: (highest durable pubseq, failed pubseqs) as the journal recovered
        them, asked once per source on first sight. Default: nothing durable."""
        self._seed = seed
        self._sources: dict[str, _Source[W]] = {}

    def _source(self, source: str) -> _Source[W]:
        st = self._sources.get(source)
        if st is None:
            st = self._sources[source] = _Source()
            if self._seed is not None:
                durable, failed = self._seed(source)
                st.durable, st.failed = durable, set(failed)
        return st

    def admit(self, source: str, pubseq: int, waiter: W) -> Verdict:
        """Decide for one arriving copy of (source, pubseq); APPEND puts it in flight."""
        st = self._source(source)
        waiting = st.in_flight.get(pubseq)
        if waiting is not None:
            waiting.append(waiter)
            return Verdict.WAIT
        if pubseq <= st.durable and pubseq not in st.failed:
            return Verdict.DUPLICATE
        st.in_flight[pubseq] = []
        return Verdict.APPEND

    def settle(self, source: str, pubseq: int, *, durable: bool) -> Settled[W]:
        """Book the outcome of the append `admit` said APPEND for (or a takeover)."""
        st = self._source(source)
        waiting = st.in_flight.pop(pubseq)  # KeyError: the caller settled something not sent
        if durable:
            st.durable = max(st.durable, pubseq)
            st.failed.discard(pubseq)
            return Settled(waiting, None)
        if waiting:
            first, rest = waiting[0], waiting[1:]
            st.in_flight[pubseq] = rest
            return Settled([], first)
        st.failed.add(pubseq)
        return Settled([], None)

    def durable(self, source: str) -> int:
        """The source's high-water mark: its highest durable pubseq (0: none)."""
        return self._source(source).durable

    def failed(self, source: str) -> frozenset[int]:
        """Pubseqs of `source` whose append failed and that no copy has made durable since."""
        return frozenset(self._source(source).failed)

    def in_flight(self, source: str) -> frozenset[int]:
        """Pubseqs of `source` being appended now."""
        st = self._sources.get(source)
        return frozenset() if st is None else frozenset(st.in_flight)
