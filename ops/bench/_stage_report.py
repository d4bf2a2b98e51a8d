"""Where a Notify's time goes: the stage files `_stages.py` wrote, joined by key with what the
benchmark itself noted (send, the publisher's `ok`, the client's receipt), as a table of each
step's p50/p99 over every Notify and over the slowest 1 % (those at or above the p99 of publish
-> receipt), plus each process's event-loop lag, garbage-collection pauses and the sites of its
longest loop stalls."""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from pathlib import Path

#: The path in order; each step is the time from the stage before it that the key has.
PATH = ("sent", "broker_in", "data_acked", "ok", "notify_emitted", "notify_acked",
        "notify_rendered", "gw_in", "sse_out", "received")


def _pct(xs: list[float], p: int) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def report(folder: Path, bench: dict[str, dict[str, int]], window: tuple[int, int]) -> list[str]:
    """`bench`: key -> {stage: ns} for "ok" and "received" (the key is the send time);
    `window`: the measured one (ns), outside which lags and pauses are not counted."""
    stamps: dict[str, dict[str, int]] = defaultdict(dict)
    lines: list[str] = []
    for key, seen in bench.items():
        stamps[key].update(seen)
        stamps[key]["sent"] = int(key)
    for path in sorted(folder.glob("*.stages")):
        lag: list[float] = []
        pauses: dict[str, list[float]] = defaultdict(list)
        stalls: dict[str, list[float]] = defaultdict(list)
        for line in path.read_text().splitlines():
            stage, key, ns, *at = line.split()
            if stage == "stall":  # stall NS AT SITE
                if window[0] <= int(ns) < window[1]:
                    stalls[at[0]].append(int(key) / 1e6)
                continue
            if stage in ("lag", "gc"):
                if not window[0] <= int(at[0]) < window[1]:
                    continue
                (lag if stage == "lag" else pauses[key]).append(int(ns) / 1e6)
            elif key in stamps:  # only what a client received in the window
                stamps[key].setdefault(stage, int(ns))
        lines.append(f"{path.stem}: loop lag p50 {_pct(lag, 50):.1f} ms p99 {_pct(lag, 99):.1f}"
                     f" ms max {max(lag, default=float('nan')):.1f} ms; gc pauses > 1 ms: "
                     + (", ".join(f"gen{g} x{len(v)} max {max(v):.1f} ms"
                                  for g, v in sorted(pauses.items())) or "none"))
        longest = sorted(stalls.items(), key=lambda kv: -sum(kv[1]))[:3]
        lines.extend(f"  stalls at {site}: x{len(v)}, max {max(v):.0f} ms" for site, v in longest)
    total = {k: (s["received"] - s["sent"]) / 1e6 for k, s in stamps.items() if "received" in s}
    if not total:
        return lines
    cut = _pct(list(total.values()), 99)
    slow = {k for k, t in total.items() if t >= cut}
    lines.append(f"step (ms)                        all p50   all p99 | slowest 1% (>= {cut:.1f}"
                 " ms) p50  p99")
    order = [s for s in PATH if s != "ok"]
    for before, after in itertools.pairwise(order):
        every, worst = [], []
        for k, s in stamps.items():
            if k in total and before in s and after in s:
                d = (s[after] - s[before]) / 1e6
                every.append(d)
                if k in slow:
                    worst.append(d)
        lines.append(f"{before:>15} -> {after:<15} {_pct(every, 50):8.1f}  {_pct(every, 99):8.1f}"
                     f" | {_pct(worst, 50):8.1f}  {_pct(worst, 99):8.1f}   (n {len(every)})")
    oks = [(s["ok"] - s["sent"]) / 1e6 for k, s in stamps.items() if k in total and "ok" in s]
    lines.append(f"publisher's ok after send: p50 {_pct(oks, 50):.1f} ms p99 {_pct(oks, 99):.1f}"
                 f" ms; publish -> receipt median {statistics.median(total.values()):.1f} ms")
    return lines
