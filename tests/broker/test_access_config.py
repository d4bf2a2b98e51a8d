"""The access configuration file, parsed without Kafka: what it accepts, and how every mistake
is reported with its line."""

from __future__ import annotations

import pytest

from broker.access import parse_config
from broker.records import AccessEffect
from common.errors import ConfigError

GOOD = b"""<?xml version='1.0'?>
<!-- the example in docs/access-control.md, without its token entries -->
<access domain='example.com'>
  <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
  <allow id='anyone-subscribes-jazz' originator='*@*' tokens='pubsub:subscribe'
         topic='music.jazz.milesdavis' />
  <deny id='slate' originator='mr.slate@example.com' tokens='core:data'
        topic='music.jazz.milesdavis' />
</access>
"""


def test_good_file_gives_file_entries() -> None:
    """Each <allow>/<deny> becomes an entry with id file:<id>, its tokens split on spaces."""
    entries = parse_config(GOOD, domain="EXAMPLE.com")
    assert [(e.entry_id, e.effect, e.originator, e.tokens, e.topic) for e in entries] == [
        ("file:locals", AccessEffect.ALLOW, "*@example.com", ("pubsub:all", "core:data"), None),
        ("file:anyone-subscribes-jazz", AccessEffect.ALLOW, "*@*", ("pubsub:subscribe",),
         "music.jazz.milesdavis"),
        ("file:slate", AccessEffect.DENY, "mr.slate@example.com", ("core:data",),
         "music.jazz.milesdavis"),
    ]


def test_empty_access_element_is_no_entries() -> None:
    """<access/> is a valid file with no entries (it removes every file: entry on load)."""
    assert parse_config(b"<access/>") == []


@pytest.mark.parametrize(("text", "line", "says"), [
    (b"<access>\n<allow id='a' originator='fr*ed@x.com' tokens='core:data'/>\n</access>", 2,
     "fr*ed"),
    (b"<access>\n\n<allow id='a' originator='*@*' tokens='pubsub:publish'/></access>", 3,
     "unknown access token"),
    (b"<access>\n<allow id='a' originator='*@*' tokens='core:data' topci='x'/></access>", 2,
     "topci"),
    (b"<access>\n<allow id='a' originator='*@*' tokens='core:data' topic='a/b'/></access>", 2,
     "topic name"),
    (b"<access>\n<permit id='a' originator='*@*' tokens='core:data'/></access>", 2,
     "<allow> or <deny>"),
    (b"<access>\n<deny originator='*@*' tokens='core:data'/></access>", 2, "needs id"),
    (b"<access>\n<deny id='a' tokens=''/></access>", 2, "originator and tokens"),
    (b"<access>\n<deny id='a' originator='*@*' tokens='core:data'/>\n"
     b"<allow id='a' originator='*@*' tokens='core:data'/></access>", 3, "line 2"),
    (b"<access>\n<deny id='a' originator='*@*' tokens='core:data'>x</deny></access>", 2,
     "text"),
    (b"<access>\nstray<deny id='a' originator='*@*' tokens='core:data'/></access>", 1,
     "text"),
    (b"<access domain='other.org'/>", 1, "other.org"),
    (b"<acl/>", 1, "<access>"),
    (b"<access owner='x'/>", 1, "owner"),
    (b"<access>\n<allow><allow/></allow></access>", None, "deeper"),
])
def test_mistakes_name_the_line(text: bytes, line: int | None, says: str) -> None:
    """Every kind of mistake raises ConfigError naming the file, the line and the problem."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, name="acl.xml", domain="example.com")
    message = str(info.value)
    assert message.startswith("acl.xml")
    if line is not None:
        assert f"line {line}:" in message
    assert says in message


@pytest.mark.parametrize("text", [
    b"<access>", b"", b"<!DOCTYPE access [<!ENTITY x 'y'>]><access>&x;</access>",
    b"<access>\xff</access>",
])
def test_unparseable_or_hostile_xml_is_a_config_error(text: bytes) -> None:
    """Broken or hostile XML is a ConfigError (501), never an lxml exception."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, name="acl.xml")
    assert int(info.value.code) == 501
