"""report.html in a real browser (Debian's chromium, headless, no network): it renders, its
figures are drawn, and the summary's numbers are on the page a person sees."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.audit.report import CATEGORIES, ReportData, write_report
from tests.audit.test_report import _data
from tests.browser import console_errors, requests_outside


def _visible_text(browser: Any) -> str:
    return str(browser.find_element("tag name", "body").text)


def test_report_renders_with_its_figures_and_numbers(browser: Any, tmp_path: Path) -> None:
    """The page loads from disk alone, draws three non-empty SVGs and shows every count."""
    data = _data()
    page = write_report(tmp_path, data)
    requests_outside(browser), console_errors(browser)  # start both logs afresh
    browser.get(page.as_uri())
    assert browser.title == "apexps audit report"
    assert browser.find_element("id", "verdict").text == "Not clean: 3 findings."

    svgs = browser.find_elements("css selector", "figure svg")
    assert len(svgs) == 3
    for svg in svgs:
        size = svg.size
        assert size["width"] > 200 and size["height"] > 100, size
        # Drawn content, not an empty frame: bars, ticks and glyphs are paths/uses.
        drawn = browser.execute_script(
            "return arguments[0].querySelectorAll('path, use, rect').length", svg)
        assert drawn > 20, drawn

    text = _visible_text(browser)
    summary = data.summary
    for category in CATEGORIES:
        count = summary["counts"][category]
        row = browser.find_element("xpath", f'//table[@id="counts"]//tr[td[1]="{category}"]')
        assert row.text.split() == [category, str(count)]
    sub = summary["per_subscription"]["jade/s1"]
    for shown in (summary["window"]["from"], "77", "0.9875", "jade@example.com",
                  str(sub["expected"]), str(sub["delivered"]), str(sub["latency_ms"]["p99"]),
                  '<script>alert("x")</script>'):  # the hostile source name, as text
        assert shown in text, shown
    assert browser.execute_script("return document.scripts.length") == 0
    assert requests_outside(browser) == []
    assert console_errors(browser) == []


def test_empty_report_says_empty_in_the_browser(browser: Any, tmp_path: Path) -> None:
    """An empty audit's page shows the empty verdict and its note, and no figure."""
    data = ReportData(summary={"clean": True, "empty": True,
                               "note": "no records in the window",
                               "counts": dict.fromkeys(CATEGORIES, 0)},
                      source_series=[], subscriptions=[], latencies_ms=[], holes=[])
    browser.get(write_report(tmp_path, data).as_uri())
    assert browser.find_element("id", "verdict").text.startswith("Empty audit")
    assert browser.find_element("id", "note").text == "no records in the window"
    assert browser.find_elements("css selector", "svg") == []
