"""The pure half of access control: tokens, RFC 3341 originator patterns, entry validation
and the decision over a set of entries. No I/O, no cache; `broker.access` builds on it and
re-exports every public name (read its docstring for the semantics)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from functools import lru_cache

import structlog

from broker._token_sets import parse_token_items
from broker.names import validate_topic
from broker.records import AccessEffect, AccessEntry, AccessKind
from common.errors import InvalidParameter

__all__ = [
    "MAX_FIELD_LENGTH",
    "SHORTHANDS",
    "SUBSCRIBER_PREFIX",
    "TOKENS",
    "AccessIndex",
    "OriginatorPattern",
    "Token",
    "escape_endpoint",
    "match_originator",
    "parse_originator",
    "subscriber_entry_id",
    "validate_entry",
]

log = structlog.get_logger("broker.access")

#: Entry ids, patterns and scopes longer than this are refused: they travel as Kafka keys and
#: in log lines, and RFC 3340 endpoints are far shorter.
MAX_FIELD_LENGTH = 1024


class Token(StrEnum):
    """The access tokens the pubsub draft defines (§5.1)."""

    #: create a topic (owner `apex=pubsub@domain`)
    CREATE_TOPIC = "pubsub:createtopic"
    #: delete a topic
    DELETE_TOPIC = "pubsub:deletetopic"
    #: list the topics
    LIST_TOPICS = "pubsub:listtopics"
    #: subscribe to a topic (owner `apex=pubsub/TOPIC@domain`)
    SUBSCRIBE = "pubsub:subscribe"
    #: cancel a subscription to a topic
    CANCEL = "pubsub:cancel"
    #: send data to `apex=pubsub/TOPIC@domain`, i.e. publish
    DATA = "core:data"


#: The concrete tokens a decision is asked for.
TOKENS: frozenset[str] = frozenset(Token)
#: RFC 3341 §3's `service:all` forms, expanded when the index is built.
SHORTHANDS: dict[str, frozenset[str]] = {
    "pubsub:all": frozenset(t for t in Token if t is not Token.DATA),
    "all:all": TOKENS,
}

SUBSCRIBER_PREFIX = "subscriber:"
_SERVICE = "apex="

# RFC 3340 §2.2 pieces (adapters/apex/endpoint.py has the same; broker/ cannot import it).
_TOKEN = re.compile(r"[^\x00-\x1f\x7f/@]+")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_FQDN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_LITERAL = re.compile(r"\[[\x21-\x5a\x5e-\x7e]+\]")
_ESCAPE = re.compile(r"\\(.)|\\$|\*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# --- originator patterns ------------------------------------------------------------------


class _Local(Enum):
    LITERAL = "literal"
    SUBADDRESSES = "subaddresses"  # fred/*
    SERVICES = "services"  # apex=*
    NON_SERVICES = "non-services"  # *
    EVERYONE = "everyone"  # the bare pattern *


class _Domain(Enum):
    EXACT = "exact"
    SUFFIX = "suffix"  # *.example.com
    ANY = "any"  # *


@dataclass(frozen=True, slots=True)
class OriginatorPattern:
    """A compiled RFC 3341 actor; build it with `parse_originator`."""

    text: str
    local_kind: _Local
    #: the literal local part, or the base of a subaddress wildcard (escapes resolved)
    local: str
    domain_kind: _Domain
    #: lower-cased; for SUFFIX without the leading `*.`
    domain: str

    @property
    def is_one_endpoint(self) -> bool:
        """True for a literal pattern, which matches exactly one endpoint."""
        return self.local_kind is _Local.LITERAL and self.domain_kind is _Domain.EXACT

    def matches(self, endpoint: str) -> bool:
        """Does `endpoint` (`local@domain`, as the relay saw it) match this pattern?"""
        kind = self.local_kind
        if kind is _Local.EVERYONE:
            return True
        local, at, domain = endpoint.rpartition("@")
        if not at or not local:
            return False
        if self.domain_kind is not _Domain.ANY:
            domain = domain.lower()
            if domain != self.domain and not (
                self.domain_kind is _Domain.SUFFIX and domain.endswith("." + self.domain)
            ):
                return False
        if kind is _Local.LITERAL:
            return local == self.local
        if kind is _Local.NON_SERVICES:
            return not local.startswith(_SERVICE)
        if kind is _Local.SERVICES:
            # Each wildcard stands for one or more characters (RFC 3341 §3.1).
            return len(local) > len(_SERVICE) and local.startswith(_SERVICE)
        base = self.local + "/"
        return len(local) > len(base) and local.startswith(base)


def _unescape_local(text: str, pattern: str) -> str:
    """Resolve RFC 3341's `\\*` and `\\\\`; any other backslash or a bare `*` is malformed."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) in ("*", "\\"):
            return m.group(1)
        raise InvalidParameter(
            f"originator {pattern!r}: '*' may only stand alone as a local part ('*', 'apex=*', "
            "'name/*'), and '\\' only escapes '*' or '\\' ('\\*' is a literal star)"
        )

    return _ESCAPE.sub(one, text)


@lru_cache(maxsize=4096)
def parse_originator(pattern: str) -> OriginatorPattern:
    """Compile an originator pattern, or raise InvalidParameter (553) saying what is wrong."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidParameter("the originator pattern is empty; use e.g. fred@example.com, "
                               "*@example.com, apex=*@* or * (everyone)")
    if len(pattern) > MAX_FIELD_LENGTH:
        raise InvalidParameter(f"originator pattern longer than {MAX_FIELD_LENGTH} characters")
    if pattern == "*":
        return OriginatorPattern(pattern, _Local.EVERYONE, "", _Domain.ANY, "")
    local, at, domain = pattern.rpartition("@")
    if not at or not local or not domain:
        raise InvalidParameter(f"originator {pattern!r} is not LOCAL@DOMAIN (or * for everyone)")
    if domain == "*":
        domain_kind, dom = _Domain.ANY, ""
    elif domain.startswith("*."):
        domain_kind, dom = _Domain.SUFFIX, domain[2:]
    else:
        domain_kind, dom = _Domain.EXACT, domain
    if domain_kind is not _Domain.ANY and not (
        _FQDN.fullmatch(dom) or (domain_kind is _Domain.EXACT and _LITERAL.fullmatch(dom))
    ):
        raise InvalidParameter(f"originator {pattern!r}: {domain!r} is not a domain, "
                               "*.domain or *")
    if local == "*":
        local_kind, base = _Local.NON_SERVICES, ""
    elif local == _SERVICE + "*":
        local_kind, base = _Local.SERVICES, ""
    elif local.endswith("/*"):
        local_kind, base = _Local.SUBADDRESSES, _unescape_local(local[:-2], pattern)
        if not _TOKEN.fullmatch(base):
            raise InvalidParameter(f"originator {pattern!r}: {local[:-2]!r} is not an "
                                   "endpoint name")
    else:
        local_kind, base = _Local.LITERAL, _unescape_local(local, pattern)
        address, slash, sub = base.partition("/")
        if not _TOKEN.fullmatch(address) or (slash and not _TOKEN.fullmatch(sub)):
            raise InvalidParameter(f"originator {pattern!r}: {local!r} is not an endpoint "
                                   "name (NAME or NAME/SUBADDRESS, without '@' or controls)")
    return OriginatorPattern(pattern, local_kind, base, domain_kind, dom.lower())


def match_originator(pattern: str, endpoint: str) -> bool:
    """Does `endpoint` match the RFC 3341 actor `pattern`? A malformed pattern raises
    InvalidParameter; entries are validated when made, so this never happens for them."""
    return parse_originator(pattern).matches(endpoint)


def escape_endpoint(endpoint: str) -> str:
    """The literal pattern that matches exactly `endpoint` (RFC 3341 §3: `\\` and `*` escaped)."""
    local, _, domain = endpoint.rpartition("@")
    return local.replace("\\", "\\\\").replace("*", "\\*") + "@" + domain


# --- entries ------------------------------------------------------------------------------


def _validate_scope(topic: str) -> str:
    if topic == "*":
        raise InvalidParameter("topic '*': leave the topic out to cover every topic")
    if topic.endswith(".*"):
        validate_topic(topic[:-2], allow_well_known=False)
        return topic
    return validate_topic(topic)


def in_scope(scope: str | None, topic: str | None) -> bool:
    """Does an entry scoped to `scope` (None: every topic; `NAME.*`: that family) apply to
    an operation on `topic` (None: one that names no topic)?"""
    if scope is None:
        return True
    if topic is None:
        return False
    if scope.endswith(".*"):
        return topic.startswith(scope[:-1])
    return scope == topic


def validate_entry(entry: AccessEntry) -> AccessEntry:
    """Check every field of `entry` and return it with its tokens deduplicated (in order), or
    raise InvalidParameter (553) naming the field."""
    if not entry.entry_id or len(entry.entry_id) > MAX_FIELD_LENGTH \
            or _CONTROL.search(entry.entry_id):
        raise InvalidParameter(f"entry id {entry.entry_id!r} must be 1 to {MAX_FIELD_LENGTH} "
                               "characters without control characters")
    parse_originator(entry.originator)
    if entry.kind is AccessKind.PERMTOKEN:
        # permission tokens (broker/entitlements.py): a token set, not RFC 3341 tokens
        parse_token_items(entry.tokens)
    elif entry.kind is not AccessKind.ACCESS:
        raise InvalidParameter(f"entry {entry.entry_id!r}: kind must be access or permtoken")
    elif not entry.tokens:
        raise InvalidParameter(f"entry {entry.entry_id!r} names no tokens; give at least one "
                               f"of {', '.join(_known_tokens())}")
    else:
        for token in entry.tokens:
            if token not in TOKENS and token not in SHORTHANDS:
                raise InvalidParameter(f"unknown access token {token!r}; known tokens: "
                                       f"{', '.join(_known_tokens())}")
    if entry.topic is not None:
        _validate_scope(entry.topic)
    if entry.effect not in (AccessEffect.ALLOW, AccessEffect.DENY):
        raise InvalidParameter(f"entry {entry.entry_id!r}: effect must be allow or deny")
    tokens = tuple(dict.fromkeys(entry.tokens))
    return entry if tokens == entry.tokens else replace(entry, tokens=tokens)


def _known_tokens() -> list[str]:
    return [*Token, *SHORTHANDS]


def subscriber_entry_id(topic: str, subscriber: str) -> str:
    """The id of the "only subscribers may publish" grant for `subscriber` on `topic` (the
    domain lower-cased, so grant and revoke agree however the domain was spelt)."""
    local, at, domain = subscriber.rpartition("@")
    return f"{SUBSCRIBER_PREFIX}{topic}:{local}{at}{domain.lower()}"


# --- decisions ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Rule:
    entry: AccessEntry
    pattern: OriginatorPattern
    #: the entry's tokens with shorthands expanded and unknown ones dropped
    tokens: frozenset[str]

    def covers(self, originator: str, topic: str | None) -> bool:
        return in_scope(self.entry.topic, topic) and self.pattern.matches(originator)


class _Table:
    """The rules of one (token, effect): literal patterns by endpoint, wildcards in a list, so
    thousands of subscriber grants cost one dict lookup rather than a scan.

    Changes are copy-on-write: a list a reader is iterating on another thread is never mutated,
    only replaced, so a decision racing a change sees the rules before or after it."""

    __slots__ = ("exact", "wild")

    def __init__(self) -> None:
        self.exact: dict[str, list[_Rule]] = {}
        self.wild: list[_Rule] = []

    def add(self, rule: _Rule) -> None:
        p = rule.pattern
        if p.is_one_endpoint:
            key = f"{p.local}@{p.domain}"
            self.exact[key] = [*self.exact.get(key, ()), rule]
        else:
            self.wild = [*self.wild, rule]

    def remove(self, rule: _Rule) -> None:
        p = rule.pattern
        if p.is_one_endpoint:
            key = f"{p.local}@{p.domain}"
            rest = [r for r in self.exact.get(key, ()) if r is not rule]
            if rest:
                self.exact[key] = rest
            else:
                self.exact.pop(key, None)
        else:
            self.wild = [r for r in self.wild if r is not rule]

    def first(self, originator: str, key: str, topic: str | None) -> _Rule | None:
        for rule in self.exact.get(key, ()):
            if rule.covers(originator, topic):
                return rule
        for rule in self.wild:
            if rule.covers(originator, topic):
                return rule
        return None


class AccessIndex:
    """Entries compiled per token: the pure decision, without a cache or a store.

    `replace(entry_id, entry)` keeps it in step with a changing set of entries at the cost of
    that one entry (plus a copy of the wildcard list it sits in). Entries that do not validate
    (written by another version, or by hand) are skipped with an error logged, and unknown
    tokens in an otherwise good entry are ignored, so one bad record neither stops the broker
    nor grants anything.
    """

    def __init__(self, entries: Iterable[AccessEntry] = ()) -> None:
        self._deny = {t: _Table() for t in TOKENS}
        self._allow = {t: _Table() for t in TOKENS}
        self._rules: dict[str, _Rule] = {}
        for entry in entries:
            self.replace(entry.entry_id, entry)

    def __len__(self) -> int:
        return len(self._rules)

    def replace(self, entry_id: str, entry: AccessEntry | None) -> None:
        """Make `entry` (None: nothing) the entry under `entry_id`. Not for concurrent
        writers; concurrent readers are fine."""
        if entry is not None and entry.kind is not AccessKind.ACCESS:
            # A permission-token entry (broker/entitlements.py) decides nothing here: its
            # items are opaque names, and one spelt `all:all` must never grant access.
            entry = None
        old = self._rules.get(entry_id)
        if old is not None and old.entry == entry:
            return
        rule = None if entry is None else _compile(entry)
        # The new rule goes in before the old one leaves: a racing decision sees both, never
        # neither, so an edited deny does not lapse for an instant.
        if rule is not None:
            self._rules[entry_id] = rule
            self._tables(rule, lambda t, r: t.add(r))
        if old is not None:
            self._tables(old, lambda t, r: t.remove(r))
            if rule is None:
                del self._rules[entry_id]

    def _tables(self, rule: _Rule, op: Callable[[_Table, _Rule], None]) -> None:
        tables = self._deny if rule.entry.effect is AccessEffect.DENY else self._allow
        for token in rule.tokens:
            op(tables[token], rule)

    def decide(self, originator: str, token: str, topic: str | None = None) -> _Rule | None:
        """The deny that refuses, else the allow that permits, else None (denied by default).
        Raises InvalidParameter for a token that is not one of `TOKENS`."""
        if token not in TOKENS:
            raise InvalidParameter(f"cannot check unknown access token {token!r}; "
                                   f"known tokens: {', '.join(Token)}")
        local, _, domain = originator.rpartition("@")
        key = f"{local}@{domain.lower()}"
        return (self._deny[token].first(originator, key, topic)
                or self._allow[token].first(originator, key, topic))

    def allowed(self, originator: str, token: str, topic: str | None = None) -> bool:
        rule = self.decide(originator, token, topic)
        return rule is not None and rule.entry.effect is AccessEffect.ALLOW


def _compile(entry: AccessEntry) -> _Rule | None:
    try:
        pattern = parse_originator(entry.originator)
        if entry.topic is not None:
            _validate_scope(entry.topic)
    except InvalidParameter as exc:
        log.error("access entry ignored", entry_id=entry.entry_id, reason=str(exc))
        return None
    return _Rule(entry, pattern, frozenset(_expand(entry.tokens)))


def _expand(tokens: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for token in tokens:
        if token in TOKENS:
            out.add(token)
        elif token in SHORTHANDS:
            out |= SHORTHANDS[token]
    return out
