"""Link sequence numbers (XEP-0040 §2.2): the arithmetic alone, pure and exact.

Theory of operation
-------------------
A link seq has a bit resolution the broker advertises (16, 32 or 64 bits). It rises by one per
data or heartbeat on the link; after the maximum, 2**bits - 1, it wraps to 1, never to 0: 0 is
sent only on a reset (the XEP: "Zero should not be used in the situation of sequence number
wrapping/rollover, wherein the value 1 should be used"). So the seqs a link cycles through are
1..M with M = 2**bits - 1, a cycle of odd length M; 0 stands outside the cycle, just before 1.

Comparing two seqs is RFC 1982 serial-number arithmetic on that cycle: `forward(a, b)` is how
many steps take a to b going forward (mod M), and b is *after* a when that is at most `window`,
(M - 1) // 2, i.e. less than half the space. Because M is odd, for a != b exactly one of the two
is after the other: RFC 1982's undefined case (a distance of exactly half) cannot arise. The
comparison is only meaningful for seqs less than half the space apart, which is why the link
retention window must hold fewer than `window` link seqs and why no gap may span more.

Gap ranges `linkfrom..linkto` are inclusive and walk forward through the wrap. The decision
(docs/robust-binding.md, "Gap ranges"): linkfrom > linkto numerically is accepted only as a
wrap-around range, one whose forward length is within the window (65530..3 at 16 bits is the
nine seqs 65530..65535, 1..3); otherwise the range is backwards and refused with 553, as are 0
(a reset carries nothing to refill), negative numbers and numbers beyond the resolution. A range
within the window but longer than the broker's maximum gap fill is refused with 570.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from common.errors import BadGapRange, InvalidParameter, RebuildRefused

__all__ = ["DEFAULT_BITS", "SUPPORTED_BITS", "LinkSeqSpace"]

#: XEP-0040 §2.2 leaves the resolution to the component; apexps offers these.
SUPPORTED_BITS = (16, 32, 64)
#: 32 bits wrap after 4.29e9 link seqs: months at 1,000 messages/s, so a wrap is an event a
#: test provokes at 16 bits rather than one a desk meets, and still fits a Java int on the wire.
DEFAULT_BITS = 32


@dataclass(frozen=True, slots=True)
class LinkSeqSpace:
    """The link seqs of one resolution: `next`, `forward`, `distance`, ranges and their checks."""

    bits: int = DEFAULT_BITS

    def __post_init__(self) -> None:
        if self.bits not in SUPPORTED_BITS:
            raise InvalidParameter(
                f"link seq resolution {self.bits!r} bits is not one of {SUPPORTED_BITS}")

    @property
    def maximum(self) -> int:
        """The largest link seq, 2**bits - 1; the next one is 1."""
        return (1 << self.bits) - 1

    @property
    def window(self) -> int:
        """The largest forward distance at which one seq still counts as after another: less
        than half the space. Gaps, reorder buffers and the retention window stay within it."""
        return (self.maximum - 1) // 2

    def check(self, n: object, what: str = "link seq") -> int:
        """`n` if it is a link seq of this resolution (0..maximum), else 553."""
        if type(n) is not int:
            raise BadGapRange(f"{what} {n!r} is not an integer")
        if n < 0:
            raise BadGapRange(f"{what} {n} is negative")
        if n > self.maximum:
            raise BadGapRange(f"{what} {n} is beyond the {self.bits}-bit resolution"
                              f" (0..{self.maximum})")
        return n

    def next(self, n: int) -> int:
        """The seq after `n`: one more, except that the maximum wraps to 1 (and 0, the reset,
        is followed by 1)."""
        return 1 if n >= self.maximum else n + 1

    def add(self, n: int, k: int) -> int:
        """`n` advanced `k` >= 0 steps (`k` applications of `next`)."""
        if k < 0:
            raise ValueError("add() goes forward only")
        if k == 0:
            return n
        if n == 0:
            return (k - 1) % self.maximum + 1
        return (n - 1 + k) % self.maximum + 1

    def forward(self, a: int, b: int) -> int:
        """Steps forward from `a` to `b`, in 0..maximum - 1 (from 0, the reset, `b` steps).

        Raises ValueError for b == 0 != a: nothing leads forward to a reset."""
        if b == 0:
            if a != 0:
                raise ValueError("no seq leads forward to 0 (0 is sent only on a reset)")
            return 0
        if a == 0:
            return b
        return (b - a) % self.maximum

    def distance(self, a: int, b: int) -> int:
        """Signed serial distance from `a` to `b` (RFC 1982 style): positive when `b` is after
        `a`, negative when before, 0 when equal. Meaningful for seqs less than half the space
        apart; 0 counts as just before 1."""
        if a == 0 or b == 0:
            if a == b:
                return 0
            return self.forward(a, b) if a == 0 else -self.forward(b, a)
        f = self.forward(a, b)
        return f if f <= self.window else f - self.maximum

    def is_after(self, a: int, b: int) -> bool:
        """True when `b` comes after `a` within the window."""
        return self.distance(a, b) > 0

    def span(self, lo: int, hi: int) -> int:
        """How many seqs `lo..hi` holds, inclusive, walking forward through the wrap."""
        return self.forward(lo, hi) + 1

    def expand(self, lo: int, hi: int) -> Iterator[int]:
        """The seqs of `lo..hi` in link order (validate with `check_range` first)."""
        n = lo
        for _ in range(self.span(lo, hi)):
            yield n
            n = self.next(n)

    def check_range(self, lo: object, hi: object, max_span: int | None = None) -> int:
        """Validate the gap range `lo..hi`; return how many seqs it holds.

        Raises:
            BadGapRange: 553, a bound that is not a link seq of this resolution, is 0, or a
                range that runs backwards (linkfrom after linkto, and not a wrap-around range
                within the window).
            RebuildRefused: 570, a valid range longer than `max_span`.
        """
        first = self.check(lo, "linkfrom")
        last = self.check(hi, "linkto")
        if first == 0 or last == 0:
            raise BadGapRange("link seq 0 marks a reset and carries nothing to refill")
        span = self.forward(first, last) + 1
        if span > self.window + 1:
            if first > last:
                raise BadGapRange(
                    f"linkfrom {first} is after linkto {last}; linkfrom > linkto is accepted"
                    f" only for a range that wraps past {self.maximum} to 1 within"
                    f" {self.window + 1} seqs")
            raise BadGapRange(f"the range {first}..{last} spans {span} seqs, more than half the"
                              f" {self.bits}-bit sequence space")
        if max_span is not None and span > max_span:
            raise RebuildRefused(f"a gap of {span} link seqs exceeds this broker's maximum gap"
                                 f" fill of {max_span}; ask in ranges of at most {max_span}")
        return span
