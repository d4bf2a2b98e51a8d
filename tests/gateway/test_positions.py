"""`LinkPositions`, pure: delivery numbers and the gap requests that fetch deliveries again,
for a feed's own link (long runs) and a user's shared link (the others' seqs between)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.gateway._positions import LinkPositions
from common.errors import LinkContextGone


def _positions(seqs: list[tuple[int | None, int]], max_runs: int = 4096) -> LinkPositions:
    pos = LinkPositions(max_runs)
    for ident, (epoch, seq) in enumerate(seqs, 1):
        assert pos.number(epoch, seq) == ident
    return pos


def test_a_shared_link_skips_the_others_seqs() -> None:
    """Seqs 1, 3, 5 … 11, 20, 40 (the even ones another watch's): requests of at most 3 seqs
    that start at the feed's own seqs, never at another's."""
    pos = _positions([(0, s) for s in (1, 3, 5, 7, 9, 11, 20, 40)])
    chunks = list(pos.chunks(1, 8, 3))
    assert [(c.first, c.last) for c in chunks] == [(1, 3), (5, 7), (9, 11), (20, 20), (40, 40)]
    assert [chunks[0].ident(s) for s in (1, 2, 3)] == [1, None, 2]
    assert chunks[4].ident(40) == 8


def test_older_than_the_runs_remembered_is_refused() -> None:
    """With room for 2 runs, delivery 1 (the first of 3 runs) is gone."""
    pos = _positions([(0, 1), (0, 5), (0, 9)], max_runs=2)
    with pytest.raises(LinkContextGone):
        list(pos.chunks(1, 3, 10))
    assert [c.first for c in pos.chunks(2, 3, 10)] == [5]


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4)), min_size=1, max_size=60),
       st.integers(1, 8), st.data())
def test_chunks_ask_for_exactly_the_deliveries_owed(steps: list[tuple[int, int]], most: int,
                                                     data: st.DataObject) -> None:
    """Whatever the epochs and the others' seqs between ours: every chunk spans at most `most`
    seqs of one epoch, and the seqs the chunks claim are exactly deliveries lo..hi, under their
    own numbers, in order."""
    seqs, epoch, seq = [], 0, 0
    for bump, skip in steps:
        if bump == 2:
            epoch, seq = epoch + 1, 0
        seq += skip
        seqs.append((epoch, seq))
    pos = _positions(seqs)
    lo = data.draw(st.integers(1, len(seqs)))
    hi = data.draw(st.integers(lo, len(seqs)))
    claimed = []
    for chunk in pos.chunks(lo, hi, most):
        assert chunk.last - chunk.first < most
        for s in range(chunk.first, chunk.last + 1):
            ident = chunk.ident(s)
            if ident is not None:
                assert seqs[ident - 1] == (chunk.epoch, s)
                claimed.append(ident)
    assert claimed == list(range(lo, hi + 1))
