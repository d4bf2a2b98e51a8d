"""A publications document's one answer, and each publisher call's outcome read back from it
(docs/robust-binding.md §2.6): `ok` only when every publication is durable; otherwise the first
refusal, naming the durable ones, so that the client answers every call exactly. Pure: the
service's `_AllOutcomes` and the client's `_answer_run`, no Kafka, no wire."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given
from hypothesis import strategies as st

from adapters.apex.ticket import TicketResult
from adapters.client.pubsub_client import _answer_run
from adapters.pubsub.handler import _AllOutcomes
from common.errors import ApexpsError, JournalUnavailable, NotTaken

_outcomes = st.lists(st.sampled_from(["ok", "421", "550"]), max_size=40)


def _result(kind: str) -> TicketResult:
    return () if kind == "ok" else (JournalUnavailable("Kafka did not take it") if kind == "421"
                                    else NotTaken("no such topic"))


def _answer(kinds: list[str], order: list[int]) -> TicketResult:
    answer = _AllOutcomes(len(kinds))
    got: list[TicketResult] = []
    answer.ticket.then(got.append)
    for n in order:  # the journal settles them in any order
        assert not got
        answer.settled(n, _result(kinds[n]))
    assert len(got) == 1
    return got[0]


@given(_outcomes, st.randoms())
def test_each_call_gets_its_own_publications_outcome(kinds: list[str],
                                                     rnd: random.Random) -> None:
    order = list(range(len(kinds)))
    rnd.shuffle(order)
    reply = _answer(kinds, order)
    if all(k == "ok" for k in kinds):
        assert reply == ()
    else:
        first = next(k for k in kinds if k != "ok")
        assert isinstance(reply, ApexpsError) and int(reply.code) == int(first)

    async def client_side() -> list[str]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in kinds]
        sent: asyncio.Future[None] = loop.create_future()
        if isinstance(reply, BaseException):
            # what the relay's error reply becomes at the client: its code and its text
            sent.set_exception(ApexpsError.for_code(reply.code, str(reply)))
        else:
            sent.set_result(None)
        _answer_run([("q", b"", "a/b", None, f) for f in futures], sent)
        return ["ok" if f.exception() is None else str(int(f.exception().code))  # type: ignore[union-attr]
                for f in futures]

    outcomes = asyncio.run(client_side())
    assert [k == "ok" for k in outcomes] == [k == "ok" for k in kinds]
    if isinstance(reply, ApexpsError):  # a refused call carries the first refusal's code
        assert {k for k in outcomes if k != "ok"} == {str(int(reply.code))}


def test_an_empty_document_is_answered_at_once() -> None:
    got: list[TicketResult] = []
    _AllOutcomes(0).ticket.then(got.append)
    assert got == [()]


def test_a_lost_connection_fails_every_call_of_the_document() -> None:
    async def run() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(3)]
        futures[1].cancel()  # its caller gave up
        sent: asyncio.Future[None] = loop.create_future()
        sent.set_exception(ConnectionResetError())
        _answer_run([("q", b"", "a/b", None, f) for f in futures], sent)
        return [None if f.cancelled() else f.exception() for f in futures]

    first, gone, last = asyncio.run(run())
    assert isinstance(first, ConnectionResetError) and isinstance(last, ConnectionResetError)
    assert gone is None
