"""Compile a selector offline and try it on XML files (`apexps selector check`).

    apexps selector check --class JMS "symbol = 'XMPL' AND net-change-pct > 5" quote.xml
    quote.xml: match

With no FILE (or `-`), one message is read from standard input. Exit 0 when the selector
compiles (whether or not the files match), 2 with `error 567: <reason> at position N` and a
caret under the expression when it does not, 2 with `error 566` for an unknown class, and 2
with `error 561` for a file that is not an acceptable message (the other files are still
checked).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from broker import selectors
from common.errors import InvalidMessage, SelectorError, UnsupportedSelectorClass

EXIT_OK, EXIT_USAGE = 0, 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("selector", help="check message selectors offline",
                               description="Check message selectors offline, without a broker.")
    sub = parser.add_subparsers(dest="selector_command", metavar="SUBCOMMAND", required=True)
    check = sub.add_parser(
        "check",
        help="compile a selector and report whether XML messages match it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument(
        "--class", dest="selector_class", required=True, metavar="CLASS",
        help="selector class: " + " or ".join(c.value for c in selectors.SelectorClass),
    )
    check.add_argument("expression", metavar="EXPR", help="the selector text")
    check.add_argument("files", nargs="*", metavar="FILE",
                       help="XML messages to test (default: one from standard input)")
    check.add_argument("--schema", metavar="XSD", type=Path,
                       help="the topic's selector schema (XML Schema) to compile against")
    check.set_defaults(func=_check)


def _caret(expression: str, position: int) -> str:
    """The expression's line holding `position`, and a caret under that character."""
    start = expression.rfind("\n", 0, position) + 1
    end = expression.find("\n", position)
    line = expression[start : len(expression) if end < 0 else end]
    return f"  {line}\n  {' ' * (position - start)}^"


def _check(args: argparse.Namespace) -> int:
    schema = None
    try:
        if args.schema is not None:
            schema = selectors.parse_selector_schema(args.schema.read_bytes())
        selector = selectors.compile(args.selector_class, args.expression, schema)
    except UnsupportedSelectorClass as exc:
        print(f"error {int(exc.code)}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SelectorError as exc:
        where = f" at position {exc.position}" if exc.position is not None else ""
        print(f"error {int(exc.code)}: {exc.reason}{where}", file=sys.stderr)
        if exc.position is not None:
            print(_caret(args.expression, min(exc.position, len(args.expression))),
                  file=sys.stderr)
        return EXIT_USAGE
    status = EXIT_OK
    for name in args.files or ["-"]:
        try:
            data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
            verdict = "match" if selector.matches(data, schema) else "no match"
        except InvalidMessage as exc:
            print(f"{name}: error {int(exc.code)}: {exc}", file=sys.stderr)
            status = EXIT_USAGE
            continue
        except OSError as exc:
            print(f"{name}: {exc.strerror or exc}", file=sys.stderr)
            status = EXIT_USAGE
            continue
        print(f"{name}: {verdict}")
    return status
