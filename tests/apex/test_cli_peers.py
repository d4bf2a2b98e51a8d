"""`--peer DOMAIN=HOST:PORT` and `--accept-peer DOMAIN` on `apexps up` / `apexps broker`."""

from __future__ import annotations

import argparse

import pytest

from adapters.cli import main as cli_main
from adapters.cli.run_cmd import _peer


def test_peer_values_parse_or_say_what_is_expected() -> None:
    """DOMAIN=HOST:PORT parses (domain lower-cased, empty host is loopback); anything else is
    an argparse error naming the expected form."""
    assert _peer("B.Example=10.0.0.2:9120") == ("b.example", "10.0.0.2", 9120)
    assert _peer("b.example=:9120") == ("b.example", "127.0.0.1", 9120)
    for bad in ("b.example", "=h:1", "b.example=h", "b.example=h:99999", "b.example=h:x"):
        with pytest.raises(argparse.ArgumentTypeError):
            _peer(bad)


def test_broker_help_documents_the_peer_options(capsys: pytest.CaptureFixture[str]) -> None:
    """`apexps broker --help` lists both options."""
    with pytest.raises(SystemExit):
        cli_main.main(["broker", "--help"])
    out = capsys.readouterr().out
    assert "--peer DOMAIN=HOST:PORT" in out and "--accept-peer DOMAIN" in out
