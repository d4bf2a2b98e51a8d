"""`PubsubClient.publish` sends a turn's publications in one data (docs/robust-binding.md
§2.6): in call order, a single one as a data of its own, one with a publisher seq at once and
alone, and the others still sent when the call that gathers them is cancelled. The real
PubsubClient over a fake ApexClient that records what is written, in the order it is written
(the wire's own order is the integration test's: tests/integration/test_publications.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from adapters.apex.codec import Data, Option
from adapters.apex.endpoint import Endpoint
from adapters.apex.publications_codec import decode_publications
from adapters.client.pubsub_client import PubsubClient

ME = Endpoint.parse("pub@example.com")


class RecordingApex:
    """Stands in for ApexClient: each `send` is written (recorded) in its first step, as
    ApexClient writes a MSG, and answered `ok` at once."""

    timeout = 5.0

    def __init__(self) -> None:
        self.written: list[tuple[str, bytes]] = []

    def deliver_to(self, callback: Callable[[Data | None], None]) -> None:
        pass

    async def send(self, originator: Endpoint, recipients: Iterable[Endpoint], content: bytes,
                   content_type: str = "application/octet-stream", *,
                   options: Iterable[Option] = ()) -> None:
        (to,) = recipients
        self.written.append((str(to), content))


def _contents(written: list[tuple[str, bytes]]) -> list[list[bytes]]:
    """What each write carried: a document's contents, or the one data's."""
    return [[p.content for p in decode_publications(c)] if to == "apex=pubsub@example.com"
            else [c] for to, c in written]


def _run(steps: Callable[[PubsubClient, RecordingApex], object]) -> list[list[bytes]]:
    async def run() -> list[list[bytes]]:
        apex = RecordingApex()
        client = PubsubClient(apex, ME)  # type: ignore[arg-type]
        await steps(client, apex)  # type: ignore[misc]
        return _contents(apex.written)

    return asyncio.run(run())


def test_a_turns_publications_go_in_one_document_in_call_order() -> None:
    async def steps(client: PubsubClient, apex: RecordingApex) -> None:
        await asyncio.gather(*(client.publish("q.a", b"m%d" % i) for i in range(5)))
        await client.publish("q.a", b"alone")

    assert _run(steps) == [[b"m0", b"m1", b"m2", b"m3", b"m4"], [b"alone"]]


def test_the_next_turns_publications_follow_the_documents_before_them() -> None:
    async def steps(client: PubsubClient, apex: RecordingApex) -> None:
        first = [asyncio.create_task(client.publish("q.a", b"a%d" % i)) for i in range(3)]
        await asyncio.sleep(0)  # they gather; these come a turn later, as another document
        later = [asyncio.create_task(client.publish("q.a", b"b%d" % i)) for i in range(2)]
        await asyncio.gather(*first, *later)

    assert _run(steps) == [[b"a0", b"a1", b"a2"], [b"b0", b"b1"]]


def test_a_publication_with_a_publisher_seq_goes_at_once_and_alone() -> None:
    async def steps(client: PubsubClient, apex: RecordingApex) -> None:
        plain = [asyncio.create_task(client.publish("q.a", b"p%d" % i)) for i in range(2)]
        await asyncio.sleep(0)
        await client.publish("q.a", b"numbered", publisher_seq=7)
        await asyncio.gather(*plain)

    assert _run(steps) == [[b"numbered"], [b"p0", b"p1"]]


def test_the_gathered_publications_still_go_when_the_gathering_call_is_cancelled() -> None:
    async def steps(client: PubsubClient, apex: RecordingApex) -> None:
        tasks = [asyncio.create_task(client.publish("q.a", b"m%d" % i)) for i in range(4)]
        await asyncio.sleep(0)  # each took its first step: the first gathers the others
        tasks[0].cancel()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert isinstance(results[0], asyncio.CancelledError)
        assert results[1:] == [None, None, None]

    assert _run(steps) == [[b"m1", b"m2", b"m3"]]


def test_without_batch_publish_every_publication_is_a_data() -> None:
    async def run() -> list[tuple[str, bytes]]:
        apex = RecordingApex()
        client = PubsubClient(apex, ME, batch_publish=False)  # type: ignore[arg-type]
        await asyncio.gather(*(client.publish("q.a", b"m%d" % i) for i in range(3)))
        return apex.written

    assert asyncio.run(run()) == [("apex=pubsub/q.a@example.com", b"m%d" % i)
                                  for i in range(3)]
