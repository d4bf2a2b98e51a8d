"""Who may do what to the `apex=pubsub` service: access entries in the spirit of RFC 3341.

Theory of operation
-------------------
An entry (`broker.records.AccessEntry`) says that originators matching a pattern are allowed
(or denied) some tokens, for every topic or for one topic (or a `prefix.*` family of topics):

    effect  originator              tokens                      topic
    allow   *@example.com           pubsub:all core:data        (every topic)
    allow   *@*                     pubsub:subscribe            music.jazz.milesdavis
    deny    mr.slate@example.com    core:data                   music.jazz.milesdavis

Originator patterns are RFC 3341 §3 actors: `local@domain`, where local is a literal
(`fred`, `fred/appl=wb`), a subaddress wildcard (`fred/*`: every subaddress of fred, not fred
himself), `apex=*` (every APEX service) or `*` (anyone who is *not* an APEX service); domain is
an FQDN, `*.example.com` (example.com and every subdomain) or `*`. The bare pattern `*` means
everyone, services included. As in RFC 3341, `\\*` and `\\\\` stand for a literal `*` and `\\`
in an endpoint name. Local parts compare exactly, domains case-insensitively (RFC 3340 §2.2.1).

Tokens are the pubsub draft's (§5.1): `pubsub:createtopic`, `pubsub:deletetopic`,
`pubsub:listtopics`, `pubsub:subscribe`, `pubsub:cancel` and `core:data`, plus RFC 3341's
shorthands `pubsub:all` (the five pubsub operations) and `all:all` (all six).

The decision for (originator, token, topic) looks at every entry whose pattern matches the
originator, which names the token, and whose scope is every topic or covers `topic` (an entry
scoped to a topic never applies to a request without one, such as listtopics):

1. any such deny entry: denied;
2. else any such allow entry: allowed;
3. else denied.

This departs from RFC 3341 §3.1, which consults only the single most specific entry. The pubsub
draft's exception list (§7: "mr.slate@example.com is not allowed to publish to this topic")
must hold even when mr.slate also matches an allow that is just as specific -- notably the
grant the "only subscribers may publish" policy gives him when he subscribes -- so a deny
always wins, and nothing is allowed by default.

"Only subscribers may publish" (pubsub draft §7): the operator configures no general
`core:data` allow for the topic; the pubsub service calls `grant_subscriber(topic, endpoint)`
on every successful subscribe and `revoke_subscriber` on cancel and on expiry. A grant is an
allow of `core:data` scoped to the topic with the deterministic id
`subscriber:<topic>:<endpoint>`, so granting twice writes once and revoking removes it. Deny
entries still override grants: mr.slate stays out even while subscribed.

Entry ids carry their origin, and each origin manages only its own:

* `file:<id>` -- from the configuration file; `load_file` replaces all of them at once;
* `subscriber:<topic>:<endpoint>` -- the grants above;
* `cli:<id>` -- made with `apexps access allow|deny`.

Permission tokens (XEP-0040 §5.1; `broker/entitlements.py` has the semantics and the token
set grammar) are entries of kind `permtoken` beside these: grants and denies of in-band tokens
to subscribers, decided by `token_allowed` (a deny wins; nothing is granted by default). They
share the ids, the store, the following and the cache invalidation described below.

Configuration file (`load_file`), parsed with the hardened parser::

    <access domain='example.com'>
      <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
      <allow id='anyone-subscribes-jazz' originator='*@*' tokens='pubsub:subscribe'
             topic='music.jazz.milesdavis' />
      <deny id='slate' originator='mr.slate@example.com' tokens='core:data'
            topic='music.jazz.milesdavis' />
      <grant-token id='desks' subscriber='*@example.com' tokens='6000-6999, 7*' />
      <deny-token id='jade-6747' subscriber='jade@example.com' tokens='6747'
                  topic='equity.*' />
    </access>

`domain` is optional; when both it and the broker's domain are given they must agree, so a file
written for another domain is refused. For `allow` and `deny`, `id`, `originator` and `tokens`
(space-separated access tokens) are required; for `grant-token` and `deny-token`, `id`,
`subscriber` (an actor pattern) and `tokens` (a comma-separated token set) are. `topic` is
optional everywhere (a topic name or `prefix.*`). Ids are unique across all four elements. Any
other element or attribute is an error: a misspelt `topic` must not silently widen an entry to
every topic.

Durability and other processes: entries live in the compacted access topic through
`broker.registry.Registry`; `put`, `remove` and `load_file` return once Kafka has them. The CLI
writes to Kafka directly while a broker runs; `start_following()` runs a thread that calls
`refresh()` every `refresh_interval_s`, which picks those writes up. (A lazy refresh inside
`allowed` was the alternative: it would put a Kafka round trip -- a watermark request, ~0.3 ms
on one local Kafka when nothing changed, seconds while leadership moves -- on the publish path,
which runs on the event loop.)

Speed: decisions are cached per (originator, token, topic). The control watches the registry
(`Registry.watch`): each change, whoever made it, updates the compiled index for that one entry
and drops the cache. The index keeps literal originators (every subscriber grant) in a dict by
endpoint, so an uncached decision scans only the wildcard entries. A cached decision costs a
dict lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import structlog
from lxml import etree

from broker._access_rules import (
    MAX_FIELD_LENGTH,
    SHORTHANDS,
    SUBSCRIBER_PREFIX,
    TOKENS,
    AccessIndex,
    OriginatorPattern,
    Token,
    escape_endpoint,
    match_originator,
    parse_originator,
    subscriber_entry_id,
    validate_entry,
)
from broker.codec import Codec, default_codec
from broker.entitlements import EntitlementIndex, parse_token_set
from broker.kafka_io import KafkaConfig
from broker.kafka_producer import KafkaProducer
from broker.names import validate_topic
from broker.records import AccessEffect, AccessEntry, AccessKind, now_ms
from broker.registry import Registry
from common.errors import AccessDenied, ApexpsError, ConfigError, InvalidParameter
from common.xml_safe import UnsafeXml, parse_hardened

__all__ = [
    "CLI_PREFIX",
    "DEFAULT_CACHE_SIZE",
    "DEFAULT_REFRESH_INTERVAL_S",
    "FILE_PREFIX",
    "MAX_CONFIG_BYTES",
    "MAX_FIELD_LENGTH",
    "SHORTHANDS",
    "SUBSCRIBER_PREFIX",
    "TOKENS",
    "AccessControl",
    "AccessIndex",
    "AccessStore",
    "OriginatorPattern",
    "Token",
    "access_registry",
    "escape_endpoint",
    "match_originator",
    "parse_config",
    "parse_originator",
    "subscriber_entry_id",
    "validate_entry",
]

log = structlog.get_logger(__name__)

#: How often `start_following` looks for entries other processes wrote.
DEFAULT_REFRESH_INTERVAL_S = 1.0
#: Cached decisions kept before the cache starts over; bounds memory when originators churn.
DEFAULT_CACHE_SIZE = 65_536
#: A configuration file larger than this is refused before parsing (tens of thousands of entries).
MAX_CONFIG_BYTES = 16 * 1024 * 1024

FILE_PREFIX = "file:"
#: Entries made on the command line (`apexps access allow|deny`).
CLI_PREFIX = "cli:"


def access_registry(config: KafkaConfig, producer: KafkaProducer,
                    codec: Codec | None = None) -> Registry[AccessEntry]:
    """The access registry as BrokerCore opens it, for processes that need only this one
    (the CLI); not yet loaded."""
    return Registry(config, producer, codec or default_codec(), role="access",
                    schema="access_entry", from_avro=AccessEntry.from_avro)


# --- the control --------------------------------------------------------------------------


class AccessStore(Protocol):
    """What AccessControl needs of `broker.registry.Registry[AccessEntry]`."""

    def watch(self, watcher: Callable[[str, AccessEntry | None], None]) -> None: ...

    def put(self, item: AccessEntry) -> AccessEntry: ...

    def delete(self, key: str) -> bool: ...

    def get(self, key: str) -> AccessEntry | None: ...

    def refresh(self) -> int: ...

    def __iter__(self) -> Iterator[AccessEntry]: ...


_CacheKey = tuple[str, str, str | None]


class AccessControl:
    """Access decisions over the durable access entries (see the module docstring).

    Args:
        registry: the access registry (`BrokerCore.access`), loaded or not: the control
            watches it and follows every change, whoever makes it.
        refresh_interval_s: how often `start_following` calls `refresh`.
        cache_size: cached decisions kept before the cache starts over.
    """

    def __init__(self, registry: AccessStore, *,
                 refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S,
                 cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._registry = registry
        self.refresh_interval_s = refresh_interval_s
        self._cache_size = cache_size
        self._index = AccessIndex()
        self._cache: dict[_CacheKey, bool] = {}
        self._tokens = EntitlementIndex()
        self._token_cache: dict[_CacheKey, bool] = {}
        # load_file reads, diffs and writes the registry; two at once would interleave.
        self._load_lock = threading.Lock()
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        registry.watch(self._on_change)

    def _on_change(self, entry_id: str, entry: AccessEntry | None) -> None:
        # Runs under the registry's lock, so changes arrive one at a time and in Kafka order.
        # The index changes first and the cache is swapped after: a decision that raced the
        # change lands in the discarded cache, never in the fresh one.
        self._index.replace(entry_id, entry)
        self._tokens.replace(entry_id, entry)
        self._cache = {}
        self._token_cache = {}

    # decisions

    def allowed(self, originator: str, token: str, topic: str | None = None) -> bool:
        """May `originator` use `token` (on `topic`, if the operation has one)?

        Raises InvalidParameter for a token that is not one of `TOKENS`."""
        cache = self._cache
        key = (originator, token, topic)
        hit = cache.get(key)
        if hit is None:
            hit = self._index.allowed(originator, token, topic)
            if len(cache) >= self._cache_size:
                cache.clear()
            cache[key] = hit
        return hit

    def check(self, originator: str, token: str, topic: str | None = None) -> None:
        """Return if allowed, else raise AccessDenied (537) naming originator and token."""
        if not self.allowed(originator, token, topic):
            where = f" on topic {topic!r}" if topic is not None else ""
            raise AccessDenied(f"{originator} is not authorized for {token}{where}")

    def explain(self, originator: str, token: str,
                topic: str | None = None) -> AccessEntry | None:
        """The entry that decides (a deny, else an allow), or None when nothing applies."""
        rule = self._index.decide(originator, token, topic)
        return None if rule is None else rule.entry

    def token_allowed(self, subscriber: str, token: str, topic: str | None = None) -> bool:
        """May `subscriber` receive a message carrying the permission token `token` (on
        `topic`)? A grant must cover it and no deny may (broker/entitlements.py)."""
        cache = self._token_cache
        key = (subscriber, token, topic)
        hit = cache.get(key)
        if hit is None:
            hit = self._tokens.allowed(subscriber, token, topic)
            if len(cache) >= self._cache_size:
                cache.clear()
            cache[key] = hit
        return hit

    def explain_token(self, subscriber: str, token: str,
                      topic: str | None = None) -> AccessEntry | None:
        """The permission-token entry that decides (a deny, else a grant), or None."""
        return self._tokens.decide(subscriber, token, topic)

    # entries

    def entries(self) -> list[AccessEntry]:
        """Every entry, by id."""
        return sorted(self._registry, key=lambda e: e.entry_id)

    def put(self, entry: AccessEntry) -> AccessEntry:
        """Validate `entry` and store it (replacing one with the same id); returns once Kafka
        has it. Raises InvalidParameter (553) with nothing written if it does not validate."""
        return self._registry.put(validate_entry(entry))

    def remove(self, entry_id: str) -> bool:
        """Delete the entry; False if there was none."""
        return self._registry.delete(entry_id)

    def grant_subscriber(self, topic: str, subscriber: str) -> AccessEntry:
        """Let `subscriber` publish to `topic` ("only subscribers may publish"); idempotent."""
        validate_topic(topic)
        entry = AccessEntry(entry_id=subscriber_entry_id(topic, subscriber),
                            originator=escape_endpoint(subscriber), tokens=(Token.DATA.value,),
                            effect=AccessEffect.ALLOW, created_at=now_ms(), topic=topic)
        try:
            pattern = parse_originator(entry.originator)
        except InvalidParameter:
            pattern = None
        if pattern is None or not pattern.is_one_endpoint:
            raise InvalidParameter(f"subscriber {subscriber!r} is not an endpoint "
                                   "(LOCAL@DOMAIN)")
        old = self._registry.get(entry.entry_id)
        if old is not None and _same(old, entry):
            return old  # a racing grant may write it twice; that is harmless
        return self._registry.put(validate_entry(entry))

    def revoke_subscriber(self, topic: str, subscriber: str) -> bool:
        """Withdraw `grant_subscriber`; False if there was no grant."""
        return self.remove(subscriber_entry_id(topic, subscriber))

    def load_file(self, path: str | Path, *, domain: str | None = None) -> int:
        """Replace every `file:` entry with those of the configuration file at `path`; returns
        how many it holds. `subscriber:` and `cli:` entries are left alone.

        A file that cannot be read or parsed, or holds a bad entry, raises ConfigError (naming
        the line) and changes nothing. `domain`, if given, must equal the file's `domain`."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the access file: "
                              f"{exc.strerror or exc}") from None
        new = parse_config(data, name=str(path), domain=domain)
        with self._load_lock:
            old = {e.entry_id: e for e in self._registry if e.entry_id.startswith(FILE_PREFIX)}
            puts = [e for e in new if e.entry_id not in old or not _same(old[e.entry_id], e)]
            gone = [old[i] for i in old.keys() - {e.entry_id for e in new}]
            # Kafka has no multi-record atomicity here, so while these writes land (milliseconds)
            # requests are judged by a mix of both files. New and edited denies land first and
            # removed denies last, so the mix leans towards refusing. If Kafka fails midway,
            # loading the same file again converges.
            steps: list[tuple[int, AccessEntry, bool]] = [
                *((0 if e.effect is AccessEffect.DENY else 2, e, True) for e in puts),
                *((1 if e.effect is AccessEffect.ALLOW else 3, e, False) for e in gone),
            ]
            for _, entry, is_put in sorted(steps, key=lambda s: (s[0], s[1].entry_id)):
                if is_put:
                    self._registry.put(entry)
                else:
                    self._registry.delete(entry.entry_id)
        log.info("access file loaded", path=str(path), entries=len(new), written=len(puts),
                 removed=len(gone))
        return len(new)

    # other processes' writes

    def refresh(self) -> int:
        """Pick up entries other processes wrote; returns how many changed."""
        return self._registry.refresh()

    def start_following(self) -> None:
        """Refresh every `refresh_interval_s` on a daemon thread until `stop_following`."""
        if self._follower is not None:
            return
        self._stop.clear()
        self._follower = threading.Thread(target=self._follow, name="access-follow",
                                          daemon=True)
        self._follower.start()

    def stop_following(self) -> None:
        if self._follower is None:
            return
        self._stop.set()
        self._follower.join()
        self._follower = None

    def _follow(self) -> None:
        while not self._stop.wait(self.refresh_interval_s):
            try:
                changed = self.refresh()
            except ApexpsError as exc:
                # Kafka away: keep deciding on what we have and try again next interval.
                log.warning("access refresh failed", error=str(exc))
                continue
            except Exception:  # the follower must outlive any one bad refresh
                log.exception("access refresh failed")
                continue
            if changed:
                log.info("access entries changed elsewhere", changed=changed)


def _same(a: AccessEntry, b: AccessEntry) -> bool:
    """Equal but for created_at: rewriting an unchanged entry would only churn Kafka."""
    return replace(a, created_at=0) == replace(b, created_at=0)


# --- the configuration file ---------------------------------------------------------------

_ENTRY_ATTRS = frozenset({"id", "originator", "tokens", "topic"})
_TOKEN_ATTRS = frozenset({"id", "subscriber", "tokens", "topic"})
#: element -> (effect, kind, attribute naming who)
_ELEMENTS = {
    "allow": (AccessEffect.ALLOW, AccessKind.ACCESS, "originator"),
    "deny": (AccessEffect.DENY, AccessKind.ACCESS, "originator"),
    "grant-token": (AccessEffect.ALLOW, AccessKind.PERMTOKEN, "subscriber"),
    "deny-token": (AccessEffect.DENY, AccessKind.PERMTOKEN, "subscriber"),
}


def parse_config(data: bytes, *, name: str = "access file",
                 domain: str | None = None) -> list[AccessEntry]:
    """The validated entries of a configuration file, or ConfigError naming the line."""
    try:
        root = parse_hardened(data, max_bytes=MAX_CONFIG_BYTES, max_depth=2, what=name)
    except UnsafeXml as exc:
        raise ConfigError(f"{name}: {exc}") from None
    if root.tag != "access":
        raise ConfigError(f"{name} line {root.sourceline}: the document element must be "
                          f"<access>, not <{root.tag}>")
    _no_extras(root, {"domain"}, name)
    file_domain = root.get("domain")
    if file_domain is not None and domain is not None and file_domain.lower() != domain.lower():
        raise ConfigError(f"{name} line {root.sourceline}: the file is for domain "
                          f"{file_domain!r}, but this broker serves {domain!r}")
    entries: list[AccessEntry] = []
    seen: dict[str, object] = {}
    created = now_ms()
    for elem in root:
        entries.append(_config_entry(elem, name, created))
        eid = elem.get("id", "")
        if eid in seen:
            raise ConfigError(f"{name} line {elem.sourceline}: id {eid!r} is already used on "
                              f"line {seen[eid]}")
        seen[eid] = elem.sourceline
    return entries


def _config_entry(elem: etree._Element, name: str, created: int) -> AccessEntry:
    where = f"{name} line {elem.sourceline}"
    shape = _ELEMENTS.get(str(elem.tag))
    if shape is None:
        raise ConfigError(f"{where}: expected <allow> or <deny>, or <grant-token> or "
                          f"<deny-token> for permission tokens, found <{elem.tag}>")
    effect, kind, who = shape
    _no_extras(elem, _ENTRY_ATTRS if kind is AccessKind.ACCESS else _TOKEN_ATTRS, name)
    missing = [a for a in ("id", who, "tokens") if not elem.get(a)]
    if missing:
        raise ConfigError(f"{where}: <{elem.tag}> needs {' and '.join(missing)}")
    text = str(elem.get("tokens"))
    try:
        tokens = (tuple(text.split()) if kind is AccessKind.ACCESS
                  else parse_token_set(text).items)
        return validate_entry(AccessEntry(
            entry_id=FILE_PREFIX + str(elem.get("id")), originator=str(elem.get(who)),
            tokens=tokens, effect=effect, created_at=created, topic=elem.get("topic"),
            kind=kind))
    except InvalidParameter as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _no_extras(elem: etree._Element, allowed: frozenset[str] | set[str], name: str) -> None:
    extra = sorted(str(a) for a in elem.attrib if a not in allowed)
    if extra:
        raise ConfigError(f"{name} line {elem.sourceline}: <{elem.tag}> does not take "
                          f"{', '.join(extra)} (it takes {', '.join(sorted(allowed))})")
    if (elem.text or "").strip() or (elem.tail or "").strip():
        raise ConfigError(f"{name} line {elem.sourceline}: text is not allowed in <{elem.tag}>")
