"""The command line reads options wherever a user puts them after the command."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.cli.main import build_parser, main

_AS = ["--server", "127.0.0.1:9", "--as", "admin@example.com"]


@pytest.mark.parametrize("action", ["create", "delete"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_topic_actions_take_options_before_or_after_the_name(action: str, where: str) -> None:
    argv = ["topic", action, *_AS, "quotes"] if where == "before" else \
        ["topic", action, "quotes", *_AS]
    args = build_parser().parse_args(argv)
    assert (args.action, args.name, args.server, args.endpoint) == \
        (action, "quotes", ("127.0.0.1", 9), "admin@example.com")


def test_topic_list_takes_no_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["topic", "list", *_AS]).action == "list"
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["topic", "list", "quotes", *_AS])
    assert exited.value.code == 2
    assert "unrecognized arguments: quotes" in capsys.readouterr().err


def test_topic_create_without_a_name_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["topic", "create", *_AS])
    assert exited.value.code == 2
    assert "required: NAME" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["audit", "--out", "{tmp}/audit"],
    ["replay", "--topic", "quotes", "--out", "{tmp}/replay.jsonl"],
    ["access", "list"],
])
def test_commands_without_a_kafka_say_how_to_get_one(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No --bootstrap and no local Kafka under --data-dir: exit 3 and a line that names both
    ways out, rather than a connection timeout."""
    args = [a.format(tmp=tmp_path) for a in argv]
    assert main([*args, "--data-dir", str(tmp_path / "nothing-here")]) == 3
    err = capsys.readouterr().err
    assert "--bootstrap" in err and "apexps up" in err and "Traceback" not in err
