"""An administrator approves or rejects a pending watch, on the wire (docs/event-binding.md §5,
the draft's §4.2.1 "an administrator must approve"): real Kafka, real BEEP over TCP. A topic run
with the approval policy grants every watch pending; a `decide` from whoever holds
`pubsub:deletetopic` on the topic starts it with the current state or ends it, reason rejected;
anyone else is 537, a watch that is not pending 550, a malformed decide 500/501/553, and none of
those changes anything. Decisions and pending watches survive a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.apex.codec import BEEP_XML
from adapters.app import BrokerApp
from adapters.client.pubsub_client import PubsubClient
from broker.events import Reason, Resource, State, WatchTable
from broker.kafka_io import KafkaConfig
from broker.pubsub.wkt import SUBSCRIPTIONS_TOPIC, WATCH_MARK
from common.errors import AccessDenied, ApexpsError, NotTaken
from tests.integration.test_resource_events import IMAGE, QUIET, UPDATE, contents, next_notify

pytestmark = pytest.mark.kafka

TOPIC, OTHER = "q.approve", "q.free"
#: locals may do everything (pubsub:all holds pubsub:deletetopic), except fred, who may not
#: administer the approval topic, and sam, whom the entries do not let watch it
ACCESS = f"""<access domain='example.com'>
  <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
  <deny id='fred' originator='fred@example.com' tokens='pubsub:deletetopic' topic='{TOPIC}' />
  <deny id='no-sam' originator='sam@example.com' tokens='pubsub:subscribe' topic='{TOPIC}' />
</access>
"""


def _table() -> WatchTable:
    return WatchTable(approve_topics=frozenset({TOPIC}), pending_on_access=True)


async def pending_notify(events: AsyncIterator[object]) -> None:
    waiting, _ = await next_notify(events)
    assert (waiting.state, waiting.current, waiting.versions) == (State.PENDING, False, ())


async def _approve(config: KafkaConfig, access: str) -> None:
    table = _table()
    async with BrokerApp(config, robust=QUIET, access_file=access, events=table) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade, fred = (await connect("pub@example.com"), await connect("jade@example.com"),
                           await connect("fred@example.com"))
        await pub.create_topic(TOPIC)
        await pub.create_topic(OTHER)
        await pub.publish(TOPIC, b"<a />", "application/xml", publish_type=IMAGE,
                          message_id="A", implicit=False)
        events = jade.events()
        reply = await jade.watch(f"{TOPIC}/A", {2}, 600, watch_id="w")
        assert (reply.code, reply.expires) == (250, 600)  # the grant, then the pending Notify
        await pending_notify(events)
        key = ("jade@example.com", Resource(TOPIC, "A"), "w")
        # a refresh keeps it waiting: only a decision starts it
        assert (await jade.watch(f"{TOPIC}/A", {2}, 600, watch_id="w")).code == 250
        await pending_notify(events)
        await pub.publish(TOPIC, b"<b />", "application/xml", publish_type=UPDATE,
                          message_id="A", implicit=False)

        # refused decisions change nothing: fred lacks pubsub:deletetopic on the topic (537,
        # before anything else: he learns nothing of the watches), no such watch (550)
        for who, res, wid, code in ((fred, f"{TOPIC}/A", "w", 537),
                                    (fred, f"{TOPIC}/A", "nope", 537),
                                    (pub, f"{TOPIC}/A", "nope", 550),
                                    (pub, f"{TOPIC}/B", "w", 550),
                                    (pub, f"{OTHER}/A", "w", 550)):
            for approve in (True, False):
                with pytest.raises(ApexpsError) as caught:
                    await who.decide(res, "jade@example.com", wid, approve=approve)
                assert int(caught.value.code) == code, (res, wid, caught.value)
        held = table.get(key)
        assert held is not None and held.state is State.PENDING

        # the administrator approves: ok, then the active Notify with the current state, which
        # holds <b /> (acknowledged before the decision)
        await pub.decide(f"{TOPIC}/A", "jade@example.com", "w", approve=True)
        started, _ = await next_notify(events)
        assert (started.state, started.current, started.watch_id) == (State.ACTIVE, True, "w")
        assert contents(started) == [b"<a />", b"<b />"]
        # later changes are notified
        await pub.publish(TOPIC, b"<c />", "application/xml", publish_type=UPDATE,
                          message_id="A", implicit=False)
        later, _ = await next_notify(events)
        assert (later.state, later.events, contents(later)) == (State.ACTIVE, {2}, [b"<c />"])
        # an active watch is not pending: 550 for either verdict, and it stays active
        for approve in (True, False):
            with pytest.raises(NotTaken):
                await pub.decide(f"{TOPIC}/A", "jade@example.com", "w", approve=approve)
        assert (table.get(key) or held).state is State.ACTIVE
        # a refresh of the approved watch does not send it back to wait
        assert (await jade.watch(f"{TOPIC}/A", {2}, 600, watch_id="w")).code == 250
        again, _ = await next_notify(events)
        assert (again.state, again.current) == (State.ACTIVE, True)

        # a watcher the access entries do not allow yet: an approval is 537 (fix the entries
        # first) and changes nothing; the entries changing does not start it either, since
        # the administrator has not decided; the approval then does
        sam = await connect("sam@example.com")
        sam_events = sam.events()
        assert (await sam.watch(f"{TOPIC}/A", {2}, 600, watch_id="s")).code == 250
        await pending_notify(sam_events)
        with pytest.raises(AccessDenied):
            await pub.decide(f"{TOPIC}/A", "sam@example.com", "s", approve=True)
        sam_key = ("sam@example.com", Resource(TOPIC, "A"), "s")
        assert (table.get(sam_key) or held).state is State.PENDING
        await asyncio.to_thread(app.access.remove, "file:no-sam")
        # (the registry's watcher scheduled access_changed before the removal returned, so it
        # has run when the decision arrives: had it started the watch, this would be 550)
        await pub.decide(f"{TOPIC}/A", "sam@example.com", "s", approve=True)
        first, _ = await next_notify(sam_events)
        assert (first.state, first.current) == (State.ACTIVE, True)
        for c in (pub, jade, fred, sam):
            await c.close()


def test_an_administrator_approves_a_pending_watch(kafka_config: KafkaConfig,
                                                    tmp_path: Path) -> None:
    """Pending until approved (refreshes included); the approval sends the current state and
    later changes follow; a non-administrator is 537, a watch that is not pending 550, an
    approval of a subscriber the entries do not allow 537, and none of those changes a
    thing."""
    access = tmp_path / "access.xml"
    access.write_text(ACCESS)
    asyncio.run(_approve(kafka_config, str(access)))


async def _reject(config: KafkaConfig, access: str) -> None:
    table = _table()
    async with BrokerApp(config, robust=QUIET, access_file=access, events=table) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic(TOPIC)
        await pub.create_topic(OTHER)
        events = jade.events()
        assert (await jade.watch(f"{TOPIC}/R", {1, 2}, 600, watch_id="r")).code == 250
        await pending_notify(events)
        await pub.decide(f"{TOPIC}/R", "jade@example.com", "r", approve=False)
        ended, _ = await next_notify(events)
        assert (ended.state, ended.reason, ended.watch_id) == (State.TERMINATED,
                                                                Reason.REJECTED, "r")
        assert list(table.all()) == []
        # gone: a second verdict is 550
        with pytest.raises(NotTaken):
            await pub.decide(f"{TOPIC}/R", "jade@example.com", "r", approve=True)
        # no later Notify: the next one jade hears is the marker's, on a topic without the
        # policy, watched after the rejected resource changed
        await pub.publish(TOPIC, b"<r />", "application/xml", publish_type=IMAGE,
                          message_id="R", implicit=False)
        assert (await jade.watch(f"{OTHER}/M", {1}, 600, watch_id="marker")).code == 250
        marker, _ = await next_notify(events)
        assert (marker.watch_id, marker.state) == ("marker", State.ACTIVE)
        for c in (pub, jade):
            await c.close()


def test_an_administrator_rejects_a_pending_watch(kafka_config: KafkaConfig,
                                                  tmp_path: Path) -> None:
    """A rejection ends the watch with reason rejected, and nothing more is notified."""
    access = tmp_path / "access.xml"
    access.write_text(ACCESS)
    asyncio.run(_reject(kafka_config, str(access)))


async def _malformed(config: KafkaConfig) -> None:
    table = _table()
    async with BrokerApp(config, robust=QUIET, events=table) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic(TOPIC)
        events = jade.events()
        assert (await jade.watch(f"{TOPIC}/A", {1}, 600, watch_id="w")).code == 250
        await pending_notify(events)
        subs_before = app.service.subscriptions()
        good = f"resource='{TOPIC}/A' subscriber='jade@example.com' id='w'"
        for raw, code in (
                (f"<decide {good} verdict='approve'".encode(), 500),
                (b"<!DOCTYPE d [<!ENTITY x 'y'>]><decide />", 500),
                (f"<decide {good} />".encode(), 501),
                (f"<decide {good} verdict='maybe' />".encode(), 501),
                (f"<decide {good} verdict='approve' extra='1' />".encode(), 501),
                (f"<decide {good} verdict='approve'>x</decide>".encode(), 501),
                (f"<decide resource='{TOPIC}/A' subscriber='jade@example.com' id='w w'"
                 f" verdict='approve' />".encode(), 501),
                (f"<decide resource='{TOPIC}' subscriber='jade@example.com' id='w'"
                 f" verdict='approve' />".encode(), 553),
                (f"<decide resource='{TOPIC}/A' subscriber='jade' id='w'"
                 f" verdict='approve' />".encode(), 553)):
            with pytest.raises(ApexpsError) as caught:
                await pub.client.send(pub.endpoint, [pub.service], raw, BEEP_XML)
            assert int(caught.value.code) == code, (raw, caught.value)
        # nothing changed, and the service still decides
        watch = table.get(("jade@example.com", Resource(TOPIC, "A"), "w"))
        assert watch is not None and watch.state is State.PENDING
        assert app.service.subscriptions() == subs_before
        await pub.decide(f"{TOPIC}/A", "jade@example.com", "w", approve=True)
        started, _ = await next_notify(events)
        assert started.state is State.ACTIVE
        for c in (pub, jade):
            await c.close()


def test_a_malformed_decision_changes_nothing(kafka_config: KafkaConfig) -> None:
    """Hostile or invalid decide documents are refused on the data (500, 501, 553)."""
    asyncio.run(_malformed(kafka_config))


def _recorded(app: BrokerApp) -> dict[str, str]:
    """Watch id -> current-status, as WKT=Subscriptions holds them."""
    assert app.handler.items is not None
    out = {}
    for entry in app.handler.items.snapshot(SUBSCRIPTIONS_TOPIC):
        if WATCH_MARK in (entry.message_id or ""):
            f = {k: v[0] for k, v in entry.fields.items() if v}
            out[f["subscription-id"]] = f["current-status"]
    return out


async def _restart(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET, events=_table()) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic(TOPIC)
        await pub.publish(TOPIC, b"<a />", "application/xml", publish_type=IMAGE,
                          message_id="A", implicit=False)
        events = jade.events()
        for wid in ("yes", "no", "later"):
            assert (await jade.watch(f"{TOPIC}/A", {2}, 3600, watch_id=wid)).code == 250
            await pending_notify(events)
        await pub.decide(f"{TOPIC}/A", "jade@example.com", "yes", approve=True)
        await pub.decide(f"{TOPIC}/A", "jade@example.com", "no", approve=False)
        for c in (pub, jade):
            await c.close()
    # the decisions were answered only once durable: the restarted broker has them
    table = _table()
    async with BrokerApp(config, robust=QUIET, events=table) as app:
        states = {w.watch_id: w.state for w in table.all()}
        assert states == {"yes": State.ACTIVE, "later": State.PENDING}
        # (a terminated watch is a drop in WKT=Subscriptions: gone from what it holds)
        assert _recorded(app) == {"yes": "ACTIVE", "later": "PENDING"}
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        events = jade.events()
        with pytest.raises(NotTaken):  # decided before the restart stays decided
            await pub.decide(f"{TOPIC}/A", "jade@example.com", "no", approve=True)
        await pub.decide(f"{TOPIC}/A", "jade@example.com", "later", approve=True)
        started, _ = await next_notify(events)
        assert (started.watch_id, started.state, started.current) == ("later", State.ACTIVE,
                                                                      True)
        assert contents(started) == [b"<a />"]
        for c in (pub, jade):
            await c.close()


def test_pending_and_decided_watches_survive_a_restart(kafka_config: KafkaConfig) -> None:
    """A restarted broker has the pending watch still pending (and decidable), the approved
    one active and the rejected one gone, and WKT=Subscriptions says so."""
    asyncio.run(_restart(kafka_config))


async def _restart_on_access(config: KafkaConfig, denied: str, allowed: str) -> None:
    def table() -> WatchTable:
        return WatchTable(pending_on_access=True)

    async with BrokerApp(config, robust=QUIET, access_file=denied, events=table()) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, sam = await connect("pub@example.com"), await connect("sam@example.com")
        await pub.create_topic(TOPIC)
        events = sam.events()
        assert (await sam.watch(f"{TOPIC}/A", {2}, 3600, watch_id="s")).code == 250
        waiting, seen = await next_notify(events)
        assert waiting.state is State.PENDING and seen.stamp is not None
        for c in (pub, sam):
            await c.close()
    # the broker comes back with entries that allow sam: the pending watch starts at once
    waiting = table()
    async with BrokerApp(config, robust=QUIET, access_file=allowed, events=waiting) as app:
        sam = await PubsubClient.connect("127.0.0.1", app.port, "sam@example.com")
        events = sam.events()
        # the Notify is journaled as the broker starts, maybe before sam is back: sam asks
        # for what its link carried since, as a returning subscriber does (it comes live or
        # refilled, whichever is first)
        fill = asyncio.ensure_future(sam.gap(seen.stamp.link, seen.stamp.link_seq + 1))
        started, _ = await next_notify(events)
        fill.cancel()
        assert (started.watch_id, started.state, started.current) == ("s", State.ACTIVE, True)
        await sam.close()


def test_a_pending_watch_starts_when_the_restarted_broker_allows_it(
        kafka_config: KafkaConfig, tmp_path: Path) -> None:
    """`--pending-watches` across a restart: a watch that waited for the entries comes back
    pending and starts when the entries the broker starts with allow it."""
    denied, allowed = tmp_path / "denied.xml", tmp_path / "allowed.xml"
    denied.write_text(ACCESS)
    allowed.write_text(ACCESS.replace("tokens='pubsub:subscribe'", "tokens='pubsub:createtopic'"))
    asyncio.run(_restart_on_access(kafka_config, str(denied), str(allowed)))
