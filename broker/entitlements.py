"""Permission tokens (XEP-0040 §5.1): which tokened messages each subscriber receives.

Theory of operation
-------------------
A publisher may send a permission token in-band with each message (the `apexps.publish`
option's `token`, robust-binding §2.3): an opaque name such as `6747` that stands for a class
of data, so the data can change class online without the permissioning tables changing. The
operator grants and denies tokens to subscribers:

    effect  subscriber           tokens                  topic
    grant   *@example.com        6000-6999,7*            (every topic)
    deny    jade@example.com     6747                    equity.*

A message with a token goes to a subscriber only if some grant covers (subscriber, token,
topic) and no deny does; a deny wins over any grant, however specific. A message without a
token is not filtered here at all. The decision is made per delivery, before the message takes
a link seq (adapters/pubsub/sequenced.py), so a subscriber's link never carries a seq for a
message it was not entitled to when it was sent; a gap fill asks again, and an item the
subscriber has lost the right to since is refilled as a `withheld` stamp with no content
(robust-binding §2.4).

Subscribers are RFC 3341 actor patterns, exactly as access entries' originators
(`broker.access`): `fred@example.com`, `fred/*@example.com`, `*@example.com`,
`*@*.example.com`, `apex=*@*` (services, e.g. redistributing pubsub servers), `*` (everyone).
The optional topic scope is an access entry's: one topic or a `prefix.*` family.

Token sets (`parse_token_set`), a comma list of items; spaces around the commas are allowed:

    token-set = item *( "," item )
    item      = "*"              ; every token
              / prefix "*"       ; every token starting with prefix (prefix itself included)
              / low "-" high     ; every token that is a decimal number in low..high, inclusive
              / token            ; exactly this token (case-sensitive)
    low, high = 1*DIGIT          ; ASCII digits; compared by value, so 0600-0699 covers 612
                                 ; and 0612 alike, and low must not exceed high

An item is at most 256 characters (the longest token) and contains no comma, whitespace or
control character; `*` only ends an item or stands alone; an item of digits and dashes that
is not `low-high` (`6000-`, `-5`, `1-2-3`) is refused rather than read as a literal token.
A token containing a comma or whitespace can therefore be named only by a wildcard. Bad sets
raise InvalidParameter (553) naming the item.

Storage: grants and denies are access entries (`broker.records.AccessEntry`) of kind
`permtoken` in the same compacted access topic, with the same ids and origins (`file:`, `cli:`,
`default:`), so `AccessControl` loads, follows and caches them with the access entries
(`AccessControl.token_allowed`). `EntitlementIndex` below is the pure decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from broker._access_rules import (
    OriginatorPattern,
    _validate_scope,
    in_scope,
    parse_originator,
)
from broker._token_sets import (
    MAX_ITEMS,
    MAX_SPEC_LENGTH,
    MAX_TOKEN_LENGTH,
    TokenSet,
    parse_token_items,
    parse_token_set,
)
from broker.records import AccessEffect, AccessEntry, AccessKind
from common.errors import InvalidParameter

__all__ = [
    "MAX_ITEMS",
    "MAX_SPEC_LENGTH",
    "MAX_TOKEN_LENGTH",
    "EntitlementIndex",
    "TokenSet",
    "parse_token_items",
    "parse_token_set",
]

log = structlog.get_logger("broker.access")


@dataclass(frozen=True, slots=True)
class _Rule:
    entry: AccessEntry
    pattern: OriginatorPattern
    tokens: TokenSet

    def covers(self, subscriber: str, token: str, topic: str | None) -> bool:
        return in_scope(self.entry.topic, topic) and self.tokens.matches(token) \
            and self.pattern.matches(subscriber)


class _Rules:
    """The rules of one effect: literal subscribers by endpoint, wildcards in a list.
    Copy-on-write, as `broker._access_rules._Table`: a reader never sees a list mutate."""

    __slots__ = ("exact", "wild")

    def __init__(self) -> None:
        self.exact: dict[str, list[_Rule]] = {}
        self.wild: list[_Rule] = []

    @staticmethod
    def _key(p: OriginatorPattern) -> str:
        return f"{p.local}@{p.domain}"

    def add(self, rule: _Rule) -> None:
        if rule.pattern.is_one_endpoint:
            key = self._key(rule.pattern)
            self.exact[key] = [*self.exact.get(key, ()), rule]
        else:
            self.wild = [*self.wild, rule]

    def remove(self, rule: _Rule) -> None:
        if rule.pattern.is_one_endpoint:
            key = self._key(rule.pattern)
            rest = [r for r in self.exact.get(key, ()) if r is not rule]
            if rest:
                self.exact[key] = rest
            else:
                self.exact.pop(key, None)
        else:
            self.wild = [r for r in self.wild if r is not rule]

    def first(self, subscriber: str, key: str, token: str, topic: str | None) -> _Rule | None:
        for rule in self.exact.get(key, ()):
            if rule.covers(subscriber, token, topic):
                return rule
        for rule in self.wild:
            if rule.covers(subscriber, token, topic):
                return rule
        return None


class EntitlementIndex:
    """The permission-token grants and denies among a set of access entries (entries of
    other kinds are ignored), compiled for `decide`.

    `replace(entry_id, entry)` follows a changing set one entry at a time, like
    `broker.access.AccessIndex`; an entry that does not compile (another version wrote it, or
    a hand) is skipped with an error logged, so it neither stops the broker nor grants
    anything. Not for concurrent writers; concurrent readers are fine.
    """

    def __init__(self, entries: Iterable[AccessEntry] = ()) -> None:
        self._deny = _Rules()
        self._grant = _Rules()
        self._rules: dict[str, _Rule] = {}
        for entry in entries:
            self.replace(entry.entry_id, entry)

    def __len__(self) -> int:
        return len(self._rules)

    def replace(self, entry_id: str, entry: AccessEntry | None) -> None:
        """Make `entry` (None, or an entry of another kind: nothing) the one under
        `entry_id`."""
        if entry is not None and entry.kind is not AccessKind.PERMTOKEN:
            entry = None
        old = self._rules.get(entry_id)
        if old is not None and old.entry == entry:
            return
        rule = None if entry is None else _compile(entry)
        # In before out, as in AccessIndex: an edited deny never lapses for an instant.
        if rule is not None:
            self._rules[entry_id] = rule
            self._table(rule, _Rules.add)
        if old is not None:
            self._table(old, _Rules.remove)
            if rule is None:
                del self._rules[entry_id]

    def _table(self, rule: _Rule, op: Callable[[_Rules, _Rule], None]) -> None:
        op(self._deny if rule.entry.effect is AccessEffect.DENY else self._grant, rule)

    def decide(self, subscriber: str, token: str, topic: str | None = None) -> AccessEntry | None:
        """The deny that withholds `token` from `subscriber`, else the grant that lets it
        through, else None (withheld: nothing is granted by default)."""
        local, _, domain = subscriber.rpartition("@")
        key = f"{local}@{domain.lower()}"
        rule = (self._deny.first(subscriber, key, token, topic)
                or self._grant.first(subscriber, key, token, topic))
        return None if rule is None else rule.entry

    def allowed(self, subscriber: str, token: str, topic: str | None = None) -> bool:
        """May `subscriber` receive a message carrying `token` (on `topic`)?"""
        entry = self.decide(subscriber, token, topic)
        return entry is not None and entry.effect is AccessEffect.ALLOW


def _compile(entry: AccessEntry) -> _Rule | None:
    try:
        pattern = parse_originator(entry.originator)
        if entry.topic is not None:
            _validate_scope(entry.topic)
        tokens = parse_token_items(entry.tokens)
    except InvalidParameter as exc:
        log.error("permission token entry ignored", entry_id=entry.entry_id, reason=str(exc))
        return None
    return _Rule(entry, pattern, tokens)
