"""`write_report`: an audit's `report.html`, one file a person opens from disk.

Theory of operation
-------------------
The audit (broker/spark/audit/, launched by `apexps audit`) computes its findings in Spark and
hands this module a `ReportData`: the `summary` exactly as it writes `summary.json`, plus the
few small series the page plots (collected to the driver, so they are already aggregates or a
sample). This module knows nothing of Spark or Kafka; it turns that data into HTML.

The page must open anywhere an auditor may carry it: no server, no network, no CDN, no external
file. So the CSS is inline, there is no script at all, and the figures are matplotlib SVGs
pasted into the page (adapters/audit/_plots.py). Everything that comes from the data (source
names, subscriber endpoints, selectors in a label, the note, topic names) is passed through
`html.escape` on its way in: an audit reads whatever publishers wrote, and the report must not
become a way to run their markup in an auditor's browser.

The page, top to bottom: the verdict (clean, findings, or empty, with the note), the window
and when it was generated, the counts per finding category (every category, zeros included,
as the summary holds them), the decision replay's reconciled fraction, the Kafka offsets read;
then per-source continuity over time with holes marked, a table of where the holes are,
expected against delivered per subscription, and the latency distribution. An empty audit
(`summary["empty"]`, or no series at all) says so at the top and in place of each figure,
rather than drawing empty axes.

The summary is read leniently (a missing key shows as "-"): the report is how a person sees an
audit that went wrong, and must not itself fail on a summary the audit wrote in a hurry.
"""

from __future__ import annotations

import html
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from adapters.audit import _plots

__all__ = ["CATEGORIES", "REPORT_NAME", "ReportData", "write_report"]

REPORT_NAME = "report.html"

#: Every finding category the audit counts, in the order the page lists them (summary.json's
#: "counts" holds each, zeros included).
CATEGORIES = (
    "source_hole", "source_duplicate", "source_order", "missing", "extra", "duplicate",
    "reorder", "withheld_delivered", "decision_mismatch", "decode_error",
)


@dataclass(frozen=True)
class ReportData:
    summary: dict[str, Any]                       # exactly what summary.json holds
    source_series: list[tuple[str, int, int, int]]  # (source, bucket_start_ms, messages, holes)
    subscriptions: list[tuple[str, int, int, int, int]]  # (subscription label, expected,
                                                        #  delivered, missing, extra)
    latencies_ms: list[float]                     # journal append -> link send, a sample
    holes: list[tuple[str, int, int, int]]        # (source, from_seq, to_seq, at_ms)


def write_report(out_dir: Path, data: ReportData) -> Path:
    """Write `out_dir/report.html` for `data` (replacing any earlier one) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / REPORT_NAME
    page = render(data)
    # Written beside and renamed over: a reader never opens half a report.
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def render(data: ReportData) -> str:
    """The whole page as a string."""
    summary = data.summary
    empty = bool(summary.get("empty")) or not (
        data.source_series or data.subscriptions or data.latencies_ms or data.holes)
    parts = [_head(), "<body>", "<h1>apexps audit</h1>", _verdict(summary, empty),
             _overview(summary)]
    parts += _figures(data, empty)
    parts += [_per_source(summary), _per_subscription(summary), "</body></html>"]
    return "\n".join(parts)


def _e(value: object) -> str:
    """A value from the data, escaped for HTML text and attributes; None shows as '-'."""
    return "-" if value is None else html.escape(str(value), quote=True)


def _ms(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds")


def _table(caption: str, header: Sequence[str], rows: Iterable[Sequence[object]],
           *, cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(header)}" class="none">none</td></tr>'
    klass = f' class="{cls}"' if cls else ""
    return (f"<table{klass}><caption>{_e(caption)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _head() -> str:
    return """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>apexps audit report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.verdict { font-size: 1.4em; padding: 0.5em 0.8em; border-radius: 4px; }
.clean { background: #e5f5e0; } .findings { background: #fde0dd; } .empty { background: #eee; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
caption { text-align: left; font-weight: bold; padding: 0.3em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }
td.none { color: #888; font-style: italic; }
tr.nonzero td { background: #fde0dd; }
figure { margin: 0.8em 0; } figure svg { max-width: 100%; height: auto; }
.note { color: #555; }
</style></head>"""


def _verdict(summary: Mapping[str, Any], empty: bool) -> str:
    note = summary.get("note") or ""
    if empty:
        text, cls = "Empty audit: there was nothing to audit in this window.", "empty"
    elif summary.get("clean"):
        text, cls = "Clean: no findings.", "clean"
    else:
        total = sum(int(n) for n in (summary.get("counts") or {}).values())
        text, cls = f"Not clean: {total} finding{'' if total == 1 else 's'}.", "findings"
    extra = f'<p class="note" id="note">{_e(note)}</p>' if note else ""
    return f'<p class="verdict {cls}" id="verdict">{_e(text)}</p>{extra}'


def _overview(summary: Mapping[str, Any]) -> str:
    window = summary.get("window") or {}
    decisions = summary.get("decisions") or {}
    counts = summary.get("counts") or {}
    categories = [*CATEGORIES, *sorted(set(counts) - set(CATEGORIES))]
    marked = ' class="nonzero"'
    count_rows = "".join(
        f'<tr{marked if counts.get(c) else ""}><td>{_e(c)}</td>'
        f'<td>{_e(counts.get(c, 0))}</td></tr>' for c in categories)
    offsets = summary.get("offsets") or {}
    offset_rows = [(topic, partition, *(bounds if isinstance(bounds, list | tuple) else
                                         (bounds, None)))
                   for topic, parts in sorted(offsets.items())
                   for partition, bounds in sorted((parts or {}).items(), key=lambda kv:
                                                   _int_or_text(kv[0]))]
    fraction = decisions.get("fraction")
    shown = f"{float(fraction):.6g}" if isinstance(fraction, int | float) else fraction
    return "\n".join([
        "<h2>Summary</h2>",
        _table("Window", ["from", "to", "generated at"],
               [(window.get("from") or "earliest", window.get("to") or "latest",
                 summary.get("generated_at"))]),
        '<table id="counts"><caption>Findings per category</caption><thead><tr>'
        f"<th>category</th><th>count</th></tr></thead><tbody>{count_rows}</tbody></table>",
        _table("Decision replay", ["decisions", "reconciled", "reconciled fraction"],
               [(decisions.get("total"), decisions.get("reconciled"), shown)]),
        _table("Kafka offsets read", ["topic", "partition", "start", "end"], offset_rows),
    ])


def _int_or_text(value: object) -> tuple[int, str]:
    text = str(value)
    return (int(text), "") if text.isdigit() else (1 << 62, text)


def _figure(title: str, svg: str | None, left_out: int, what: str, empty_text: str) -> str:
    body = (f'<p class="none">{_e(empty_text)}</p>' if svg is None else
            f"<figure>{svg}</figure>")
    more = (f'<p class="note">{left_out} more {what} not drawn; the tables list them all.</p>'
            if left_out else "")
    return f"<h2>{_e(title)}</h2>{body}{more}"


def _figures(data: ReportData, empty: bool) -> list[str]:
    nothing = "Nothing to draw: the audit is empty." if empty else "No data for this figure."
    svg, left = (_plots.continuity_svg(data.source_series) if data.source_series
                 else (None, 0))
    out = [_figure("Per-source continuity over time", svg, left, "sources", nothing)]
    out.append(_table("Where the holes are",
                      ["source", "from seq", "to seq", "at (UTC)"],
                      [(s, lo, hi, _ms(at)) for s, lo, hi, at in sorted(
                          data.holes, key=lambda h: (h[0], h[1]))], cls="holes"))
    svg, left = (_plots.subscriptions_svg(data.subscriptions) if data.subscriptions
                 else (None, 0))
    out.append(_figure("Expected vs delivered per subscription", svg, left, "subscriptions",
                       nothing))
    out.append(_figure("Latency distribution", _plots.latency_svg(data.latencies_ms)
                       if data.latencies_ms else None, 0, "", nothing))
    return out


def _per_source(summary: Mapping[str, Any]) -> str:
    per = summary.get("per_source") or {}
    return "<h2>Per source</h2>" + _table(
        "Sources", ["source", "first seq", "last seq", "messages", "gaps", "findings"],
        [(s, v.get("first"), v.get("last"), v.get("messages"), v.get("gaps"), v.get("findings"))
         for s, v in sorted(per.items())])


def _per_subscription(summary: Mapping[str, Any]) -> str:
    per = summary.get("per_subscription") or {}
    keys = ("subscriber", "topic", "link", "expected", "delivered", "missing", "extra",
            "duplicated", "reordered", "withheld")
    rows = []
    for label, v in sorted(per.items()):
        lat = v.get("latency_ms") or {}
        rows.append((label, *(v.get(k) for k in keys),
                     lat.get("p50"), lat.get("p99"), lat.get("max")))
    return "<h2>Per subscription</h2>" + _table(
        "Subscriptions", ["subscription", *keys, "p50 ms", "p99 ms", "max ms"], rows)
