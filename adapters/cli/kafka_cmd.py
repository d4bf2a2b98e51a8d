"""`apexps kafka start|stop|status`: the project's own single-node Kafka, without Docker."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from adapters.cli.paths import default_data_dir

EXIT_OK, EXIT_NOT_RUNNING = 0, 3


def _kafka(args: argparse.Namespace) -> Any:
    from adapters.local.kafka import DEFAULT_GC, DEFAULT_JIT, LocalKafka

    return LocalKafka(Path(args.data_dir) / "kafka", port=args.port,
                      gc=getattr(args, "gc", None) or DEFAULT_GC,
                      jit=getattr(args, "jit", None) or DEFAULT_JIT)


def _start(args: argparse.Namespace) -> int:
    state = _kafka(args).start()
    print(state.bootstrap)
    return EXIT_OK


def _stop(args: argparse.Namespace) -> int:
    stopped = _kafka(args).stop()
    print("stopped" if stopped else "not running")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    kafka = _kafka(args)
    state, up = kafka.status()
    info = {
        "running": up,
        "bootstrap": state.bootstrap if state else None,
        "pid": state.pid if state and up else None,
        "data_dir": str(kafka.data_dir),
        "log": str(kafka.log_file),
    }
    print(json.dumps(info) if args.json else "\n".join(f"{k}: {v}" for k, v in info.items()))
    return EXIT_OK if up else EXIT_NOT_RUNNING


def register(sub: Any) -> None:
    p = sub.add_parser(
        "kafka", help="start, stop or inspect the local single-node Kafka",
        description="Manage the local Apache Kafka (KRaft, one node) that apexps provisions from "
                    "Maven Central. Its data stays in DATA_DIR/kafka between restarts.",
    )
    ksub = p.add_subparsers(dest="kafka_command", metavar="ACTION", required=True)
    for name, func, text in (
        ("start", _start, "start the local Kafka in the background and print its address"),
        ("stop", _stop, "stop the local Kafka cleanly (SIGTERM, then SIGKILL after 60 s)"),
        ("status", _status, "say whether the local Kafka runs and where (exit 3 if not)"),
    ):
        sp = ksub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        sp.add_argument("--data-dir", default=str(default_data_dir()), metavar="DIR",
                        help="where Kafka keeps its data and logs (default: %(default)s)")
        sp.add_argument("--port", type=int, default=None, metavar="PORT",
                        help="listener port on 127.0.0.1 (default: the last one used, else free)")
        if name == "start":
            # the names of adapters.local.kafka.COLLECTORS (not imported: the CLI starts fast)
            sp.add_argument("--gc", choices=("G1", "ZGC", "Shenandoah"), default=None,
                            help="the JVM's collector (default: the measured one, see"
                                 " docs/operations.md); KAFKA_JVM_PERFORMANCE_OPTS overrides")
            # adapters.local.kafka.JITS, spelled out for the same reason
            sp.add_argument("--jit", choices=("C1", "tiered"), default=None,
                            help="C1: the JVM's quick compiler alone, steady from the first"
                                 " minute (the default, measured on two cores); tiered: C1"
                                 " then C2, less CPU once warm (a long-running Kafka);"
                                 " KAFKA_JVM_PERFORMANCE_OPTS overrides")
        if name == "status":
            sp.add_argument("--json", action="store_true", help="print one JSON object")
        sp.set_defaults(func=func)
