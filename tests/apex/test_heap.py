"""The serving process's collector settings (adapters/cli/heap.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from adapters.cli import heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_settle_freezes_what_is_alive_and_spaces_young_collections_out() -> None:
    alive = [[n] for n in range(1000)]  # containers the collector tracks
    gc.unfreeze()
    before = gc.get_threshold()
    heap.settle()
    assert gc.get_freeze_count() >= len(alive)
    assert gc.get_threshold() == (heap.GEN0_THRESHOLD, before[1], before[2])
