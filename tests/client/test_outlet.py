"""DataOutlet: the one place a client's received data go (adapters/client/_outlet.py)."""

from __future__ import annotations

import asyncio

from adapters.apex import Endpoint
from adapters.apex.codec import Data
from adapters.client._outlet import DataOutlet


def _data(n: int) -> Data:
    return Data(Endpoint.parse("fred@example.com"), (Endpoint.parse("barney@example.com"),),
                f"m{n}".encode())


def test_queued_data_reach_a_late_callback_first_and_a_failing_one_keeps_getting_more() -> None:
    outlet = DataOutlet()
    outlet.put(_data(1))
    outlet.put(_data(2))
    got: list[bytes | None] = []

    def callback(data: Data | None) -> None:
        got.append(None if data is None else data.content)
        if data is not None and data.content == b"m2":
            raise RuntimeError("the consumer's bug")

    outlet.deliver_to(callback)
    outlet.put(_data(3))
    outlet.put(None)
    assert got == [b"m1", b"m2", b"m3", None]


def test_receive_yields_until_the_end_and_the_end_stays() -> None:
    async def main() -> tuple[list[bytes], list[bytes]]:
        outlet = DataOutlet()
        for n in (1, 2):
            outlet.put(_data(n))
        outlet.put(None)
        first = [d.content async for d in outlet.receive()]
        again = [d.content async for d in outlet.receive()]
        return first, again

    assert asyncio.run(main()) == ([b"m1", b"m2"], [])
