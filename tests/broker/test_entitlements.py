"""Permission tokens without Kafka (broker/entitlements.py): the token-set grammar, strict
refusals, the grant/deny decision against a model, and AccessControl keeping both kinds of
entry apart and its token cache in step."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.access import AccessControl, AccessIndex, Token, match_originator, parse_config
from broker.codec import default_codec
from broker.entitlements import (
    MAX_ITEMS,
    EntitlementIndex,
    TokenSet,
    parse_token_items,
    parse_token_set,
)
from broker.records import AccessEffect, AccessEntry, AccessKind
from common.errors import ConfigError, InvalidParameter
from tests.broker.test_access_match import FakeStore

GRANT, DENY = AccessEffect.ALLOW, AccessEffect.DENY


def tokens(eid: str, subscriber: str, spec: str, effect: AccessEffect = GRANT,
           topic: str | None = None) -> AccessEntry:
    return AccessEntry(entry_id=eid, originator=subscriber, tokens=parse_token_set(spec).items,
                       effect=effect, created_at=0, topic=topic, kind=AccessKind.PERMTOKEN)


# --- the grammar ----------------------------------------------------------------------------


def test_every_kind_of_item() -> None:
    """Exact tokens, PREFIX*, LOW-HIGH and *, with spaces around commas; duplicates collapse
    and the items keep their order."""
    ts = parse_token_set("6747, 6000-6999 ,fx.*,6747")
    assert ts.items == ("6747", "6000-6999", "fx.*")
    assert str(ts) == "6747,6000-6999,fx.*"
    cases = {"6747": True, "6000": True, "6999": True, "7000": False, "5999": False,
             "fx.": True, "fx.eur": True, "fx": False, "FX.eur": False, "67470": False,
             "06500": True, "6500a": False, "": False}
    assert {t: ts.matches(t) for t in cases} == cases
    assert parse_token_set("*").matches("anything at all, even with spaces")
    assert parse_token_set("ab*").matches("ab") and parse_token_set("ab*").matches("abc")
    assert parse_token_set("2024-Q1").items == ("2024-Q1",)      # not a range: a token
    assert not parse_token_set("2024-Q1").matches("2024")


@pytest.mark.parametrize(("spec", "says"), [
    ("", "empty"),
    ("   ", "empty"),
    ("6747,", "empty item"),
    (",6747", "empty item"),
    ("6747,,6800", "empty item"),
    ("67 47", "whitespace"),
    ("6000 - 6999", "whitespace"),
    ("67\x0047", "control"),
    ("6*7", "'*' may only end"),
    ("*67", "'*' may only end"),
    ("**", "'*' may only end"),
    ("6999-6000", "backwards"),
    ("6000-", "not a range"),
    ("-6999", "not a range"),
    ("1-2-3", "not a range"),
    ("-", "not a range"),
    ("x" * 257, "longer than 256"),
])
def test_bad_sets_are_553_saying_why(spec: str, says: str) -> None:
    """Each malformed set is InvalidParameter (553) with a message naming the problem."""
    with pytest.raises(InvalidParameter) as info:
        parse_token_set(spec)
    assert int(info.value.code) == 553
    assert says in str(info.value)


def test_limits() -> None:
    """At most MAX_ITEMS items; a spec that long in characters is refused before splitting."""
    parse_token_set(",".join(str(i) for i in range(MAX_ITEMS)))
    with pytest.raises(InvalidParameter):
        parse_token_set(",".join(str(i) for i in range(MAX_ITEMS + 1)))
    with pytest.raises(InvalidParameter):
        parse_token_set("1," * 40_000)
    with pytest.raises(InvalidParameter):
        parse_token_items([])


_exact = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x17F,
                               blacklist_characters=",*\x7f"), min_size=1, max_size=8).filter(
    lambda t: not re.fullmatch(r"[0-9-]*-[0-9-]*", t) and not any(c.isspace() for c in t))
_range = st.tuples(st.integers(0, 300), st.integers(0, 300)).map(
    lambda r: f"{min(r)}-{max(r)}")
_items = st.one_of(_exact, _exact.map(lambda t: t + "*"), _range, st.just("*"))


@given(st.text(max_size=60))
def test_any_text_parses_or_is_refused_cleanly(text: str) -> None:
    """Whatever the text, the parser returns a TokenSet or raises InvalidParameter."""
    with contextlib.suppress(InvalidParameter):
        assert isinstance(parse_token_set(text), TokenSet)


@given(st.lists(_items, min_size=1, max_size=6))
def test_round_trip(items: list[str]) -> None:
    """A comma list of valid items parses to those items (once each, in order), and what it
    prints parses to the same set."""
    ts = parse_token_set(" , ".join(items))
    assert ts.items == tuple(dict.fromkeys(items))
    assert parse_token_set(str(ts)) == ts


def _model_matches(items: tuple[str, ...], token: str) -> bool:
    """The grammar read literally, ranges by enumeration (tokens without leading zeros)."""
    for item in items:
        if item == "*":
            return True
        if item.endswith("*"):
            if token[:len(item) - 1] == item[:-1]:
                return True
        elif re.fullmatch(r"[0-9]+-[0-9]+", item):
            lo, hi = map(int, item.split("-"))
            if token in {str(n) for n in range(lo, hi + 1)}:
                return True
        elif token == item:
            return True
    return False


_probe = st.one_of(_exact, st.integers(0, 400).map(str))


@given(st.lists(_items, min_size=1, max_size=5), _probe)
def test_matching_agrees_with_the_model(items: list[str], token: str) -> None:
    """matches() answers as the grammar read literally does."""
    ts = parse_token_set(",".join(items))
    assert ts.matches(token) is _model_matches(ts.items, token)


# --- the decision ---------------------------------------------------------------------------

_subjects = st.sampled_from(["*", "*@example.com", "jade@example.com", "fred@example.com",
                             "jade/*@example.com", "*@*.example.com", "apex=*@*"])
_subscribers = st.sampled_from(["jade@example.com", "fred@example.com", "jade/d1@example.com",
                                "wilma@eu.example.com", "apex=pubsub/q.a@other.org"])
_specs = st.sampled_from(["6747", "6000-6999", "67*", "*", "6747,7000-7999", "fx.*", "0-99"])
_topics = st.sampled_from([None, "equity.quote", "equity.*", "fx.eur"])
_entries = st.builds(
    tokens, eid=st.text("abcd", min_size=1, max_size=3), subscriber=_subjects, spec=_specs,
    effect=st.sampled_from(AccessEffect), topic=_topics)
_asks = st.tuples(_subscribers, st.sampled_from(["6747", "6748", "7500", "42", "fx.eur", "x"]),
                  st.sampled_from(["equity.quote", "equity.bond", "fx.eur", "rates"]))


def _applies(e: AccessEntry, subscriber: str, token: str, topic: str) -> bool:
    if not match_originator(e.originator, subscriber) or not _model_matches(e.tokens, token):
        return False
    if e.topic is None:
        return True
    if e.topic.endswith(".*"):
        return topic.startswith(e.topic[:-1])
    return e.topic == topic


@settings(max_examples=300)
@given(st.lists(_entries, max_size=8, unique_by=lambda e: e.entry_id), _asks)
def test_decision_agrees_with_the_model(entries: list[AccessEntry],
                                        ask: tuple[str, str, str]) -> None:
    """Delivered exactly when some applicable grant exists and no applicable deny does."""
    subscriber, token, topic = ask
    applicable = [e for e in entries if _applies(e, subscriber, token, topic)]
    expected = any(e.effect is GRANT for e in applicable) and not any(
        e.effect is DENY for e in applicable)
    assert EntitlementIndex(entries).allowed(subscriber, token, topic) is expected


@given(st.lists(_entries, max_size=6, unique_by=lambda e: e.entry_id), _asks)
def test_a_matching_deny_always_wins(entries: list[AccessEntry],
                                     ask: tuple[str, str, str]) -> None:
    """A deny of this token to this subscriber withholds it, whatever grants exist (even a
    grant of every token to everyone)."""
    subscriber, token, topic = ask
    index = EntitlementIndex([*entries, tokens("zz-all", "*", "*"),
                              tokens("zz-deny", subscriber, token, DENY)])
    assert not index.allowed(subscriber, token, topic)
    decided = index.decide(subscriber, token, topic)
    assert decided is not None and decided.effect is DENY


def test_nothing_is_granted_by_default_and_kinds_stay_apart() -> None:
    """No entry, no delivery; an access entry grants no token, and a permission-token entry
    whose items look like access tokens grants no access."""
    assert not EntitlementIndex().allowed("jade@example.com", "6747")
    allow_all = AccessEntry("cli:a", "*", ("all:all",), GRANT, 0)
    sneaky = AccessEntry("cli:t", "*", ("all:all", "core:data"), GRANT, 0,
                         kind=AccessKind.PERMTOKEN)
    assert not EntitlementIndex([allow_all]).allowed("jade@example.com", "all:all")
    assert EntitlementIndex([sneaky]).allowed("jade@example.com", "all:all")
    assert not AccessIndex([sneaky]).allowed("jade@example.com", Token.DATA, "q")
    assert AccessIndex([allow_all]).allowed("jade@example.com", Token.DATA, "q")


def test_an_entry_that_does_not_compile_grants_nothing() -> None:
    """A stored permtoken entry with a bad set (another version, a hand) is skipped."""
    bad = AccessEntry("cli:bad", "*", ("6000-",), GRANT, 0, kind=AccessKind.PERMTOKEN)
    index = EntitlementIndex([bad])
    assert len(index) == 0 and not index.allowed("jade@example.com", "6000")


def test_entries_written_before_kinds_existed_read_as_access_entries() -> None:
    """An access_entry v1 record (no kind) decodes as an ACCESS entry; v2 keeps the kind."""
    codec = default_codec()
    old = AccessEntry("cli:a", "*@example.com", ("core:data",), GRANT, 1_000, "q.a")
    v1 = {k: v for k, v in old.to_avro().items() if k != "kind"}
    assert AccessEntry.from_avro(codec.decode(codec.encode("access_entry", v1, version=1),
                                              expect="access_entry")[1]) == old
    new = tokens("cli:t", "*", "6747,67*", DENY)
    assert AccessEntry.from_avro(codec.decode(codec.encode("access_entry", new.to_avro()))[1]) \
        == new


# --- AccessControl ----------------------------------------------------------------------------


def test_put_refuses_a_bad_set_and_writes_nothing() -> None:
    """An invalid permission-token entry is 553 and reaches no store."""
    store = FakeStore()
    control = AccessControl(store)
    bad = AccessEntry("cli:x", "jade@example.com", ("6999-6000",), DENY, 0,
                      kind=AccessKind.PERMTOKEN)
    with pytest.raises(InvalidParameter):
        control.put(bad)
    assert store.writes == 0


def test_changes_reach_the_token_cache() -> None:
    """A cached answer is dropped on any change, including one made behind the control's
    back, and explain_token names the deciding entry."""
    store = FakeStore()
    store.put(tokens("default:t", "*@example.com", "*"))
    control = AccessControl(store)
    assert control.token_allowed("jade@example.com", "6747", "equity.quote")
    store.put(tokens("cli:j", "jade@example.com", "6747", DENY, "equity.*"))
    assert not control.token_allowed("jade@example.com", "6747", "equity.quote")
    assert control.token_allowed("jade@example.com", "6747", "fx.eur")
    assert control.explain_token("jade@example.com", "6747", "equity.quote") \
        == store.items["cli:j"]
    control.remove("cli:j")
    assert control.token_allowed("jade@example.com", "6747", "equity.quote")


@settings(max_examples=100)
@given(st.lists(st.one_of(
    st.tuples(st.just("put"), _entries),
    st.tuples(st.just("remove"), st.text("abc", min_size=1, max_size=3)),
    st.tuples(st.just("ask"), _asks),
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
            fresh = EntitlementIndex(list(store)).allowed(*arg)
            assert control.token_allowed(*arg) is fresh


# --- the access file --------------------------------------------------------------------------


def test_the_file_takes_grant_and_deny_token_elements() -> None:
    """<grant-token>/<deny-token> become permtoken entries with file: ids; ids are unique
    across all four elements."""
    text = b"""<access>
      <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
      <grant-token id='desks' subscriber='*@example.com' tokens='6000-6999, 7*' />
      <deny-token id='jade' subscriber='jade@example.com' tokens='6747' topic='equity.*' />
    </access>"""
    entries = parse_config(text)
    assert [(e.entry_id, e.kind, e.effect, e.originator, e.tokens, e.topic)
            for e in entries] == [
        ("file:locals", AccessKind.ACCESS, GRANT, "*@example.com", ("pubsub:all", "core:data"),
         None),
        ("file:desks", AccessKind.PERMTOKEN, GRANT, "*@example.com", ("6000-6999", "7*"), None),
        ("file:jade", AccessKind.PERMTOKEN, DENY, "jade@example.com", ("6747",), "equity.*"),
    ]


@pytest.mark.parametrize(("text", "says"), [
    (b"<access>\n<grant-token id='a' subscriber='*@*' tokens='6000-'/></access>", "not a range"),
    (b"<access>\n<grant-token id='a' originator='*@*' tokens='1'/></access>", "originator"),
    (b"<access>\n<deny-token id='a' tokens='1'/></access>", "needs subscriber"),
    (b"<access>\n<deny-token id='a' subscriber='j*de@x.com' tokens='1'/></access>", "j*de"),
    (b"<access>\n<grant-token id='a' subscriber='*@*' tokens='1' topic='a/b'/></access>",
     "topic"),
    (b"<access>\n<allow id='a' originator='*@*' tokens='core:data'/>\n"
     b"<grant-token id='a' subscriber='*@*' tokens='1'/></access>", "already used"),
])
def test_token_mistakes_in_the_file_name_the_line(text: bytes, says: str) -> None:
    """A bad token element is a ConfigError naming line 2 (or 3) and the problem."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, name="acl.xml")
    assert re.search(r"acl\.xml line [23]:", str(info.value)) and says in str(info.value)
