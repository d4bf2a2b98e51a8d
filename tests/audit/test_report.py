"""report.html from ReportData: self-contained, escaped, complete, and honest when empty."""

from __future__ import annotations

import re
from pathlib import Path

from adapters.audit.report import CATEGORIES, ReportData, render, write_report

T0 = 1_700_000_000_000
HOSTILE = '<script>alert("x")</script>'


def _summary(**over: object) -> dict[str, object]:
    summary: dict[str, object] = {
        "clean": False, "empty": False, "note": "",
        "window": {"from": "2026-11-01T00:00:00+00:00", "to": None},
        "offsets": {"ns.journal": {"0": [0, 120], "1": [3, 77]}},
        "counts": dict.fromkeys(CATEGORIES, 0) | {"missing": 2, "source_hole": 1},
        "per_source": {HOSTILE: {"first": 1, "last": 120, "messages": 118, "gaps": 1,
                                 "findings": 1}},
        "per_subscription": {"jade/s1": {
            "subscriber": "jade@example.com", "topic": "t", "link": "L1", "expected": 40,
            "delivered": 38, "missing": 2, "extra": 0, "duplicated": 0, "reordered": 0,
            "withheld": 0, "latency_ms": {"p50": 1.5, "p99": 31.25, "max": 40.0}}},
        "decisions": {"total": 80, "reconciled": 79, "fraction": 0.9875},
        "generated_at": "2026-11-25T21:00:00+00:00",
    }
    return summary | over


def _data(**over: object) -> ReportData:
    return ReportData(
        summary=_summary(**over),
        source_series=[(HOSTILE, T0 + i * 60_000, 12, int(i == 4)) for i in range(10)],
        subscriptions=[("jade/s1", 40, 38, 2, 0), ("$a$ b", 5, 5, 0, 0)],
        latencies_ms=[0.5 + i % 37 for i in range(300)],
        holes=[(HOSTILE, 57, 58, T0 + 4 * 60_000)],
    )


def test_report_is_written_whole_with_three_figures(tmp_path: Path) -> None:
    """write_report leaves exactly report.html, holding one inline SVG per figure."""
    path = write_report(tmp_path / "out", _data())
    assert path == tmp_path / "out" / "report.html"
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]
    page = path.read_text()
    assert page.count("<svg") == 3
    assert page.startswith("<!DOCTYPE html>")


def test_report_needs_no_network_or_script() -> None:
    """No script, stylesheet link, image source or external url: the page opens from disk."""
    page = render(_data())
    assert "<script" not in page
    assert not re.search(r"<link|<img|<iframe|\bsrc=|@import", page)
    # The SVGs' namespace and metadata URIs are names, not fetches; what a browser would fetch
    # is an href or url() that is not a fragment of the page itself.
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', page))
    assert all(u.startswith("#") for u in re.findall(r"url\(([^)]*)\)", page))


def test_strings_from_the_data_are_escaped() -> None:
    """A source named like markup shows as text, never as markup."""
    page = render(_data(note=HOSTILE))
    assert HOSTILE not in page
    assert html_escaped(HOSTILE) in page


def html_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") \
        .replace('"', "&quot;").replace("'", "&#x27;")


def test_every_category_and_number_of_the_summary_is_on_the_page() -> None:
    """Counts per category (zeros too), window, offsets, decisions, per-source/subscription."""
    page = render(_data())
    counts = re.search(r'<table id="counts">.*?</table>', page, re.S)
    assert counts is not None
    rows = dict(re.findall(r"<tr[^>]*><td>(\w+)</td><td>(\d+)</td></tr>", counts.group(0)))
    assert rows == {c: str(n) for c, n in _summary()["counts"].items()}  # type: ignore[attr-defined]
    for text in ("Not clean: 3 findings.", "2026-11-01T00:00:00+00:00", "<td>77</td>",
                 "0.9875", "<td>118</td>", "jade@example.com", "<td>31.25</td>", "<td>57</td>"):
        assert text in page, text


def test_clean_audit_says_clean() -> None:
    """A clean summary gets the clean verdict."""
    page = render(_data(clean=True, counts=dict.fromkeys(CATEGORIES, 0)))
    assert "Clean: no findings." in page


def test_empty_audit_says_so_and_draws_nothing(tmp_path: Path) -> None:
    """An empty audit is a page that says it is empty and why, with no empty axes."""
    data = ReportData(summary={"clean": True, "empty": True, "note": "unknown topic",
                               "counts": dict.fromkeys(CATEGORIES, 0)},
                      source_series=[], subscriptions=[], latencies_ms=[], holes=[])
    page = write_report(tmp_path, data).read_text()
    assert "Empty audit" in page
    assert "unknown topic" in page
    assert "<svg" not in page


def test_many_sources_are_capped_in_the_figure_not_in_the_tables() -> None:
    """Past MAX_PANELS sources the figure says how many it left out."""
    from adapters.audit import _plots

    n = _plots.MAX_PANELS + 3
    data = ReportData(summary=_summary(), subscriptions=[], latencies_ms=[], holes=[],
                      source_series=[(f"s{i}", T0, 1, 0) for i in range(n)])
    assert "3 more sources not drawn" in render(data)
