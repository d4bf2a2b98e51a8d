"""Link seq arithmetic (broker/robust/linkseq.py): next, wrap, serial distance, gap ranges."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.robust.linkseq import SUPPORTED_BITS, LinkSeqSpace
from common.errors import BadGapRange, InvalidParameter, RebuildRefused

S16 = LinkSeqSpace(16)
_spaces = st.sampled_from([LinkSeqSpace(b) for b in SUPPORTED_BITS])


def _seq(space: LinkSeqSpace) -> st.SearchStrategy[int]:
    """Nonzero link seqs, biased to the edges where the wrap happens."""
    m = space.maximum
    return st.one_of(st.integers(1, m), st.integers(1, 40), st.integers(m - 40, m))


def test_only_the_offered_resolutions() -> None:
    """16, 32 and 64 bits; anything else is refused."""
    for bits in (0, 8, 31, 128):
        with pytest.raises(InvalidParameter):
            LinkSeqSpace(bits)
    assert [LinkSeqSpace(b).maximum for b in SUPPORTED_BITS] == [65535, 2**32 - 1, 2**64 - 1]


def test_the_xeps_16_bit_example() -> None:
    """XEP-0040 §2.2: 1, 2, 3, … 65533, 65534, 65535, 1, 2 — the wrap skips 0."""
    run = [65533]
    for _ in range(4):
        run.append(S16.next(run[-1]))
    assert run == [65533, 65534, 65535, 1, 2]
    assert S16.next(0) == 1


@given(_spaces, st.data())
def test_next_is_add_one_and_never_zero(space: LinkSeqSpace, data: st.DataObject) -> None:
    """`next` rises by one, wraps the maximum to 1, and never yields the reset value."""
    n = data.draw(_seq(space) | st.just(0))
    assert space.next(n) == space.add(n, 1) != 0
    assert space.next(n) == (n + 1 if n < space.maximum else 1)


@given(_spaces, st.data(), st.integers(0, 10**6))
def test_forward_undoes_add(space: LinkSeqSpace, data: st.DataObject, k: int) -> None:
    """Walking k steps from a and measuring back gives k (mod the cycle of nonzero seqs)."""
    a = data.draw(_seq(space) | st.just(0))
    b = space.add(a, k)
    if k:
        assert space.forward(a, b) == ((k - 1) % space.maximum + 1 if a == 0
                                       else k % space.maximum)


@given(_spaces, st.data())
def test_distance_is_antisymmetric_and_total(space: LinkSeqSpace, data: st.DataObject) -> None:
    """For distinct seqs exactly one is after the other (the cycle is odd: no RFC 1982 tie)."""
    a, b = data.draw(_seq(space)), data.draw(_seq(space))
    assert space.distance(a, b) == -space.distance(b, a)
    if a != b:
        assert space.is_after(a, b) != space.is_after(b, a)
    assert abs(space.distance(a, b)) <= space.window


@given(_spaces, st.data())
def test_ordering_holds_across_the_wrap(space: LinkSeqSpace, data: st.DataObject) -> None:
    """A seq k steps later (k within the window) is after, whether or not the walk wrapped
    past the maximum."""
    a = data.draw(_seq(space))
    k = data.draw(st.integers(1, space.window) | st.integers(1, 100))
    b = space.add(a, k)
    assert space.distance(a, b) == k and space.is_after(a, b)


def test_crossing_the_16_bit_wrap() -> None:
    """At 16 bits 65535 → 1 is one step forward, and 3 is after 65530."""
    assert S16.distance(65535, 1) == 1
    assert S16.distance(65530, 3) == 8
    assert S16.distance(3, 65530) == -8
    assert S16.is_after(0, 1) and not S16.is_after(1, 0)


def test_wrap_around_range_expands_through_the_maximum() -> None:
    """65530..3 at 16 bits is the nine seqs 65530..65535, 1..3; a gap of one has from = to."""
    assert S16.check_range(65530, 3) == 9
    assert list(S16.expand(65530, 3)) == [*range(65530, 65536), 1, 2, 3]
    assert list(S16.expand(7, 7)) == [7] and S16.check_range(7, 7) == 1


@given(_spaces, st.data(), st.integers(1, 500))
def test_expand_matches_check_range(space: LinkSeqSpace, data: st.DataObject, n: int) -> None:
    """Every accepted range expands to exactly as many consecutive seqs as it was counted."""
    lo = data.draw(_seq(space))
    hi = space.add(lo, n - 1)
    seqs = list(space.expand(lo, hi))
    assert space.check_range(lo, hi) == n == len(seqs)
    assert seqs[0] == lo and seqs[-1] == hi and 0 not in seqs
    assert all(space.next(a) == b for a, b in itertools.pairwise(seqs))


@pytest.mark.parametrize(("lo", "hi", "words"), [
    (-1, 5, "negative"),
    (5, -1, "negative"),
    (0, 5, "reset"),
    (5, 0, "reset"),
    (65536, 65536, "16-bit resolution"),
    (10**40, 1, "resolution"),
    (5, 3, "after linkto"),
    (100, 99, "after linkto"),
    (1, 40000, "half"),
    (True, 3, "integer"),
    ("5", 6, "integer"),
])
def test_bad_ranges_are_553_with_a_reason(lo: object, hi: object, words: str) -> None:
    """Negative, 0, beyond the resolution, backwards, or over half the space: 553, saying why."""
    with pytest.raises(BadGapRange, match=words) as err:
        S16.check_range(lo, hi)
    assert err.value.code == 553


def test_a_valid_range_beyond_the_maximum_gap_is_570() -> None:
    """Within the window but longer than the broker's maximum gap fill: refused with 570."""
    assert S16.check_range(1, 100, max_span=100) == 100
    with pytest.raises(RebuildRefused, match="at most 100") as err:
        S16.check_range(65500, 100, max_span=100)
    assert err.value.code == 570


@given(_spaces, st.data())
def test_any_integers_validate_or_raise_553_or_570(space: LinkSeqSpace,
                                                   data: st.DataObject) -> None:
    """Whatever two integers a peer sends, check_range counts them or raises a coded error."""
    big = st.integers(-(2**70), 2**70)
    lo, hi = data.draw(big | _seq(space)), data.draw(big | _seq(space))
    try:
        n = space.check_range(lo, hi, max_span=1000)
    except (BadGapRange, RebuildRefused):
        return
    assert n in range(1, 1001)  # within the span asked for
    assert len(list(space.expand(lo, hi))) == n  # the count is the seqs the range walks
