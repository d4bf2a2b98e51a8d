"""Access decisions without Kafka: RFC 3341 actor wildcards, tokens, deny-overrides-allow, and
the cache of AccessControl kept in step with its entries."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.access import (
    SHORTHANDS,
    TOKENS,
    AccessControl,
    AccessIndex,
    Token,
    escape_endpoint,
    match_originator,
    parse_originator,
    subscriber_entry_id,
    validate_entry,
)
from broker.records import AccessEffect, AccessEntry
from common.errors import AccessDenied, InvalidParameter

ALLOW, DENY = AccessEffect.ALLOW, AccessEffect.DENY
JAZZ = "music.jazz.milesdavis"


def entry(eid: str, originator: str, tokens: str, effect: AccessEffect = ALLOW,
          topic: str | None = None) -> AccessEntry:
    return AccessEntry(entry_id=eid, originator=originator, tokens=tuple(tokens.split()),
                       effect=effect, created_at=0, topic=topic)


class FakeStore:
    """The registry's in-memory view and its watchers, without Kafka."""

    def __init__(self) -> None:
        self.items: dict[str, AccessEntry] = {}
        self.watchers: list[Callable[[str, AccessEntry | None], None]] = []
        self.writes = 0

    def watch(self, watcher: Callable[[str, AccessEntry | None], None]) -> None:
        for key, item in self.items.items():
            watcher(key, item)
        self.watchers.append(watcher)

    def put(self, item: AccessEntry) -> AccessEntry:
        self.items[item.key] = item
        self.writes += 1
        for w in self.watchers:
            w(item.key, item)
        return item

    def delete(self, key: str) -> bool:
        if self.items.pop(key, None) is None:
            return False
        self.writes += 1
        for w in self.watchers:
            w(key, None)
        return True

    def get(self, key: str) -> AccessEntry | None:
        return self.items.get(key)

    def refresh(self) -> int:
        return 0

    def __iter__(self) -> Iterator[AccessEntry]:
        return iter(list(self.items.values()))


# --- RFC 3341 §3 actor syntax --------------------------------------------------------------


class TestMatchOriginator:
    @pytest.mark.parametrize(("pattern", "endpoint", "expected"), [
        # literal local parts compare exactly, domains without regard to case (RFC 3340 §2.2.1)
        ("fred@example.com", "fred@example.com", True),
        ("fred@example.com", "fred@EXAMPLE.COM", True),
        ("fred@EXAMPLE.com", "fred@example.com", True),
        ("fred@example.com", "Fred@example.com", False),
        ("fred@example.com", "fred/appl=wb@example.com", False),
        ("barney/appl=wb@example.com", "barney/appl=wb@example.com", True),
        ("barney/appl=wb@example.com", "barney@example.com", False),
        # "fred/*": a subaddress wildcard; never fred himself (RFC 3341 §3.1 note)
        ("fred/*@example.com", "fred/appl=wb@example.com", True),
        ("fred/*@example.com", "fred@example.com", False),
        ("fred/*@example.com", "freddy/x@example.com", False),
        ("apex=pubsub/*@example.com", "apex=pubsub/music.jazz@example.com", True),
        ("apex=pubsub/*@example.com", "apex=pubsub@example.com", False),
        # "apex=*": every APEX service, subaddressed or not
        ("apex=*@*", "apex=pubsub@example.com", True),
        ("apex=*@*", "apex=pubsub/music.jazz.milesdavis@forwarder.com", True),
        ("apex=*@*", "fred@example.com", False),
        # a wildcard stands for one or more characters: "apex=" alone is no service's name,
        # and not a non-service either, so only "*" or the literal match it
        ("apex=*@*", "apex=@example.com", False),
        ("*@*", "apex=@example.com", False),
        # "*": any address other than an APEX service
        ("*@*", "fred@example.com", True),
        ("*@*", "fred/appl=wb@example.com", True),
        ("*@*", "apex=pubsub@example.com", False),
        ("*@*", "apex=pubsub/music.jazz.milesdavis@forwarder.com", False),
        ("*@example.com", "wilma@example.com", True),
        ("*@example.com", "wilma@foo.example.com", False),
        # "*.example.com" matches example.com and any subdomain (RFC 3341 §3's own list)
        ("*@*.example.com", "fred@example.com", True),
        ("*@*.example.com", "fred@foo.example.com", True),
        ("*@*.example.com", "fred@bar.foo.example.com", True),
        ("*@*.example.com", "fred@badexample.com", False),
        ("*@*.example.com", "fred@example.com.evil.org", False),
        ("*@*.foo.example.com", "fred@example.com", False),
        # the bare "*" is everyone, services included
        ("*", "fred@example.com", True),
        ("*", "apex=pubsub@example.com", True),
        # RFC 3341 §3: "\*" and "\\" in the actor stand for a literal "*" and "\"
        ("a\\\\b\\*c@example.com", "a\\b*c@example.com", True),
        ("a\\\\b\\*c@example.com", "a\\bxc@example.com", False),
        # address literals are domains too
        ("fred@[10.0.0.1]", "fred@[10.0.0.1]", True),
        # not an endpoint at all: nothing but "*" matches
        ("*@*", "fred", False),
        ("*@*", "@example.com", False),
    ])
    def test_rfc3341_wildcards(self, pattern: str, endpoint: str, expected: bool) -> None:
        """Each RFC 3341 actor form matches what the RFC says and nothing else."""
        assert match_originator(pattern, endpoint) is expected

    @pytest.mark.parametrize("pattern", [
        "", "fred", "@example.com", "fred@", "fr*ed@example.com", "*fred@example.com",
        "fred*@example.com", "apex=pub*@example.com", "fred/*/*@example.com", "*/x@example.com",
        "fred@*example.com", "fred@example.*", "fred@*.", "fred@ex ample.com", "fred@a..b",
        "a\\b@example.com", "fred\\@example.com", "fr\ned@example.com", "fred@exa@mple.com/",
        "**@*", "*@**", "x" * 2000 + "@example.com",
    ])
    def test_malformed_patterns_are_refused(self, pattern: str) -> None:
        """A pattern outside RFC 3341's forms raises InvalidParameter (553) saying so."""
        with pytest.raises(InvalidParameter) as info:
            parse_originator(pattern)
        assert int(info.value.code) == 553

    @pytest.mark.parametrize("endpoint", [
        "fred@example.com", "a*b@example.com", "a\\b@example.com", "fred/appl=wb@example.com",
        "apex=pubsub/music.jazz@example.com",
    ])
    def test_escaped_endpoint_is_a_literal(self, endpoint: str) -> None:
        """escape_endpoint makes the one-endpoint pattern even for names holding '*' or '\\'."""
        pattern = parse_originator(escape_endpoint(endpoint))
        assert pattern.is_one_endpoint and pattern.matches(endpoint)


# --- properties ----------------------------------------------------------------------------

def parse_attempt(pattern: str) -> bool:
    try:
        parse_originator(pattern)
    except InvalidParameter:
        return False
    return True


_word = st.text("abcxyz.-=", min_size=1, max_size=6).filter(lambda w: w[0] not in ".-")
_address = st.one_of(_word, _word.map(lambda w: "apex=" + w))
_local = st.one_of(_address, st.tuples(_address, _word).map("/".join))
_domain = st.sampled_from(["example.com", "foo.example.com", "bar.foo.example.com",
                           "EXAMPLE.com", "forwarder.com", "example.org"])
endpoints = st.tuples(_local, _domain).map("@".join).filter(
    lambda e: parse_attempt(escape_endpoint(e)))
patterns = st.one_of(
    st.just("*"),
    st.tuples(
        st.one_of(_local, st.just("*"), st.just("apex=*"), _address.map(lambda a: a + "/*")),
        st.one_of(_domain, st.just("*"), _domain.map(lambda d: "*." + d)),
    ).map("@".join),
).filter(parse_attempt)


def reference_match(pattern: str, endpoint: str) -> bool:
    """RFC 3341 §3.1 read literally: every '*' stands for one or more characters, "*" alone as
    the local part excludes APEX services, "*." before a domain may also stand for nothing."""
    if pattern == "*":
        return True
    local, _, domain = pattern.rpartition("@")
    e_local, _, e_domain = endpoint.rpartition("@")
    if domain == "*":
        dom_ok = bool(e_domain)
    elif domain.startswith("*."):
        dom_ok = re.fullmatch(r"(?:.+\.)?" + re.escape(domain[2:]), e_domain, re.I) is not None
    else:
        dom_ok = e_domain.lower() == domain.lower()
    if local == "*":
        loc_ok = bool(e_local) and not e_local.startswith("apex=")
    else:
        loc_ok = re.fullmatch(re.escape(local).replace(r"\*", ".+"), e_local) is not None
    return dom_ok and loc_ok


@given(endpoints)
def test_an_endpoints_own_pattern_matches_it(endpoint: str) -> None:
    """The literal pattern of an endpoint always matches that endpoint."""
    assert match_originator(escape_endpoint(endpoint), endpoint)


@given(endpoints, _domain)
def test_star_local_never_matches_services(endpoint: str, domain: str) -> None:
    """'*@…' never matches an APEX service and 'apex=*@…' matches only services."""
    is_service = endpoint.startswith("apex=")
    if match_originator("*@*", endpoint):
        assert not is_service
    assert match_originator("apex=*@*", endpoint) is is_service
    assert match_originator("*", endpoint)


@given(patterns, endpoints)
def test_matching_agrees_with_the_rfc_read_literally(pattern: str, endpoint: str) -> None:
    """match_originator agrees with a regex reading of RFC 3341 §3.1's wildcard rule."""
    assert match_originator(pattern, endpoint) is reference_match(pattern, endpoint)


@given(st.text(max_size=40))
def test_any_text_parses_or_is_refused_cleanly(text: str) -> None:
    """Any pattern text either compiles or raises InvalidParameter, never anything else."""
    with contextlib.suppress(InvalidParameter):
        parse_originator(text)


# --- tokens and entries ------------------------------------------------------------------


class TestEntries:
    def test_unknown_token_is_refused(self) -> None:
        """A token outside the six and their shorthands is refused with the known list."""
        with pytest.raises(InvalidParameter, match="pubsub:subscribe"):
            validate_entry(entry("e", "*@*", "pubsub:publish"))

    def test_no_tokens_is_refused(self) -> None:
        """An entry that names no token at all is refused."""
        with pytest.raises(InvalidParameter, match="no tokens"):
            validate_entry(entry("e", "*@*", ""))

    @pytest.mark.parametrize("topic", ["*", "music/jazz", "music.", ".*", "WKT=Other", "a b"])
    def test_bad_topic_scope_is_refused(self, topic: str) -> None:
        """A scope that is neither a topic name nor NAME.* is refused."""
        with pytest.raises(InvalidParameter):
            validate_entry(entry("e", "*@*", "core:data", topic=topic))

    def test_duplicate_tokens_collapse(self) -> None:
        """Repeated tokens are kept once, in order."""
        e = validate_entry(entry("e", "*@*", "core:data pubsub:all core:data"))
        assert e.tokens == ("core:data", "pubsub:all")

    def test_shorthands_expand(self) -> None:
        """pubsub:all covers the five pubsub operations but not core:data; all:all covers all."""
        index = AccessIndex([entry("p", "*@*", "pubsub:all"), entry("a", "apex=*@*", "all:all")])
        for token in TOKENS:
            assert index.allowed("fred@example.com", token) is (token != Token.DATA)
            assert index.allowed("apex=pubsub@example.com", token)
        assert SHORTHANDS["all:all"] == TOKENS

    def test_checking_an_unknown_token_raises(self) -> None:
        """Asking about a token that is not one of the six is a caller bug: 553, not False."""
        with pytest.raises(InvalidParameter):
            AccessIndex([]).allowed("fred@example.com", "pubsub:all")


class TestDecisions:
    def test_nothing_is_allowed_by_default(self) -> None:
        """With no entries every request is denied."""
        assert not AccessIndex([]).allowed("fred@example.com", Token.DATA, JAZZ)

    def test_mr_slate_example(self) -> None:
        """The pubsub draft §7 policies: anyone publishes to milesdavis except mr.slate, anyone
        subscribes, the forwarder's pubsub service subscribes, locals create and delete."""
        index = AccessIndex([
            entry("create", "*@example.com", "pubsub:createtopic pubsub:deletetopic"),
            entry("sub", "*@*", "pubsub:subscribe", topic=JAZZ),
            entry("fwd", "apex=pubsub/music.jazz.milesdavis@forwarder.com", "pubsub:subscribe",
                  topic=JAZZ),
            entry("pub", "*@*", "core:data", topic=JAZZ),
            entry("slate", "mr.slate@example.com", "core:data", DENY, topic=JAZZ),
        ])
        assert index.allowed("fred@example.com", Token.DATA, JAZZ)
        assert index.allowed("barney@rubble.com", Token.DATA, JAZZ)
        assert not index.allowed("mr.slate@example.com", Token.DATA, JAZZ)
        assert index.allowed("mr.slate@example.com", Token.SUBSCRIBE, JAZZ)
        assert not index.allowed("fred@example.com", Token.DATA, "music.rock")
        # *@* leaves services out, so the forwarder needs (and has) its own entry
        assert index.allowed("apex=pubsub/music.jazz.milesdavis@forwarder.com",
                             Token.SUBSCRIBE, JAZZ)
        assert not index.allowed("apex=pubsub/music.rock@forwarder.com", Token.SUBSCRIBE, JAZZ)
        assert index.allowed("wilma@example.com", Token.CREATE_TOPIC)
        assert not index.allowed("barney@rubble.com", Token.CREATE_TOPIC)

    def test_topic_scope_and_prefix(self) -> None:
        """A scoped entry covers its topic (or NAME.* family) only, never a topic-less request."""
        index = AccessIndex([entry("jazz", "*@*", "core:data pubsub:listtopics",
                                   topic="music.*")])
        assert index.allowed("fred@example.com", Token.DATA, JAZZ)
        assert index.allowed("fred@example.com", Token.DATA, "music.rock")
        assert not index.allowed("fred@example.com", Token.DATA, "music")
        assert not index.allowed("fred@example.com", Token.DATA, "musical.x")
        assert not index.allowed("fred@example.com", Token.LIST_TOPICS)

    def test_invalid_stored_entries_are_skipped(self) -> None:
        """An entry that no longer validates (another version wrote it) grants nothing and
        does not stop the index from being built."""
        index = AccessIndex([entry("bad", "fr*ed@example.com", "core:data"),
                             entry("odd", "*@*", "core:data future:token")])
        assert index.allowed("joe@example.com", Token.DATA, JAZZ)
        assert not index.allowed("apex=x@example.com", Token.DATA, JAZZ)


_entry_strategy = st.builds(
    entry,
    eid=st.text("abcd", min_size=1, max_size=3),
    originator=patterns,
    tokens=st.lists(st.sampled_from([*TOKENS, *SHORTHANDS]), min_size=1, max_size=3)
    .map(" ".join),
    effect=st.sampled_from(AccessEffect),
    topic=st.sampled_from([None, JAZZ, "music.*", "music.rock"]),
)
_request = st.tuples(endpoints, st.sampled_from(sorted(TOKENS)),
                     st.sampled_from([None, JAZZ, "music.rock", "equity.quote"]))


def _applies(e: AccessEntry, originator: str, token: str, topic: str | None) -> bool:
    tokens: set[str] = set()
    for t in e.tokens:
        tokens |= SHORTHANDS.get(t, {t})
    if token not in tokens or not match_originator(e.originator, originator):
        return False
    if e.topic is None:
        return True
    if topic is None:
        return False
    if e.topic.endswith(".*"):
        return topic.startswith(e.topic[:-1])
    return e.topic == topic


@settings(max_examples=300)
@given(st.lists(_entry_strategy, max_size=8, unique_by=lambda e: e.entry_id), _request)
def test_deny_overrides_allow(entries: list[AccessEntry],
                              request: tuple[str, str, str | None]) -> None:
    """Allowed exactly when some applicable entry allows and none denies, whatever the mix."""
    originator, token, topic = request
    applicable = [e for e in entries if _applies(e, originator, token, topic)]
    expected = any(e.effect is ALLOW for e in applicable) and not any(
        e.effect is DENY for e in applicable)
    assert AccessIndex(entries).allowed(originator, token, topic) is expected


@given(st.lists(_entry_strategy, max_size=6, unique_by=lambda e: e.entry_id), _request)
def test_a_matching_deny_always_wins(entries: list[AccessEntry],
                                     request: tuple[str, str, str | None]) -> None:
    """Adding a deny for exactly this originator and token denies it, whatever else exists."""
    originator, token, topic = request
    deny = entry("zz-deny", escape_endpoint(originator), token, DENY, topic=None)
    assert not AccessIndex([*entries, deny]).allowed(originator, token, topic)


# --- AccessControl over a store -----------------------------------------------------------


class TestAccessControl:
    def test_check_raises_537_naming_originator_and_token(self) -> None:
        """check() answers AccessDenied (537) with the originator, token and topic named."""
        control = AccessControl(FakeStore())
        with pytest.raises(AccessDenied) as info:
            control.check("mr.slate@example.com", Token.DATA, JAZZ)
        assert int(info.value.code) == 537
        assert "mr.slate@example.com" in str(info.value) and "core:data" in str(info.value)
        assert JAZZ in str(info.value)

    def test_put_refuses_invalid_entries_and_writes_nothing(self) -> None:
        """An invalid entry raises 553 and the store sees no write."""
        store = FakeStore()
        control = AccessControl(store)
        with pytest.raises(InvalidParameter):
            control.put(entry("cli:x", "fr*ed@example.com", "core:data"))
        assert store.writes == 0 and control.entries() == []

    def test_subscriber_grants_are_idempotent_and_deny_still_wins(self) -> None:
        """Granting twice writes once; the grant lets a subscriber publish to that topic only;
        a deny keeps mr.slate out while subscribed; revoking removes the grant."""
        store = FakeStore()
        control = AccessControl(store)
        control.put(entry("file:slate", "mr.slate@example.com", "core:data", DENY, JAZZ))
        for who in ("barney@rubble.com", "mr.slate@example.com"):
            control.grant_subscriber(JAZZ, who)
        writes = store.writes
        grant = control.grant_subscriber(JAZZ, "barney@rubble.com")
        assert store.writes == writes
        assert grant.entry_id == subscriber_entry_id(JAZZ, "barney@rubble.com") \
            == "subscriber:music.jazz.milesdavis:barney@rubble.com"
        assert control.allowed("barney@rubble.com", Token.DATA, JAZZ)
        assert not control.allowed("barney@rubble.com", Token.DATA, "music.rock")
        assert not control.allowed("mr.slate@example.com", Token.DATA, JAZZ)
        assert control.revoke_subscriber(JAZZ, "barney@rubble.com")
        assert not control.revoke_subscriber(JAZZ, "barney@rubble.com")
        assert not control.allowed("barney@rubble.com", Token.DATA, JAZZ)

    def test_subscriber_with_a_star_in_its_name_gets_only_itself(self) -> None:
        """A subscriber named with '*' is granted as a literal, never as a wildcard."""
        control = AccessControl(FakeStore())
        control.grant_subscriber(JAZZ, "*@example.com")
        assert control.allowed("*@example.com", Token.DATA, JAZZ)
        assert not control.allowed("fred@example.com", Token.DATA, JAZZ)

    def test_grant_and_revoke_agree_whatever_the_domains_case(self) -> None:
        """A grant made for barney@RUBBLE.com is revoked by barney@rubble.com."""
        control = AccessControl(FakeStore())
        control.grant_subscriber(JAZZ, "barney@RUBBLE.com")
        assert control.allowed("barney@rubble.com", Token.DATA, JAZZ)
        assert control.revoke_subscriber(JAZZ, "barney@rubble.com")
        assert control.entries() == []

    def test_grant_refuses_a_non_endpoint(self) -> None:
        """grant_subscriber refuses what is not an endpoint, writing nothing."""
        store = FakeStore()
        with pytest.raises(InvalidParameter):
            AccessControl(store).grant_subscriber(JAZZ, "barney")
        assert store.writes == 0

    def test_changes_by_anyone_invalidate_the_cache(self) -> None:
        """A cached answer is dropped when the store changes, even behind the control's back,
        and entries already in the store count from the start."""
        store = FakeStore()
        store.put(entry("cli:sub", "*@*", "pubsub:subscribe"))
        control = AccessControl(store)
        assert control.allowed("fred@example.com", Token.SUBSCRIBE, JAZZ)
        assert not control.allowed("fred@example.com", Token.DATA, JAZZ)
        store.put(entry("cli:pub", "*@*", "core:data"))
        assert control.allowed("fred@example.com", Token.DATA, JAZZ)
        store.put(entry("cli:deny", "fred@example.com", "all:all", DENY))
        assert not control.allowed("fred@example.com", Token.DATA, JAZZ)
        assert control.explain("fred@example.com", Token.DATA, JAZZ) == store.items["cli:deny"]

    def test_cache_is_bounded(self) -> None:
        """The cache starts over when full instead of growing without end."""
        control = AccessControl(FakeStore(), cache_size=4)
        for i in range(50):
            control.allowed(f"u{i}@example.com", Token.DATA)
        assert len(control._cache) <= 4


@settings(max_examples=100)
@given(st.lists(st.one_of(
    st.tuples(st.just("put"), _entry_strategy),
    st.tuples(st.just("remove"), st.text("abc", min_size=1, max_size=3)),
    st.tuples(st.just("ask"), _request),
), max_size=25))
def test_cached_answers_equal_fresh_ones(ops: list[tuple[str, object]]) -> None:
    """Through any sequence of puts, removes and questions, the cached answer equals that of
    an index built fresh from the current entries."""
    store = FakeStore()
    control = AccessControl(store)
    for op, arg in ops:
        if op == "put":
            assert isinstance(arg, AccessEntry)
            control.put(arg)
        elif op == "remove":
            assert isinstance(arg, str)
            control.remove(arg)
        else:
            assert isinstance(arg, tuple)
            originator, token, topic = arg
            fresh = AccessIndex(list(store)).allowed(originator, token, topic)
            assert control.allowed(originator, token, topic) is fresh
