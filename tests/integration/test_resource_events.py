"""Resource event notification over the wire (docs/event-binding.md; the P2PSIP event draft's
flows): real Kafka, real BEEP over TCP. The explicit flow (figure 4, F01-F04), refresh, update,
Expires shortened, permanent, below min-expires and 0; the immediate Notify carrying the current
state; expiry and deletion ending watches with their reasons; the implicit flow (figure 5); and
Notifies riding the delivery path: link seqs without a hole, a gap fill resending one exactly,
and the watch's state in WKT=Subscriptions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.apex.endpoint import Endpoint
from adapters.apex.events_codec import NotifyDoc, WatchRequest, decode_events
from adapters.app import BrokerApp
from adapters.client.pubsub_client import Delivered, PubsubClient
from broker.events import (
    PERMANENT,
    ExpiresPolicy,
    ImplicitPolicy,
    Reason,
    Resource,
    State,
    WatchTable,
)
from broker.kafka_io import KafkaConfig
from broker.records import PublishType
from broker.robust.config import RobustConfig
from common.errors import (
    AccessDenied,
    ApexpsError,
    EventNotUnderstood,
    ExpiresTooBrief,
    NotTaken,
)

pytestmark = pytest.mark.kafka

QUIET = RobustConfig(heartbeat_ms=600_000, max_gap=100)
NOTIFY = "WKT=Notify"
IMAGE, UPDATE, DROP = PublishType.IMAGE, PublishType.UPDATE, PublishType.DROP


async def next_notify(events: AsyncIterator[object], timeout: float = 30,
                      ) -> tuple[NotifyDoc, Delivered]:
    """The next Notify delivered (other traffic skipped)."""
    while True:
        got = await asyncio.wait_for(anext(events), timeout)  # type: ignore[call-overload]
        if isinstance(got, Delivered) and got.topic == NOTIFY:
            doc = decode_events(got.content)
            assert isinstance(doc, NotifyDoc)
            return doc, got


def contents(doc: NotifyDoc) -> list[bytes]:
    return [v.content for v in doc.versions]


async def _explicit(config: KafkaConfig) -> None:
    table = WatchTable(policy=ExpiresPolicy(min_s=2, max_s=600))
    async with BrokerApp(config, robust=QUIET, events=table) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic("q.a")
        await pub.publish("q.a", b"<q v='1' />", "application/xml", publish_type=IMAGE,
                          message_id="IBM", implicit=False)
        events = jade.events()

        # F01/F02: the answer grants Expires; F03: at once a Notify with the current state
        reply = await jade.watch("q.a/IBM", {1, 2, 3, 0x8001}, 60, watch_id="w1")
        assert (reply.code, reply.expires, reply.events) == (250, 60, {1, 2, 3, 0x8001})
        first, d1 = await next_notify(events)
        assert (first.state, first.current, first.events) == (State.ACTIVE, True, frozenset())
        assert contents(first) == [b"<q v='1' />"] and first.watch_id == "w1"
        assert d1.stamp is not None and d1.stamp.topic == NOTIFY

        # a later event in the list: a Notify naming it, carrying the change
        await pub.publish("q.a", b"<q v='2' />", "application/xml", publish_type=UPDATE,
                          message_id="IBM")
        mod, d2 = await next_notify(events)
        assert (mod.state, mod.events, contents(mod)) == (State.ACTIVE, {2}, [b"<q v='2' />"])
        # an application event travels with the publication; the watch named it
        await pub.publish("q.a", b"<q v='3' />", "application/xml", publish_type=UPDATE,
                          message_id="IBM", event=0x8001)
        app_ev, d3 = await next_notify(events)
        assert app_ev.events == {2, 0x8001}
        # the Notifies took consecutive seqs of jade's link, like data
        seqs = [d.stamp.link_seq for d in (d1, d2, d3) if d.stamp is not None]
        assert seqs == list(range(seqs[0], seqs[0] + 3))

        # refresh: the same resource and id; a new grant and the current state again
        reply = await jade.watch("q.a/IBM", {1, 2, 3}, 30, watch_id="w1")
        assert reply.expires == 30
        again, _ = await next_notify(events)
        assert again.current and contents(again) == [b"<q v='1' />", b"<q v='2' />",
                                                     b"<q v='3' />"]
        # shortened, never lengthened
        assert (await jade.watch("q.a/IBM", {1, 2, 3}, 10_000, watch_id="w1")).expires == 600
        await next_notify(events)

        # refusals change nothing: below min-expires (with it), events not understood,
        # unknown resource
        before = list(table.all())
        with pytest.raises(ExpiresTooBrief) as brief:
            await jade.watch("q.a/IBM", {1}, 1, watch_id="w1")
        assert brief.value.min_expires == 2  # type: ignore[attr-defined]
        with pytest.raises(EventNotUnderstood):
            await jade.watch("q.a/IBM", {4}, 60, watch_id="w1")
        with pytest.raises(NotTaken):
            await jade.watch("q.nope/IBM", {1}, 60, watch_id="w9")
        assert list(table.all()) == before

        # an update removes 'modified': the next modification is not notified, the drop is
        await jade.watch("q.a/IBM", {2}, 600, watch_id="w1", update="remove")
        updated, _ = await next_notify(events)
        assert updated.current
        await pub.publish("q.a", b"<q v='4' />", "application/xml", publish_type=UPDATE,
                          message_id="IBM")
        await pub.publish("q.a", b"<gone />", "application/xml", publish_type=DROP,
                          message_id="IBM")
        deleted, dd = await next_notify(events)
        assert (deleted.events, contents(deleted)) == ({3}, [b"<gone />"])

        # a gap fill resends a Notify exactly: it rides the link like data
        assert dd.stamp is not None
        refilled: list[Delivered] = []
        fill = asyncio.ensure_future(jade.gap(dd.stamp.link, dd.stamp.link_seq,
                                              dd.stamp.link_seq))
        doc, copy = await next_notify(events)
        await fill
        refilled.append(copy)
        assert copy.stamp is not None and copy.stamp.refill
        # (inline XML content may come back re-serialized: the same document, the same record)
        assert doc == deleted and copy.stamp.source_seq == dd.stamp.source_seq

        # Expires 0 cancels: 250 and a final terminated Notify, reason deactivated
        reply = await jade.watch("q.a/IBM", {1}, 0, watch_id="w1")
        assert (reply.code, reply.expires) == (250, 0)
        last, _ = await next_notify(events)
        assert (last.state, last.reason) == (State.TERMINATED, Reason.DEACTIVATED)
        assert list(table.all()) == []

        # the watch's states showed in jade's WKT=Subscriptions, terminated last
        await jade.subscribe("WKT=Subscriptions", 600, cached=True)
        await jade.watch("q.a/IBM", {1}, 60, watch_id="probe")
        while True:
            got = await asyncio.wait_for(anext(events), 30)
            if isinstance(got, Delivered) and b"/probe</ps:message-id>" in got.content:
                break
            if isinstance(got, Delivered) and b"watch/q.a/IBM/w1" in got.content:
                assert b"<current-status>TERMINATED</current-status>" in got.content
                assert b"<reason>deactivated</reason>" in got.content
        for c in (pub, jade):
            await c.close()


def test_explicit_subscription_flow(kafka_config: KafkaConfig) -> None:
    """Figure 4: grant, immediate current-state Notify, event Notifies, refresh, update,
    shortened Expires, refusals without a change, a gap fill of a Notify, cancel."""
    asyncio.run(_explicit(kafka_config))


async def _endings(config: KafkaConfig) -> None:
    table = WatchTable(policy=ExpiresPolicy(min_s=1, max_s=600))
    async with BrokerApp(config, robust=QUIET, events=table) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade, fred = (await connect("pub@example.com"), await connect("jade@example.com"),
                           await connect("fred@example.com"))
        await pub.create_topic("q.b")
        jade_events, fred_events = jade.events(), fred.events()

        # no state yet: the immediate Notify is empty
        assert (await fred.watch("q.b/X", {1, 3}, PERMANENT)).expires == PERMANENT
        empty, _ = await next_notify(fred_events)
        assert empty.current and empty.versions == () and empty.expires == PERMANENT

        # a short watch expires: a terminated Notify with reason timeout
        await jade.watch("q.b/X", {1}, 1, watch_id="short")
        await next_notify(jade_events)
        ended, _ = await next_notify(jade_events)
        assert (ended.state, ended.reason, ended.watch_id) == (State.TERMINATED,
                                                               Reason.TIMEOUT, "short")

        # created, then deleted: the permanent watch hears both, then ends with noresource
        await pub.publish("q.b", b"<x />", "application/xml", publish_type=IMAGE,
                          message_id="X")
        created, _ = await next_notify(fred_events)
        assert created.events == {1}
        await pub.publish("q.b", b"<x />", "application/xml", publish_type=DROP,
                          message_id="X")
        deleted, _ = await next_notify(fred_events)
        gone, _ = await next_notify(fred_events)
        assert deleted.events == {3}
        assert (gone.state, gone.reason) == (State.TERMINATED, Reason.NORESOURCE)

        # a deleted topic ends every watch of it
        await jade.watch("q.b/Y", {2}, 600)
        await next_notify(jade_events)
        await pub.delete_topic("q.b")
        last, _ = await next_notify(jade_events)
        assert (last.state, last.reason) == (State.TERMINATED, Reason.NORESOURCE)
        assert list(table.all()) == []

        # the subscriber cancels all its subscriptions, its notify subscription with them:
        # its watches cannot reach it any more and end (giveup), nothing is left behind
        await pub.create_topic("q.c")
        await jade.watch("q.c/Z", {2}, 600)
        await next_notify(jade_events)
        await jade.cancel()
        assert list(table.all()) == []
        for c in (pub, jade, fred):
            await c.close()


def test_expiry_permanence_and_deletion(kafka_config: KafkaConfig) -> None:
    """Permanent watches last until their resource is deleted; timed ones end with timeout;
    a deleted topic ends them all; each end is a terminated Notify with its reason."""
    asyncio.run(_endings(kafka_config))


async def _implicit(config: KafkaConfig) -> None:
    table = WatchTable(implicit_policy=ImplicitPolicy(topics=frozenset({"q.shared"})))
    async with BrokerApp(config, robust=QUIET, events=table) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        fred, jade, quiet = (await connect("fred@example.com"),
                             await connect("jade@example.com"),
                             await connect("quiet@example.com"))
        await fred.create_topic("q.shared")
        fred_events = fred.events()
        # F01/F02: a publication, not a subscribe, makes the watch; its Notify says so
        await fred.publish("q.shared", b"<doc v='1' />", "application/xml",
                           publish_type=IMAGE, message_id="doc")
        made, _ = await next_notify(fred_events)
        assert made.current and made.watch_id == "implicit"
        # fred's own change is not notified to fred; jade's is (F03)
        await fred.publish("q.shared", b"<doc v='2' />", "application/xml",
                           publish_type=UPDATE, message_id="doc")
        await jade.publish("q.shared", b"<doc v='3' />", "application/xml",
                           publish_type=UPDATE, message_id="doc")
        told, _ = await next_notify(fred_events)
        assert (told.events, contents(told)) == ({2}, [b"<doc v='3' />"])
        # an opt-out publisher gets no watch; jade (no opt-out) got one
        await quiet.publish("q.shared", b"<doc v='4' />", "application/xml",
                            publish_type=UPDATE, message_id="doc", implicit=False)
        told, _ = await next_notify(fred_events)
        assert contents(told) == [b"<doc v='4' />"]
        assert {w.subscriber for w in table.all()} == {"fred@example.com", "jade@example.com"}
        for c in (fred, jade, quiet):
            await c.close()


def test_implicit_subscription_flow(kafka_config: KafkaConfig) -> None:
    """Figure 5: publishing to a topic with the implicit policy watches the publisher for
    others' changes, unless it opts out."""
    asyncio.run(_implicit(kafka_config))


async def _restart(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic("q.r")
        events = jade.events()
        await jade.watch("q.r/IBM", {1, 2}, PERMANENT, watch_id="p")
        await jade.watch("q.r/IBM", {2}, 3600, watch_id="t")
        _, before = await next_notify(events)
        _, before = await next_notify(events)
        granted = {w.key: w for w in app.handler.events.table.all()}
        for c in (pub, jade):
            await c.close()
    async with BrokerApp(config, robust=QUIET) as app:
        # rebuilt from WKT=Subscriptions as the item store recovered it from Kafka
        assert {w.key: w for w in app.handler.events.table.all()} == granted
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        events = jade.events()
        await pub.publish("q.r", b"<x />", "application/xml", publish_type=IMAGE,
                          message_id="IBM", implicit=False)
        first, d1 = await next_notify(events)
        assert (first.watch_id, first.events) == ("p", {1})
        await pub.publish("q.r", b"<y />", "application/xml", publish_type=UPDATE,
                          message_id="IBM")
        got = [await next_notify(events), await next_notify(events)]
        assert sorted((doc.watch_id, *doc.events) for doc, _ in got) == [("p", 2), ("t", 2)]
        assert before.stamp is not None and d1.stamp is not None
        assert d1.stamp.link == before.stamp.link and d1.stamp.link_seq > before.stamp.link_seq
        for c in (pub, jade):
            await c.close()


def test_watches_survive_a_restart(kafka_config: KafkaConfig) -> None:
    """A restarted broker rebuilds its watches from Kafka and goes on notifying on the same
    link."""
    asyncio.run(_restart(kafka_config))


async def _hostile(config: KafkaConfig) -> None:
    table = WatchTable()
    async with BrokerApp(config, robust=QUIET, events=table) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        jade = await connect("jade@example.com")
        await jade.create_topic("q.h")
        subs_before = app.service.subscriptions()
        for raw, code in (
                (b"<watch resource='q.h/A' id='1' expires='60' events='1' transID='1'", 500),
                (b"<!DOCTYPE w [<!ENTITY x 'y'>]><watch />", 500),
                (b"<watch resource='q.h/A' id='1' expires='60' events='1' />", 501),
                (b"<watch resource='q.h/A' id='1' expires='x' events='1' transID='1' />", 501),
                (b"<watch resource='q.h' id='1' expires='60' events='1' transID='1' />", 553),
                (b"<notify resource='q.h/A' id='1' subscriber='jade@example.com'"
                 b" state='active' />", 501)):
            with pytest.raises(ApexpsError) as caught:
                await jade.client.send(jade.endpoint, [jade.service], raw,
                                       "application/beep+xml")
            assert int(caught.value.code) == code, (raw, caught.value)
        # for another subscriber: 537 in the answer
        trans = jade.new_trans_id()
        with pytest.raises(AccessDenied):
            await jade._ask(WatchRequest(Resource("q.h", "A"), "1", 60, frozenset({1}), trans,
                                         Endpoint.parse("fred@example.com")), trans)
        # nothing of it stayed: no watch, no notify subscription
        assert list(table.all()) == [] and app.service.subscriptions() == subs_before
        # and the service still answers
        assert (await jade.watch("q.h/A", {1}, 60)).code == 250
        await jade.close()


def test_bad_watches_change_nothing(kafka_config: KafkaConfig) -> None:
    """Hostile or invalid watch documents are refused on the data (500, 501, 553), a watch
    for someone else is 537; none leaves a watch or a subscription behind."""
    asyncio.run(_hostile(kafka_config))


async def _tokens(config: KafkaConfig) -> None:
    from broker.records import AccessEffect
    from tests.integration.test_permission_tokens import permtoken

    async with BrokerApp(config, robust=QUIET) as app:
        app.access.put(permtoken("cli:jade-6747", "jade@example.com", "6747",
                                 AccessEffect.DENY))
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic("q.t")
        await pub.publish("q.t", b"<open />", "application/xml", publish_type=IMAGE,
                          message_id="IBM", implicit=False)
        await pub.publish("q.t", b"<secret />", "application/xml", publish_type=UPDATE,
                          message_id="IBM", token="6747", implicit=False)
        events = jade.events()
        await jade.watch("q.t/IBM", {2}, 60)
        first, _ = await next_notify(events)
        assert contents(first) == [b"<open />"]  # the tokened delta left out
        await pub.publish("q.t", b"<secret2 />", "application/xml", publish_type=UPDATE,
                          message_id="IBM", token="6747", implicit=False)
        await pub.publish("q.t", b"<open2 />", "application/xml", publish_type=UPDATE,
                          message_id="IBM", implicit=False)
        told, _ = await next_notify(events)  # the secret change caused none
        assert contents(told) == [b"<open2 />"]
        for c in (pub, jade):
            await c.close()


def test_notifies_obey_permission_tokens(kafka_config: KafkaConfig) -> None:
    """A subscriber denied a token gets neither the tokened versions in the current state nor
    a Notify for a tokened change."""
    asyncio.run(_tokens(kafka_config))


async def _repair(config: KafkaConfig) -> None:
    async with BrokerApp(config, robust=QUIET) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic("q.s")
        events = jade.events()
        await jade.watch("q.s/A", {1, 2}, 600, link="jade-watch")
        _, d0 = await next_notify(events)
        await pub.publish("q.s", b"<a />", "application/xml", publish_type=IMAGE,
                          message_id="A", implicit=False)
        doc1, d1 = await next_notify(events)
        assert d0.stamp is not None and d1.stamp is not None
        # the link's context is gone, say: repair by source, from the first Notify on
        repair = asyncio.ensure_future(jade.repair(
            "jade-watch", [(d0.stamp.source or "", d0.stamp.source_seq or 0)]))
        again, copy = await next_notify(events)
        await repair
        assert copy.stamp is not None and copy.stamp.epoch == d1.stamp.epoch + 1
        assert (again, copy.stamp.source_seq) == (doc1, d1.stamp.source_seq)
        for c in (pub, jade):
            await c.close()


def test_a_source_repair_resends_notifies(kafka_config: KafkaConfig) -> None:
    """Notifies are journal records of the service's source: a repair by source (robust-binding
    §5.2) on the watch's link resends those after the position given, in a new epoch."""
    asyncio.run(_repair(kafka_config))


async def _killed(config: KafkaConfig) -> None:
    from tests.integration.broker_process import start_broker

    proc, port = await start_broker(config.bootstrap, "--heartbeat-ms", "600000",
                                    namespace=config.namespace, logs=False)
    try:
        pub = await PubsubClient.connect("127.0.0.1", port, "pub@example.com")
        jade = await PubsubClient.connect("127.0.0.1", port, "jade@example.com")
        await pub.create_topic("q.k")
        events = jade.events()
        await jade.watch("q.k/A", {1}, PERMANENT, watch_id="p")
        await jade.watch("q.k/A", {1}, 1, watch_id="short")
        notes = [await next_notify(events), await next_notify(events)]
        old_epoch = notes[0][1].stamp.epoch if notes[0][1].stamp is not None else None
        proc.kill()  # kill -9
        await proc.wait()
        for c in (pub, jade):
            await c.close()
        proc, port = await start_broker(config.bootstrap, "--heartbeat-ms", "600000",
                                        namespace=config.namespace, logs=False)
        pub = await PubsubClient.connect("127.0.0.1", port, "pub@example.com")
        jade = await PubsubClient.connect("127.0.0.1", port, "jade@example.com")
        events = jade.events()
        # After a kill -9 the link begins a new epoch (robust-binding §2.5): what it carried
        # while jade was away (the short watch's end, and copies of Notifies whose link records
        # the crash may have lost) is in that epoch, refilled from its start; then live, the
        # creation heard by the permanent watch. The newest Notify of each watch counts.
        await pub.publish("q.k", b"<a />", "application/xml", publish_type=IMAGE,
                          message_id="A", implicit=False)
        seen: dict[str, NotifyDoc] = {}
        newest: dict[str, int] = {}
        top, epoch, refilled = 0, None, False

        def take(doc: NotifyDoc, delivered: Delivered) -> None:
            nonlocal top, epoch
            assert delivered.stamp is not None and delivered.stamp.epoch != old_epoch
            epoch, top = delivered.stamp.epoch, max(top, delivered.stamp.link_seq)
            at = delivered.stamp.source_seq or 0
            if at >= newest.get(doc.watch_id, -1):
                seen[doc.watch_id], newest[doc.watch_id] = doc, at

        while seen.get("p") is None or seen["p"].events != {1} or (
                seen.get("short") is None or seen["short"].state != State.TERMINATED):
            if seen.get("p") is not None and seen["p"].events == {1} and not refilled:
                # the refill of 1..top arrives before the linkreply; the link carries only
                # Notifies (no heartbeats), so its last item is the refilled seq `top`
                refilled, last = True, top
                await jade.gap("jade@example.com", 1, last, epoch)
                while True:
                    doc, delivered = await next_notify(events)
                    take(doc, delivered)
                    stamp = delivered.stamp
                    if stamp is not None and stamp.refill and stamp.link_seq == last:
                        break
                continue
            take(*await next_notify(events))
        assert (seen["short"].state, seen["short"].reason) == (State.TERMINATED,
                                                               Reason.TIMEOUT)
        assert (seen["p"].state, seen["p"].events) == (State.ACTIVE, {1})
        for c in (pub, jade):
            await c.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_watches_survive_a_kill_9(kafka_config: KafkaConfig) -> None:
    """A broker killed with -9 comes back with its watches from Kafka: a permanent one goes on
    notifying on the same link, one that ran out ends with timeout."""
    asyncio.run(_killed(kafka_config))


PENDING_ACCESS = """<access domain='example.com'>
  <allow id='locals' originator='*@example.com' tokens='pubsub:all core:data' />
  <deny id='no-jade' originator='jade@example.com' tokens='pubsub:subscribe' topic='q.p' />
</access>
"""


async def _pending(config: KafkaConfig, access: str) -> None:
    table = WatchTable(pending_on_access=True)
    async with BrokerApp(config, robust=QUIET, access_file=access, events=table) as app:
        connect = lambda who: PubsubClient.connect("127.0.0.1", app.port, who)  # noqa: E731
        pub, jade = await connect("pub@example.com"), await connect("jade@example.com")
        await pub.create_topic("q.p")
        await pub.publish("q.p", b"<a />", "application/xml", publish_type=IMAGE,
                          message_id="A", implicit=False)
        events = jade.events()
        assert (await jade.watch("q.p/A", {2}, 600)).code == 250
        waiting, _ = await next_notify(events)
        assert (waiting.state, waiting.current, waiting.versions) == (State.PENDING, False, ())
        await pub.publish("q.p", b"<b />", "application/xml", publish_type=UPDATE,
                          message_id="A", implicit=False)
        # the entries change: the watch starts, with the current state. <b /> is in it, or, if
        # the service had not yet forwarded it then, it comes as a change: once either way
        await asyncio.to_thread(app.access.remove, "file:no-jade")
        started, _ = await next_notify(events)
        assert (started.state, started.current) == (State.ACTIVE, True)
        if contents(started) == [b"<a />"]:
            later, _ = await next_notify(events)
            assert (later.events, contents(later)) == ({2}, [b"<b />"])
        else:
            assert contents(started) == [b"<a />", b"<b />"]
        for c in (pub, jade):
            await c.close()


def test_a_watch_waits_pending_for_the_access_entries(kafka_config: KafkaConfig,
                                                      tmp_path: Path) -> None:
    """§4.2.1 Pending: a watch the access entries do not allow yet is granted pending, hears
    nothing, and becomes active with the current state once an entry change allows it."""
    access = tmp_path / "access.xml"
    access.write_text(PENDING_ACCESS)
    asyncio.run(_pending(kafka_config, str(access)))
