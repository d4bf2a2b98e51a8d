"""Manage the access entries of the apex=pubsub service (who may use which operation on which
topic) and its permission-token grants and denies (who receives which tagged messages), in
Kafka, while brokers run. docs/access-control.md is the guide.

The commands read and write the compacted access topic (`NAMESPACE.access`) directly. A running
broker follows that topic and applies changes within about a second; nothing needs restarting.
Entries made here get ids `cli:ID`; `load` manages the `file:` entries; the broker itself keeps
the `subscriber:` grants of the "only subscribers may publish" policy (broker/access.py has
the matching rules and the file format).

Kafka: `--bootstrap HOST:PORT` names any cluster; without it, the local Kafka that `apexps up`
or `apexps kafka start` runs from `--data-dir` is used. `--namespace` must match the broker's.

Permission tokens (XEP-0040 §5.1): `grant-token SUBSCRIBER TOKENS` and `deny-token` decide
which messages carrying an in-band token each subscriber receives; a deny wins, nothing is
granted by default. TOKENS is a comma list of exact tokens, PREFIX* and LOW-HIGH ranges
(`6747,6000-6999,fx.*`; broker/entitlements.py has the grammar).

Exit codes: 0 done (check: allowed, check-token: delivered), 1 refused or not found (check:
denied, check-token: withheld), 2 bad input (an invalid pattern, token, token set, topic or
file), 3 Kafka unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from adapters.cli.paths import default_data_dir, kafka_bootstrap
from broker.access import (
    CLI_PREFIX,
    SHORTHANDS,
    AccessControl,
    Token,
    access_registry,
)
from broker.core import BrokerCore
from broker.entitlements import parse_token_set
from broker.kafka_io import KafkaConfig, ensure_topics, partition_count
from broker.kafka_producer import KafkaProducer
from broker.records import AccessEffect, AccessEntry, AccessKind, now_ms
from common.errors import (
    ApexpsError,
    ConfigError,
    InvalidParameter,
    JournalUnavailable,
    KafkaNotFound,
    NotTaken,
)

__all__ = ["register"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3

_TOKENS_HELP = ", ".join([*Token, *SHORTHANDS])


def _fail(exc: ApexpsError | str, code: int) -> int:
    text = f"error {int(exc.code)}: {exc}" if isinstance(exc, ApexpsError) else exc
    print(f"apexps: {text}", file=sys.stderr)
    return code




@contextmanager
def _control(args: argparse.Namespace, *, create: bool) -> Iterator[AccessControl]:
    """The access entries of `args.namespace`, loaded. Writers may create the access topic
    (so entries can be configured before the first broker start); readers refuse a namespace
    no broker has used, which is nearly always a mistyped --namespace."""
    from broker.kafka_io import answers

    config = KafkaConfig(bootstrap=kafka_bootstrap(args.bootstrap, args.data_dir),
                         namespace=args.namespace)
    if not answers(config.bootstrap, timeout_s=10.0):
        raise KafkaNotFound(f"no Kafka answers at {config.bootstrap}; check --bootstrap")
    topic = config.topic("access")
    if create:
        ensure_topics(config, {topic: BrokerCore(config).kafka_topics()[topic]})
    else:
        try:
            partition_count(config, topic)
        except JournalUnavailable:
            raise NotTaken(
                f"namespace {args.namespace!r} has no access entries yet (no Kafka topic "
                f"{topic}); is --namespace the broker's?") from None
    producer = KafkaProducer(config)
    try:
        registry = access_registry(config, producer)
        registry.load()
        yield AccessControl(registry)
    finally:
        producer.close()


def _row(e: AccessEntry) -> dict[str, Any]:
    return {"id": e.entry_id, "kind": str(e.kind), "effect": str(e.effect),
            "originator": e.originator, "tokens": list(e.tokens), "topic": e.topic,
            "created_at": e.created_at}


def _effect(e: AccessEntry) -> str:
    """What the entry does, as the command that makes it is named."""
    if e.kind is AccessKind.PERMTOKEN:
        return "grant-token" if e.effect is AccessEffect.ALLOW else "deny-token"
    return str(e.effect)


def _tokens(e: AccessEntry) -> str:
    return ",".join(e.tokens) if e.kind is AccessKind.PERMTOKEN else " ".join(e.tokens)


def _describe(e: AccessEntry) -> str:
    where = f" on {e.topic}" if e.topic is not None else ""
    return f"{_effect(e)} {e.entry_id}: {e.originator} {_tokens(e)}{where}"


def _list(args: argparse.Namespace) -> int:
    with _control(args, create=False) as control:
        entries = control.entries()
    if args.json:
        print(json.dumps([_row(e) for e in entries]))
        return EXIT_OK
    if not entries:
        print("no access entries: every request is denied")
        return EXIT_OK
    rows = [("ID", "EFFECT", "ORIGINATOR", "TOKENS", "TOPIC")] + [
        (e.entry_id, _effect(e), e.originator, _tokens(e), e.topic or "*")
        for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[4])
    return EXIT_OK


def _entry_id(given: str | None) -> str:
    if given is None:
        return CLI_PREFIX + uuid.uuid4().hex[:8]
    if given.startswith(CLI_PREFIX):
        return given
    prefix, colon, _ = given.partition(":")
    if colon and prefix in ("file", "subscriber"):
        raise InvalidParameter(
            f"id {given!r}: file: entries come from `apexps access load` and subscriber: "
            "entries from the broker; choose an id without that prefix")
    return CLI_PREFIX + given


def _put(args: argparse.Namespace, effect: AccessEffect) -> int:
    try:
        entry = AccessEntry(entry_id=_entry_id(args.id), originator=args.originator,
                            tokens=tuple(args.tokens), effect=effect, created_at=now_ms(),
                            topic=args.topic)
        with _control(args, create=True) as control:
            stored = control.put(entry)
    except InvalidParameter as exc:
        return _fail(exc, EXIT_USAGE)
    print(_describe(stored))
    return EXIT_OK


def _put_tokens(args: argparse.Namespace, effect: AccessEffect) -> int:
    try:
        entry = AccessEntry(entry_id=_entry_id(args.id), originator=args.subscriber,
                            tokens=parse_token_set(args.tokens).items, effect=effect,
                            created_at=now_ms(), topic=args.topic, kind=AccessKind.PERMTOKEN)
        with _control(args, create=True) as control:
            stored = control.put(entry)
    except InvalidParameter as exc:
        return _fail(exc, EXIT_USAGE)
    print(_describe(stored))
    return EXIT_OK


def _remove(args: argparse.Namespace) -> int:
    with _control(args, create=False) as control:
        ids = [args.id] if ":" in args.id else [args.id, CLI_PREFIX + args.id]
        for eid in ids:
            if control.remove(eid):
                print(f"removed {eid}")
                if eid.startswith("file:"):
                    print("note: the next `apexps access load` brings file entries back",
                          file=sys.stderr)
                return EXIT_OK
    return _fail(f"no access entry {args.id!r}; `apexps access list` shows the ids",
                 EXIT_FAILED)


def _load(args: argparse.Namespace) -> int:
    try:
        with _control(args, create=True) as control:
            count = control.load_file(args.file, domain=args.domain)
    except ConfigError as exc:
        return _fail(exc, EXIT_USAGE)
    print(f"loaded {count} entries from {args.file}")
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    try:
        with _control(args, create=False) as control:
            allowed = control.allowed(args.originator, args.token, args.topic)
            why = control.explain(args.originator, args.token, args.topic)
    except InvalidParameter as exc:
        return _fail(exc, EXIT_USAGE)
    reason = f"by {_describe(why)}" if why is not None else "no entry allows it"
    print(f"{'allowed' if allowed else 'denied'} ({reason})")
    return EXIT_OK if allowed else EXIT_FAILED


def _check_token(args: argparse.Namespace) -> int:
    with _control(args, create=False) as control:
        allowed = control.token_allowed(args.subscriber, args.token, args.topic)
        why = control.explain_token(args.subscriber, args.token, args.topic)
    reason = f"by {_describe(why)}" if why is not None else "no entry grants it"
    print(f"{'delivered' if allowed else 'withheld'} ({reason})")
    return EXIT_OK if allowed else EXIT_FAILED


def _kafka_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT…]",
                   help="Kafka bootstrap servers (default: the local Kafka of --data-dir)")
    p.add_argument("--namespace", default="apexps", metavar="NS",
                   help="prefix of the broker's Kafka topics (default: %(default)s)")
    p.add_argument("--data-dir", default=str(default_data_dir()), metavar="DIR",
                   help="where `apexps up` keeps the local Kafka (default: %(default)s)")


def _entry_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("originator", metavar="ORIGINATOR",
                   help="who: an endpoint (fred@example.com), NAME/* (every subaddress), "
                        "*@DOMAIN, *@*.DOMAIN, apex=*@DOMAIN (services), or * (everyone)")
    p.add_argument("tokens", nargs="+", metavar="TOKEN", help=f"one or more of {_TOKENS_HELP}")
    p.add_argument("--topic", metavar="TOPIC",
                   help="limit the entry to one topic, or NAME.* for a family "
                        "(default: every topic)")
    p.add_argument("--id", metavar="ID",
                   help="the entry's id, stored as cli:ID; putting the same id again replaces "
                        "the entry (default: a fresh random id)")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "access", help="list, change and test who may use the pubsub service",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    asub = p.add_subparsers(dest="access_command", metavar="ACTION", required=True)

    parsers = []
    ls = asub.add_parser("list", help="show every access entry",
                         description="Show every access entry, sorted by id.")
    ls.add_argument("--json", action="store_true", help="print one JSON array")
    ls.set_defaults(func=_list)
    parsers.append(ls)

    for effect, text in ((AccessEffect.ALLOW, "allow ORIGINATOR the TOKENs"),
                         (AccessEffect.DENY, "deny ORIGINATOR the TOKENs, whatever allows it")):
        sp = asub.add_parser(
            str(effect), help=text,
            description=f"{text[0].upper()}{text[1:]}. A deny overrides every allow; nothing "
                        "is allowed unless an entry allows it. Prints the stored entry.",
            epilog="example: apexps access deny mr.slate@example.com core:data "
                   "--topic music.jazz.milesdavis")
        _entry_options(sp)
        sp.set_defaults(func=lambda a, e=effect: _put(a, e))
        parsers.append(sp)

    for effect, name, text in (
            (AccessEffect.ALLOW, "grant-token",
             "let SUBSCRIBER receive messages carrying one of TOKENS"),
            (AccessEffect.DENY, "deny-token",
             "keep messages carrying one of TOKENS from SUBSCRIBER, whatever grants them")):
        sp = asub.add_parser(
            name, help=text,
            description=f"{text[0].upper()}{text[1:]} (XEP-0040 permission tokens). A deny "
                        "wins over every grant; a tokened message reaches a subscriber only "
                        "if a grant covers it; messages without a token are not affected. "
                        "Prints the stored entry.",
            epilog=f"example: apexps access {name} jade@example.com 6747,6000-6999,fx.* "
                   "--topic equity.*")
        sp.add_argument("subscriber", metavar="SUBSCRIBER",
                        help="whom: an endpoint, NAME/*, *@DOMAIN, *@*.DOMAIN, apex=*@DOMAIN "
                             "or * (everyone)")
        sp.add_argument("tokens", metavar="TOKENS",
                        help="a token set: comma-separated exact tokens, PREFIX* wildcards, "
                             "LOW-HIGH numeric ranges, or * (every token)")
        sp.add_argument("--topic", metavar="TOPIC",
                        help="limit the entry to one topic, or NAME.* for a family "
                             "(default: every topic)")
        sp.add_argument("--id", metavar="ID",
                        help="the entry's id, stored as cli:ID; the same id again replaces "
                             "the entry (default: a fresh random id)")
        sp.set_defaults(func=lambda a, e=effect: _put_tokens(a, e))
        parsers.append(sp)

    rm = asub.add_parser("remove", help="delete an access entry by id",
                         description="Delete the entry with this id (ID alone also finds "
                                     "cli:ID). Exit 1 if there is none.")
    rm.add_argument("id", metavar="ID", help="the entry's id, as `apexps access list` shows it")
    rm.set_defaults(func=_remove)
    parsers.append(rm)

    ld = asub.add_parser(
        "load", help="replace the file: entries with those of an XML file",
        description="Replace every file: entry with the <allow>/<deny>/<grant-token>/"
                    "<deny-token> entries of FILE; "
                    "cli: and subscriber: entries stay. A bad file changes nothing and exits "
                    "2 naming the line.",
        epilog="format: <access domain='example.com'><allow id='locals' "
               "originator='*@example.com' tokens='pubsub:all core:data'/><grant-token "
               "id='desks' subscriber='*@example.com' tokens='6000-6999,7*'/>…</access>")
    ld.add_argument("file", metavar="FILE", type=Path, help="the access file (XML)")
    ld.add_argument("--domain", help="refuse FILE if its domain attribute names another one")
    ld.set_defaults(func=_load)
    parsers.append(ld)

    ck = asub.add_parser(
        "check", help="say whether ORIGINATOR may use TOKEN (exit 0 allowed, 1 denied)",
        description="Decide as the broker would and name the entry that decides.")
    ck.add_argument("originator", metavar="ORIGINATOR", help="an endpoint, e.g. fred@example.com")
    ck.add_argument("token", metavar="TOKEN", help=f"one of {', '.join(Token)}")
    ck.add_argument("--topic", metavar="TOPIC", help="the topic the operation is about")
    ck.set_defaults(func=_check)
    parsers.append(ck)

    ct = asub.add_parser(
        "check-token",
        help="say whether SUBSCRIBER receives messages carrying TOKEN (exit 0 yes, 1 no)",
        description="Decide as the broker's fan-out would and name the entry that decides.")
    ct.add_argument("subscriber", metavar="SUBSCRIBER", help="an endpoint, e.g. jade@example.com")
    ct.add_argument("token", metavar="TOKEN", help="a permission token, e.g. 6747")
    ct.add_argument("--topic", metavar="TOPIC", help="the topic the message is published to")
    ct.set_defaults(func=_check_token)
    parsers.append(ct)

    for sp in parsers:
        _kafka_options(sp)
