"""`Slots`, ApexClient's limit on requests in flight: first come first served, and a waiter
cancelled at any point neither keeps a slot nor loses one."""

from __future__ import annotations

import asyncio

from adapters.client._transport import Slots


async def _holders_in_order() -> list[int]:
    slots, order = Slots(1), []
    await slots.take()

    async def holder(k: int) -> None:
        await slots.take()
        order.append(k)
        slots.give_back()
    waiters = [asyncio.create_task(holder(k)) for k in range(5)]
    await asyncio.sleep(0)  # each is queued, in creation order
    slots.give_back()
    await asyncio.gather(*waiters)
    return order


def test_a_released_slot_goes_to_the_longest_waiter() -> None:
    """Waiters get the slot in the order they asked (Publisher's sends rely on it)."""
    assert asyncio.run(_holders_in_order()) == [0, 1, 2, 3, 4]


async def _cancellations() -> tuple[bool, bool]:
    slots = Slots(1)
    await slots.take()
    # cancelled while waiting: its place in the queue holds nothing
    gone = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    slots.give_back()
    free_again = await asyncio.wait_for(slots.take(), 1) is None
    # handed the slot and cancelled before it could run: the slot is passed on, not lost
    handed = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    slots.give_back()  # to `handed`, whose task has not resumed yet
    handed.cancel()
    await asyncio.gather(handed, return_exceptions=True)
    passed_on = await asyncio.wait_for(slots.take(), 1) is None
    return free_again, passed_on


def test_cancelled_waiters_neither_keep_nor_lose_a_slot() -> None:
    """A waiter cancelled in the queue, or just after the slot was handed to it, leaves the
    slot free for the next taker."""
    assert asyncio.run(_cancellations()) == (True, True)


async def _many_holders(count: int, tasks: int) -> int:
    slots, holding, most = Slots(count), 0, 0

    async def holder() -> None:
        nonlocal holding, most
        await slots.take()
        holding += 1
        most = max(most, holding)
        await asyncio.sleep(0)
        holding -= 1
        slots.give_back()
    await asyncio.gather(*(holder() for _ in range(tasks)))
    return most


def test_never_more_holders_than_slots() -> None:
    """However many ask at once, at most `count` hold a slot."""
    assert asyncio.run(_many_holders(3, 50)) == 3
