"""The report's three figures, each drawn with matplotlib and returned as an inline `<svg>` string.

Figures are built on `matplotlib.figure.Figure` directly, never through pyplot: pyplot keeps a
global registry of open figures and a process-wide backend, and an audit may run beside other
code that uses matplotlib. A bare `Figure` renders to SVG without any backend being selected
(the canvas is chosen by the format), so nothing here touches matplotlib's global state.

Text in the figures is drawn as glyph paths (matplotlib's default `svg.fonttype`), so a source
or subscription name from the data never appears in the page as markup, and the page needs no
font from anywhere; names are drawn with `parse_math=False`, so a `$` in one is a dollar sign,
not the start of a formula matplotlib would try (and possibly fail) to typeset. Each SVG's
internal ids (clip paths, markers) are hashed with a fresh salt per figure, so three SVGs inline
in one page never share an id.

Many sources or subscriptions would make an unreadable figure: the figures show the first
`MAX_PANELS` / `MAX_BARS`, those with holes or differences first, and say how many were left
out (the tables in the page list them all).
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from matplotlib.figure import Figure

__all__ = ["MAX_BARS", "MAX_PANELS", "continuity_svg", "latency_svg", "subscriptions_svg"]

#: Source panels in the continuity figure; past a dozen the panels are too short to read.
MAX_PANELS = 12
#: Subscriptions in the expected-vs-delivered figure; past forty the labels overlap.
MAX_BARS = 40

_HOLE = "#c0392b"
_OK = "#2c7fb8"
_EXPECTED = "#bdbdbd"


def _svg(fig: Figure) -> str:
    """The figure as an `<svg>` element (no XML prolog or DOCTYPE: it goes inside HTML)."""
    buf = io.StringIO()
    # Date: None keeps the render time out of the SVG, so one audit gives one page.
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _when(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)


def continuity_svg(series: Sequence[tuple[str, int, int, int]]) -> tuple[str, int]:
    """Messages per time bucket for each source, buckets holding a hole marked in red.

    Returns the SVG and how many sources were left out of it.
    """
    by_source: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for source, bucket_ms, messages, holes in series:
        by_source[source].append((bucket_ms, messages, holes))
    # Sources with holes first (they are what a reader looks for), then by name.
    order = sorted(by_source, key=lambda s: (-sum(h for _, _, h in by_source[s]), s))
    shown = order[:MAX_PANELS]
    # Fixed margins, not a layout engine: constrained layout measures every panel's ticks and
    # title again per pass, and took most of an audit report's time at a dozen panels.
    height = 1.2 + 1.3 * len(shown)
    fig = Figure(figsize=(9, height))
    fig.subplots_adjust(left=0.08, right=0.98, top=1 - 0.45 / height, bottom=0.9 / height,
                        hspace=0.55)
    axes = fig.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
    # Bucket width: the smallest step between buckets of any source.
    steps = [b[0] - a[0] for rows in by_source.values()
             for a, b in zip(sorted(rows), sorted(rows)[1:], strict=False) if b[0] > a[0]]
    width = min(steps) if steps else 60_000
    for ax, source in zip(axes, shown, strict=True):
        rows = sorted(by_source[source])
        # One step patch per panel (buckets as its steps; an empty bucket between two is 0),
        # and one per colour for the buckets that hold a hole: two artists, not one per bar.
        edges, counts, holed = _steps(rows, width)
        xs = [_when(ms) for ms in edges]
        ax.stairs(counts, xs, fill=True, color=_OK)
        if any(holed):
            ax.stairs([c if h else 0 for c, h in zip(counts, holed, strict=True)], xs,
                      fill=True, color=_HOLE)
            for x, h in zip(xs, holed, strict=False):
                if h:
                    ax.axvspan(x, x + timedelta(milliseconds=width), color=_HOLE, alpha=0.15,
                               lw=0)
        ax.set_ylabel("msgs", fontsize=8)
        ax.set_title(source, fontsize=9, loc="left", parse_math=False)
        ax.tick_params(labelsize=7)
    # Six fixed ticks across the window, not a date locator: shared by every panel, a locator
    # would be asked again per panel and per layout pass.
    first = min(b for s in shown for b, _, _ in by_source[s])
    last = max(b for s in shown for b, _, _ in by_source[s]) + width
    ticks = [_when(first + (last - first) * i // 5) for i in range(6)]
    fmt = "%H:%M:%S" if last - first < 86_400_000 else "%Y-%m-%d %H:%M"
    axes[-1].set_xticks(ticks, [t.strftime(fmt) for t in ticks], rotation=30, ha="right")
    axes[-1].set_xlabel("bucket start (UTC); red = bucket holds a hole", fontsize=8)
    return _svg(fig), len(order) - len(shown)


def _steps(rows: Sequence[tuple[int, int, int]], width: int,
           ) -> tuple[list[int], list[int], list[bool]]:
    """A source's (bucket_ms, messages, holes) rows, sorted, as step edges (ms), the count of
    each step and whether it holds a hole; buckets the source has no row for count 0."""
    start, end = rows[0][0], rows[-1][0] + width
    n = max(1, -(-(end - start) // width))
    counts, holed = [0] * n, [False] * n
    for bucket_ms, messages, holes in rows:
        i = min(n - 1, (bucket_ms - start) // width)
        counts[i] += messages
        holed[i] = holed[i] or holes > 0
    return [start + i * width for i in range(n + 1)], counts, holed


def subscriptions_svg(rows: Sequence[tuple[str, int, int, int, int]]) -> tuple[str, int]:
    """Expected (grey) against delivered (blue) per subscription, missing/extra written beside.

    Returns the SVG and how many subscriptions were left out of it.
    """
    order = sorted(rows, key=lambda r: (-(r[3] + r[4]), r[0]))
    shown = list(reversed(order[:MAX_BARS]))  # barh draws bottom-up; the worst go on top
    fig = Figure(figsize=(9, 1.0 + 0.35 * len(shown)))
    ax = fig.subplots()
    ys = range(len(shown))
    ax.barh([y + 0.2 for y in ys], [r[1] for r in shown], height=0.4, color=_EXPECTED,
            label="expected")
    ax.barh([y - 0.2 for y in ys], [r[2] for r in shown], height=0.4, color=_OK,
            label="delivered")
    for y, (_, expected, delivered, missing, extra) in zip(ys, shown, strict=True):
        if missing or extra:
            ax.annotate(f"  -{missing} +{extra}", (max(expected, delivered), y),
                        va="center", fontsize=7, color=_HOLE)
    ax.set_yticks(list(ys), [r[0] for r in shown], fontsize=7, parse_math=False)
    ax.set_xlabel("messages", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    return _svg(fig), len(order) - len(shown)


def latency_svg(latencies_ms: Sequence[float]) -> str:
    """A histogram of journal-append-to-link-send latency, with p50 and p99 marked."""
    import numpy as np

    values = np.asarray(latencies_ms, dtype=float)
    fig = Figure(figsize=(9, 3))
    ax = fig.subplots()
    low, high = max(float(values.min()), 0.01), max(float(values.max()), 0.02)
    # Latencies span orders of magnitude (a live send vs. a gap fill after a restart): log bins
    # keep both ends visible.
    bins: int | list[float] = (
        [float(b) for b in np.geomspace(low, high * 1.0001, 40)] if high / low > 20 else 40)
    ax.hist(np.clip(values, low, None), bins=bins, color=_OK)
    if high / low > 20:
        ax.set_xscale("log")
    for q, style in ((50, "--"), (99, ":")):
        at = float(np.percentile(values, q))
        ax.axvline(max(at, low), color=_HOLE, ls=style, lw=1, label=f"p{q} {at:.1f} ms")
    ax.set_xlabel("journal append -> link send (ms)", fontsize=8)
    ax.set_ylabel("deliveries", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    return _svg(fig)
