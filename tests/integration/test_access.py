"""Access control against the real Kafka: durable entries, other processes' writes picked up by
refresh, the configuration file's replace semantics, and the pubsub draft's mr.slate example."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.access import AccessControl, Token
from broker.core import BrokerCore
from broker.kafka_io import watermarks
from broker.records import AccessEffect, AccessEntry, now_ms
from common.errors import ConfigError

pytestmark = pytest.mark.kafka

JAZZ = "music.jazz.milesdavis"
GUIDE_FILE = """<access domain='example.com'>
  <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
  <allow id='anyone-subscribes-jazz' originator='*@*' tokens='pubsub:subscribe'
         topic='music.jazz.milesdavis' />
  <deny id='slate' originator='mr.slate@example.com' tokens='core:data'
        topic='music.jazz.milesdavis' />
</access>
"""


@pytest.fixture(name="other")
def _other(core: BrokerCore) -> Iterator[BrokerCore]:
    """A second BrokerCore on the same namespace: another process, as far as Kafka can tell."""
    other = BrokerCore(core.config)
    other.open()
    yield other
    other.close()


def cli_entry(eid: str, originator: str, tokens: str, effect: AccessEffect = AccessEffect.ALLOW,
              topic: str | None = None) -> AccessEntry:
    return AccessEntry(entry_id=eid, originator=originator, tokens=tuple(tokens.split()),
                       effect=effect, created_at=now_ms(), topic=topic)


def access_watermark(core: BrokerCore) -> int:
    return watermarks(core.config, core.access.topic, 0)[1]


def test_entries_survive_a_reopen(core: BrokerCore) -> None:
    """Entries and subscriber grants put through one BrokerCore decide the same way after a
    fresh BrokerCore rebuilds them from Kafka."""
    control = AccessControl(core.access)
    control.put(cli_entry("cli:pub", "*@example.com", "core:data", topic="music.*"))
    control.grant_subscriber(JAZZ, "barney@rubble.com")
    control.put(cli_entry("cli:x", "fred@example.com", "all:all"))
    assert control.remove("cli:x") and not control.remove("cli:x")
    before = control.entries()
    core.close()

    again = BrokerCore(core.config)
    report = again.open()
    try:
        control2 = AccessControl(again.access)
        assert report.access_entries == 2
        assert control2.entries() == before
        assert control2.allowed("wilma@example.com", Token.DATA, JAZZ)
        assert control2.allowed("barney@rubble.com", Token.DATA, JAZZ)
        assert not control2.allowed("barney@rubble.com", Token.DATA, "music.rock")
        assert not control2.allowed("fred@example.com", Token.CREATE_TOPIC)
    finally:
        again.close()


def test_refresh_sees_another_writers_entries(core: BrokerCore, other: BrokerCore) -> None:
    """What another process puts or removes shows after refresh(); a refresh with nothing new
    changes nothing."""
    control = AccessControl(core.access)
    writer = AccessControl(other.access)
    assert control.refresh() == 0
    writer.put(cli_entry("cli:pub", "*@*", "core:data"))
    assert not control.allowed("fred@example.com", Token.DATA, JAZZ)  # not seen yet
    assert control.refresh() == 1
    assert control.allowed("fred@example.com", Token.DATA, JAZZ)
    writer.put(cli_entry("cli:no-fred", "fred@example.com", "core:data", AccessEffect.DENY))
    writer.remove("cli:pub")
    assert control.refresh() == 2
    assert control.refresh() == 0
    assert [e.entry_id for e in control.entries()] == ["cli:no-fred"]
    assert not control.allowed("wilma@example.com", Token.DATA, JAZZ)


def test_refresh_never_reverts_a_newer_local_write(core: BrokerCore, other: BrokerCore) -> None:
    """Another process writes an entry, then this one overwrites it; reading the older record
    late does not undo the newer one (Kafka's order decides)."""
    other.access.put(cli_entry("cli:e", "*@*", "core:data", AccessEffect.ALLOW))
    mine = cli_entry("cli:e", "*@*", "core:data", AccessEffect.DENY)
    core.access.put(mine)
    assert core.access.refresh() == 0
    assert core.access.get("cli:e") == mine


def test_following_picks_up_a_cli_write(core: BrokerCore, other: BrokerCore) -> None:
    """start_following applies another process's write within a few refresh intervals."""
    control = AccessControl(core.access, refresh_interval_s=0.1)
    arrived = threading.Event()
    core.access.watch(lambda key, item: arrived.set() if key == "cli:late" else None)
    control.start_following()
    try:
        other.access.put(cli_entry("cli:late", "*@*", "pubsub:listtopics"))
        assert arrived.wait(30)
        assert control.allowed("fred@example.com", Token.LIST_TOPICS)
    finally:
        control.stop_following()


def test_load_file_replaces_only_file_entries(core: BrokerCore, tmp_path: Path) -> None:
    """Loading a second file removes file entries it lacks, rewrites changed ones, adds new
    ones, and leaves cli: entries and subscriber grants alone; loading it again writes
    nothing."""
    control = AccessControl(core.access)
    first = tmp_path / "first.xml"
    first.write_text("""<access>
      <allow id='a' originator='*@example.com' tokens='core:data' />
      <allow id='b' originator='*@*' tokens='pubsub:subscribe' />
      <deny id='c' originator='mr.slate@example.com' tokens='all:all' />
    </access>""")
    assert control.load_file(first) == 3
    control.put(cli_entry("cli:mine", "wilma@example.com", "pubsub:createtopic"))
    control.grant_subscriber(JAZZ, "barney@rubble.com")
    second = tmp_path / "second.xml"
    second.write_text("""<access domain='example.com'>
      <allow id='b' originator='*@*' tokens='pubsub:subscribe' topic='music.*' />
      <deny id='c' originator='mr.slate@example.com' tokens='all:all' />
      <allow id='d' originator='apex=*@*' tokens='core:data' />
    </access>""")
    assert control.load_file(second, domain="example.com") == 3
    ids = [e.entry_id for e in control.entries()]
    assert ids == ["cli:mine", "file:b", "file:c", "file:d",
                   "subscriber:music.jazz.milesdavis:barney@rubble.com"]
    assert core.access.get("file:b").topic == "music.*"  # type: ignore[union-attr]
    assert not control.allowed("wilma@example.com", Token.DATA, JAZZ)  # file:a is gone
    assert control.allowed("wilma@example.com", Token.CREATE_TOPIC)
    mark = access_watermark(core)
    control.load_file(second)
    assert access_watermark(core) == mark


@pytest.mark.parametrize("text", [
    "<access><allow id='x' originator='*@*' tokens='core:data' /><allow id='y' "
    "originator='f*@x.com' tokens='core:data' /></access>",
    "<access><allow id='x' originator='*@*' tokens='core:data' /></acces>",
    "<access domain='other.org' />",
])
def test_malformed_file_changes_nothing(core: BrokerCore, tmp_path: Path, text: str) -> None:
    """A file with one bad entry, broken XML, or another domain raises ConfigError and
    leaves both the entries and the Kafka topic untouched."""
    control = AccessControl(core.access)
    good = tmp_path / "good.xml"
    good.write_text(GUIDE_FILE)
    control.load_file(good)
    before, mark = control.entries(), access_watermark(core)
    bad = tmp_path / "bad.xml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as info:
        control.load_file(bad, domain="example.com")
    assert "bad.xml" in str(info.value)
    assert control.entries() == before
    assert access_watermark(core) == mark


def test_missing_file_is_a_config_error(core: BrokerCore, tmp_path: Path) -> None:
    """A file that does not exist is a ConfigError that names it."""
    with pytest.raises(ConfigError, match=r"nowhere\.xml"):
        AccessControl(core.access).load_file(tmp_path / "nowhere.xml")


def test_mr_slate_stays_out_even_when_subscribed(core: BrokerCore, other: BrokerCore,
                                                 tmp_path: Path) -> None:
    """The access guide's file plus "only subscribers may publish": barney (outside the domain)
    publishes once subscribed and not after cancel; mr.slate never, subscribed or not; a
    second broker that refreshes agrees."""
    control = AccessControl(core.access)
    path = tmp_path / "access.xml"
    path.write_text(GUIDE_FILE)
    control.load_file(path, domain="example.com")
    assert control.allowed("barney@rubble.com", Token.SUBSCRIBE, JAZZ)
    assert not control.allowed("barney@rubble.com", Token.DATA, JAZZ)
    control.grant_subscriber(JAZZ, "barney@rubble.com")
    control.grant_subscriber(JAZZ, "mr.slate@example.com")
    assert control.allowed("barney@rubble.com", Token.DATA, JAZZ)
    assert not control.allowed("mr.slate@example.com", Token.DATA, JAZZ)
    assert control.allowed("mr.slate@example.com", Token.DATA, "music.rock")  # locals may
    peer = AccessControl(other.access)
    peer.refresh()
    assert peer.allowed("barney@rubble.com", Token.DATA, JAZZ)
    assert not peer.allowed("mr.slate@example.com", Token.DATA, JAZZ)
    assert control.revoke_subscriber(JAZZ, "barney@rubble.com")
    assert not control.allowed("barney@rubble.com", Token.DATA, JAZZ)
    peer.refresh()
    assert not peer.allowed("barney@rubble.com", Token.DATA, JAZZ)
