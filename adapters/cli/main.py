"""`apexps`: run the broker, its local Kafka, and talk to it.

Each group of subcommands lives in its own module exposing `register(subparsers)`; the module
sets `func` on its parser, which returns the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from adapters.local.provision import ProvisionError
from common.errors import ApexpsError

from . import logs

#: Modules that add subcommands, in the order `--help` lists them.
COMMAND_MODULES = (
    "adapters.cli.run_cmd",
    "adapters.cli.kafka_cmd",
    "adapters.cli.access_cmd",
    "adapters.cli.selector_cmd",
    "adapters.cli.replay_cmd",
    "adapters.cli.bench_cmd",
    "adapters.cli.client_cmd",
    "adapters.cli.pubsub_cmd",
    "adapters.cli.watch_cmd",
    "adapters.cli.security",
    "adapters.cli.audit_cmd",
    "adapters.cli.gateway_cmd",
)

#: Exit codes: 0 success, 1 the operation failed (the peer or Kafka said no), 2 bad usage or
#: bad input, 3 a needed service is unreachable, 130 interrupted.
EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 1, 2, 3, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="apexps",
        description=(
            "apexps: a Kafka-backed robust publish-subscribe broker speaking APEX over BEEP.\n"
            "Start everything locally with `apexps up`; see `apexps COMMAND --help`."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="how much to log (default: info)",
    )
    parser.add_argument(
        "--log-json", action="store_true", default=None,
        help="log JSON lines even on a terminal (the default when stderr is not a terminal)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # a command group not built yet
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level, json=args.log_json)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(func(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ApexpsError as exc:
        meaning = type(exc).description
        detail = "" if str(exc) == meaning else f": {exc}"
        print(f"apexps: error {int(exc.code)} ({meaning}){detail}", file=sys.stderr)
        return EXIT_UNAVAILABLE if exc.retriable else EXIT_FAILED
    except ProvisionError as exc:  # no Maven, no pom: the message says what to do
        print(f"apexps: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (ConnectionError, TimeoutError) as exc:
        where = getattr(args, "server", None)
        at = f" at {where[0]}:{where[1]}" if isinstance(where, tuple) else ""
        print(f"apexps: cannot reach the broker{at} ({exc.__class__.__name__}); is it running"
              " (`apexps up`), and is --server right?", file=sys.stderr)
        return EXIT_UNAVAILABLE


if __name__ == "__main__":
    sys.exit(main())
