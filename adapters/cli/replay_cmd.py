"""`apexps replay`: a topic's history from the journal, as a subscriber would have received it.

    apexps replay --topic equity.quote --out quotes.jsonl
    apexps replay --topic equity.quote --selector "symbol = 'XMPL' AND price > 100" \\
        --from 2026-11-25T08:00:00Z --to 2026-11-25T09:00:00Z --out xmpl.jsonl
    apexps replay --topic equity.quote --source fred@example.com --after 1041 --out tail.jsonl
    apexps replay --topic equity.quote --as jade@example.com --format parquet --out jade/

Messages come in per-source order (sorted by source, then source seq), each once. Spark reads
the journal from Kafka (spark-avro decodes it in the JVM) and applies the selector compiled to
Spark SQL, with the live broker's semantics; docs/replay.md is the guide.

Output: jsonl (default) is one JSON object per message, in order; its `content` is the text when
the bytes are UTF-8, else base64 with `"content_encoding": "base64"`. parquet is a directory
of Parquet files (typed columns, content as bytes), which must not exist or be empty.

Whose view: by default every message of the topic the broker sent on (the journal's view, less
what had expired when it was published), each with its permission token. `--as ENDPOINT`
replays what that endpoint is entitled to receive under the permission-token grants and denies
in the access registry now. `--include-expired` keeps the messages that had expired when
published, which no subscriber was sent.

Exit codes: 0 done (also when the window holds no message: the log says it is empty), 1 the
Spark job failed, 2 bad usage (a bad selector prints the 567 reason and where; a bad --from or
--to), 3 Kafka or Spark unreachable.
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

from adapters.cli.paths import default_data_dir, kafka_bootstrap
from broker import selectors
from broker.kafka_io import KafkaConfig, answers, partition_count
from broker.spark.replay import message_tokens, replay
from broker.spark.source import Bound, parse_bound
from common.errors import (
    JournalUnavailable,
    KafkaNotFound,
    SelectorError,
    UnsupportedSelectorClass,
)

__all__ = ["register"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3

#: How long the up-front reachability checks wait: long enough for a loaded machine, short
#: enough that a wrong address is reported before anyone wonders whether it hangs.
CONNECT_TIMEOUT_S = 5.0

log = structlog.get_logger("apexps.replay")


class _Usage(Exception):
    """Bad usage: the message is printed as is, exit 2."""


class _Unreachable(Exception):
    """Kafka or Spark cannot be reached: the message says what to do, exit 3."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "replay", help="write a topic's history from the journal, as a subscriber received it",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_argument_group("what to replay")
    what.add_argument("--topic", required=True, metavar="T", help="the topic to replay")
    what.add_argument("--selector", metavar="EXPR",
                      help="keep only the messages this selector matches")
    what.add_argument("--class", dest="selector_class", default="JMS", metavar="CLASS",
                      help="the selector's class: JMS (default) or RFC-2254")
    what.add_argument("--from", dest="start", metavar="WHEN",
                      help="start of the window: an ISO time (UTC unless it says otherwise; "
                           "by the journal's append time), earliest, or Spark offsets JSON "
                           "(default: earliest)")
    what.add_argument("--to", dest="end", metavar="WHEN",
                      help="end of the window, exclusive; same forms (default: latest)")
    what.add_argument("--source", metavar="S", help="only this source's messages")
    what.add_argument("--after", type=int, metavar="N",
                      help="with --source: only its source seqs greater than N")
    what.add_argument("--as", dest="viewer", metavar="ENDPOINT",
                      help="only what ENDPOINT is entitled to receive under the permission-"
                           "token grants and denies in the access registry")
    what.add_argument("--include-expired", action="store_true",
                      help="also the messages that had expired when published (never sent)")
    out = p.add_argument_group("output")
    out.add_argument("--out", required=True, type=Path, metavar="PATH",
                     help="a file (jsonl) or a new directory (parquet)")
    out.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl",
                     help="jsonl (default): one JSON object per message; parquet: a directory")
    where = p.add_argument_group("where")
    where.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT…]",
                       help="Kafka bootstrap servers (default: the local Kafka of --data-dir)")
    where.add_argument("--namespace", default="apexps", metavar="NS",
                       help="the broker's namespace (its Kafka topics are NS.*; default apexps)")
    where.add_argument("--data-dir", default=str(default_data_dir()), metavar="DIR",
                       help="where `apexps up` keeps the local Kafka (default: %(default)s)")
    where.add_argument("--master", default="local[*]", metavar="URL",
                       help="Spark master: local[*] (default), local[N] or spark://HOST:PORT")
    p.set_defaults(func=_run)


def _caret(expression: str, position: int) -> str:
    start = expression.rfind("\n", 0, position) + 1
    end = expression.find("\n", position)
    line = expression[start: len(expression) if end < 0 else end]
    return f"  {line}\n  {' ' * (position - start)}^"


def _compile(args: argparse.Namespace) -> selectors.Selector | None:
    if args.selector is None:
        return None
    try:
        return selectors.compile(args.selector_class, args.selector)
    except UnsupportedSelectorClass as exc:
        raise _Usage(f"error {int(exc.code)}: {exc}") from None
    except SelectorError as exc:
        where = "" if exc.position is None else f" at position {exc.position}"
        text = f"error {int(exc.code)}: {exc.reason}{where}"
        if exc.position is not None:
            text += "\n" + _caret(args.selector, min(exc.position, len(args.selector)))
        raise _Usage(text) from None


def _bound(text: str | None, flag: str) -> Bound:
    if text is None:
        return None
    try:
        return parse_bound(text)
    except ValueError as exc:
        raise _Usage(f"{flag}: {exc}") from None


def _check_usage(args: argparse.Namespace) -> None:
    if args.after is not None and args.source is None:
        raise _Usage("--after needs --source: source seqs are numbered per source")
    if args.format == "parquet" and args.out.exists() and (
            not args.out.is_dir() or any(args.out.iterdir())):
        raise _Usage(f"--out {args.out} exists; parquet output goes to a new or empty directory")
    if args.format == "jsonl" and args.out.is_dir():
        raise _Usage(f"--out {args.out} is a directory; jsonl output is one file")




def _check_master(master: str) -> None:
    """A standalone master that does not answer fails here, in seconds, rather than after
    Spark's own retries."""
    if not master.startswith("spark://"):
        return
    for hostport in master.removeprefix("spark://").split(","):
        host, _, port = hostport.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
            return
        except (OSError, ValueError):
            continue
    raise _Unreachable(f"no Spark master answers at {master}; check --master (or use the "
                       "default, local[*])")


class _Progress:
    """Stages on a terminal (rich), one structured log line per stage otherwise."""

    def __init__(self, live: bool) -> None:
        self._live = live
        self._bar: Any = None
        self._task: Any = None

    @contextmanager
    def running(self) -> Iterator[_Progress]:
        if not self._live:
            yield self
            return
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(SpinnerColumn(), TextColumn("{task.description}"),
                      TextColumn("{task.completed} messages"), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            self._bar, self._task = bar, bar.add_task("starting", total=None)
            yield self

    def stage(self, name: str, **fields: Any) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=name)
        else:
            log.info("replay stage", stage=name, **fields)

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)


def _json_row(row: Any) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for key, value in row.asDict().items():
        if key != "content":
            d[key] = value
            continue
        try:
            d["content"], d["content_encoding"] = bytes(value).decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            d["content"], d["content_encoding"] = base64.b64encode(value).decode(), "base64"
    return d


def _write_jsonl(df: Any, out: Path, progress: _Progress) -> int:
    from pyspark.sql import functions as F

    # Times as epoch milliseconds, as `apexps subscribe` prints them: exact, and free of the
    # driver's time zone (collect() renders timestamps in local time).
    df = df.withColumns({c: F.unix_millis(c) for c in ("appended_at", "publication_date")})
    count = 0
    with out.open("w", encoding="utf-8") as f:
        for row in df.toLocalIterator():
            f.write(json.dumps(_json_row(row), ensure_ascii=False) + "\n")
            count += 1
            if count % 1000 == 0:
                progress.advance(1000)
    progress.advance(count % 1000)
    return count


def _write_parquet(df: Any, out: Path) -> int:
    df = df.cache()
    df.write.mode("overwrite").parquet(str(out))  # an empty directory at most (_check_usage)
    return int(df.count())


def _viewer_tokens(config: KafkaConfig, journal: Any, topic: str, viewer: str) -> list[str]:
    """The tokens the topic's messages carry that `viewer` may receive, decided by the live
    rule (AccessControl.token_allowed over the access registry as it is now)."""
    from broker.access import AccessControl, access_registry
    from broker.kafka_producer import KafkaProducer

    producer = KafkaProducer(config)  # the registry's writer side; nothing is written
    try:
        registry = access_registry(config, producer)
        registry.load()
        control = AccessControl(registry)
        return [t for t in message_tokens(journal, topic)
                if control.token_allowed(viewer, t, topic)]
    finally:
        producer.close()


def _run(args: argparse.Namespace) -> int:
    try:
        _check_usage(args)
        selector = _compile(args)
        start, end = _bound(args.start, "--from"), _bound(args.end, "--to")
        config = KafkaConfig(bootstrap=kafka_bootstrap(args.bootstrap, args.data_dir),
                             namespace=args.namespace)
        if not answers(config.bootstrap, timeout_s=CONNECT_TIMEOUT_S):
            raise _Unreachable(f"no Kafka answers at {config.bootstrap}; check --bootstrap "
                               "(or start the local one with `apexps up`)")
        _check_master(args.master)
    except _Usage as exc:
        print(f"apexps replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (_Unreachable, KafkaNotFound) as exc:
        print(f"apexps replay: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    live = sys.stderr.isatty() and not args.log_json
    progress = _Progress(live)
    with progress.running():
        return _replay(args, config, selector, start=start, end=end, progress=progress)


def _replay(args: argparse.Namespace, config: KafkaConfig, selector: selectors.Selector | None,
            *, start: Bound, end: Bound, progress: _Progress) -> int:
    from adapters.local.spark import local_session
    from broker.spark.journal_reader import load_journal

    note = None
    try:
        partition_count(config, config.topic("journal"))
    except JournalUnavailable:
        note = (f"namespace {args.namespace!r} has no journal (no Kafka topic "
                f"{config.topic('journal')}); is --namespace the broker's?")
    progress.stage("starting Spark", master=args.master)
    try:
        # Spark's console progress bar would interleave with ours, or with the JSON log lines.
        spark = local_session(app_name="apexps replay", master=args.master,
                              conf={"spark.ui.showConsoleProgress": "false"})
    except Exception as exc:  # py4j and the JVM launcher raise plain exceptions
        print(f"apexps replay: cannot start Spark at {args.master} ({_first_line(exc)}); "
              "check --master and that Java 17 is installed", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        progress.stage("reading the journal", topic=args.topic)
        if note is None:
            journal = load_journal(spark, config, start=start, end=end)
        else:
            journal = _empty_journal(spark)
        tokens = None
        if args.viewer is not None:  # no journal, no messages: no access registry to read
            tokens = [] if note else _viewer_tokens(config, journal, args.topic, args.viewer)
        df = replay(journal, topic=args.topic, selector=selector, source=args.source,
                    after=args.after, tokens=tokens, include_expired=args.include_expired)
        progress.stage(f"writing {args.format}", out=str(args.out))
        count = (_write_jsonl(df, args.out, progress) if args.format == "jsonl"
                 else _write_parquet(df, args.out))
    except Exception as exc:  # a Spark job's failure reaches Python as a Py4J/PySpark error
        print(f"apexps replay: the Spark job failed: {_first_line(exc)}", file=sys.stderr)
        return EXIT_FAILED
    if count == 0:
        log.info("replay empty", topic=args.topic, out=str(args.out),
                 note=note or f"no messages of topic {args.topic!r} in the window")
    else:
        log.info("replay written", topic=args.topic, out=str(args.out), messages=count)
    print(f"replayed {count} messages of {args.topic} to {args.out}")
    return EXIT_OK


def _empty_journal(spark: Any) -> Any:
    """A journal with no rows but decode_journal's columns, for a namespace with no journal."""
    from pyspark.sql import functions as F

    from broker.spark.journal_reader import decode_journal

    raw = spark.range(0).select(
        F.lit(None).cast("binary").alias("key"), F.lit(None).cast("binary").alias("value"),
        F.lit(0).alias("partition"), F.lit(0).cast("long").alias("offset"),
        F.lit(None).cast("timestamp").alias("timestamp"))
    return decode_journal(raw, python_fallback=False)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
