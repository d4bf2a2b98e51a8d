"""`apexps selector check`, in-process and as the installed console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from adapters.cli.main import main

from .test_fields import DRAFT_JMS, DRAFT_MESSAGE

APEXPS = Path(sys.executable).parent / "apexps"


@pytest.fixture(name="quote")
def _quote(tmp_path: Path) -> Path:
    path = tmp_path / "quote.xml"
    path.write_bytes(DRAFT_MESSAGE)
    return path


def test_check_reports_match_per_file(quote: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 0 and one `FILE: match` / `FILE: no match` line per file."""
    calm = tmp_path / "calm.xml"
    calm.write_bytes(DRAFT_MESSAGE.replace(b">10.0<", b">1.0<"))
    assert main(["selector", "check", "--class", "JMS", DRAFT_JMS, str(quote), str(calm)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{quote}: match", f"{calm}: no match"]


def test_check_shows_567_with_caret(quote: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 with `error 567: <reason> at position N` and a caret under the expression."""
    assert main(["selector", "check", "--class", "JMS", "a = 1 AND (b > 2", str(quote)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error 567: unbalanced parentheses: '(' is never closed at position 10"
    assert err[1] == "  a = 1 AND (b > 2"
    assert err[2] == "  " + " " * 10 + "^"


def test_check_unknown_class_and_bad_file(quote: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown class is 566; an unreadable or ill-formed file is reported, exit 2."""
    assert main(["selector", "check", "--class", "XPath", "/a", str(quote)]) == 2
    assert "error 566" in capsys.readouterr().err
    bad = tmp_path / "bad.xml"
    bad.write_text("<q>")
    assert main(["selector", "check", "--class", "RFC-2254", "(symbol=XMPL)",
                 str(bad), str(quote)]) == 2
    captured = capsys.readouterr()
    assert "error 561" in captured.err
    assert captured.out.splitlines() == [f"{quote}: match"]


def test_console_script_reads_stdin() -> None:
    """The installed `apexps` reads one message from stdin when no FILE is given."""
    proc = subprocess.run(
        [str(APEXPS), "selector", "check", "--class", "RFC-2254",
         "&(symbol='XMPL') (|(net-change-pct > 5.0)(net-change-pct < -5.0))"],
        input=DRAFT_MESSAGE, capture_output=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().strip() == "-: match"
    proc = subprocess.run([str(APEXPS), "selector", "check", "--class", "JMS", "a >", "-"],
                          input=b"<q/>", capture_output=True, check=False, timeout=60)
    assert proc.returncode == 2
    assert b"error 567" in proc.stderr
