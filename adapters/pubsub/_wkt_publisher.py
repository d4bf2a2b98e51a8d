"""`WktPublisher`: journals the well-known topics' messages as the service changes state.

The messages and their rules (identity, revisions, dispositions, privacy) are
broker/pubsub/wkt.py's; this is the part that appends them. They go through the publish gate
like any publication, with `apex=pubsub@D` as their source, so they take source seqs, reach
subscribers through the journal follower like any data, and are cached by the item store.

When. After each management operation that changed something, before its 250 is sent (the
handler awaits `publish`): a client that was told its topic exists and then subscribes to
WKT=Topics with `cached` finds it there. A failed append is logged and not retried in place:
`reconcile` at the next start publishes whatever the journal lacks (a topic or subscription
with no message, a message about one that is gone), so the lists converge on the registries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

import structlog

from adapters.apex.codec import BEEP_XML
from broker.publish_gate import Outcome, PublishGate
from broker.pubsub import PubsubService
from broker.pubsub.wkt import (
    SUBSCRIPTIONS_TOPIC,
    TOPICS_TOPIC,
    WATCH_MARK,
    Revisions,
    subscription_message,
    subscription_message_id,
    topic_message,
    watch_message,
    watch_message_id,
)
from broker.records import Publication, Subscription, SubscriptionState, Topic
from broker.robust.items import ItemStore

__all__ = ["WktPublisher"]

log = structlog.get_logger(__name__)


class WktPublisher:
    def __init__(self, service: PubsubService, gate: PublishGate,
                 items: ItemStore | None,
                 acked: Callable[[Sequence[Publication], list[Outcome]], None] | None = None,
                 ) -> None:
        """`acked`: hears each batch's outcomes, to forward what Kafka acknowledged."""
        self.service, self.gate, self.items = service, gate, items
        self._acked = acked
        self.revisions = Revisions()
        if items is not None:  # what the journal already says, as the cache rebuilt it
            for topic in (TOPICS_TOPIC, SUBSCRIPTIONS_TOPIC):
                for entry in items.snapshot(topic):
                    if entry.message_id is not None and (entry.revision_id or "").isdigit():
                        self.revisions.seen(topic, entry.message_id, int(entry.revision_id or 0))

    def _stamp(self, topic: str, message_id: str) -> tuple[int, int]:
        now = self.service.now()
        return self.revisions.next(topic, message_id, now), now

    def topic_created(self, topic: Topic) -> Publication:
        rev, now = self._stamp(TOPICS_TOPIC, topic.name)
        return topic_message(topic, service=self.service.endpoint, revision=rev, now_ms=now,
                             content_type=BEEP_XML)

    def topic_deleted(self, name: str) -> Publication:
        rev, now = self._stamp(TOPICS_TOPIC, name)
        return topic_message(name, service=self.service.endpoint, revision=rev, now_ms=now,
                             content_type=BEEP_XML)

    def subscribed(self, sub: Subscription) -> Publication:
        rev, now = self._stamp(SUBSCRIPTIONS_TOPIC, subscription_message_id(sub))
        return subscription_message(sub, service=self.service.endpoint, revision=rev,
                                    now_ms=now, content_type=BEEP_XML)

    def ended(self, subs: Iterable[Subscription], reason: str) -> list[Publication]:
        out = []
        for sub in subs:
            rev, now = self._stamp(SUBSCRIPTIONS_TOPIC, subscription_message_id(sub))
            out.append(subscription_message(sub, service=self.service.endpoint, revision=rev,
                                            now_ms=now, content_type=BEEP_XML, ended=reason))
        return out

    def watch_state(self, *, subscriber: str, resource: str, watch_id: str, events: str,
                    expires: int, state: str, reason: str | None, created_at: int, link: str,
                    expires_at: int | None) -> Publication:
        """A resource watch's state for WKT=Subscriptions (docs/event-binding.md §7)."""
        rev, now = self._stamp(SUBSCRIPTIONS_TOPIC,
                               watch_message_id(subscriber, resource, watch_id))
        return watch_message(subscriber=subscriber, resource=resource, watch_id=watch_id,
                             events=events, expires=expires, state=state, reason=reason,
                             created_at=created_at, link=link, expires_at=expires_at,
                             service=self.service.endpoint,
                             revision=rev, now_ms=now, content_type=BEEP_XML)

    async def publish(self, pubs: list[Publication]) -> None:
        """Append `pubs` (on the event loop) and wait until Kafka holds them or refused."""
        if not pubs:
            return
        done: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()

        def settled(outcomes: list[Outcome]) -> None:
            if self._acked is not None:
                self._acked(pubs, outcomes)
            if not done.done():
                done.set_result(outcomes)

        self.gate.append_many(pubs, settled)
        for pub, outcome in zip(pubs, await done, strict=True):
            if isinstance(outcome, Exception):
                log.error("well-known topic message not journaled", topic=pub.topic,
                          message_id=pub.message_id, error=str(outcome))

    def reconcile(self) -> list[Publication]:
        """What the journal's WKT messages lack against the registries (at start, once the
        item state is recovered): a message per topic or active subscription without one, a
        cancel per message whose topic or subscription is gone."""
        if self.items is None:
            return []
        svc, pubs = self.service, []
        listed = {e.message_id for e in self.items.snapshot(TOPICS_TOPIC)}
        topics = {t.name: t for t in svc.core.topics}
        pubs += [self.topic_created(t) for name, t in sorted(topics.items())
                 if name not in listed]
        pubs += [self.topic_deleted(str(name)) for name in sorted(listed - set(topics), key=str)
                 if name is not None]
        # (resource watches' messages are the event notifier's: it restores them itself)
        shown = {e.message_id: e for e in self.items.snapshot(SUBSCRIPTIONS_TOPIC)
                 if WATCH_MARK not in (e.message_id or "")}
        active = {subscription_message_id(s): s for s in svc.subscriptions()
                  if s.state is SubscriptionState.ACTIVE}
        pubs += [self.subscribed(s) for mid, s in sorted(active.items()) if mid not in shown]
        gone = [mid for mid in shown if mid is not None and mid not in active]
        for mid in sorted(gone):
            entry = shown[mid]
            sub = Subscription(
                subscriber=entry.fields.get("subscriber", [""])[0],
                subscription_id=entry.fields.get("subscription-id", [""])[0],
                topic=entry.fields.get("topic-name", [""])[0], duration_s=0,
                state=SubscriptionState.TERMINATED, created_at=entry.appended_at)
            pubs += self.ended([sub], "ended while the service was down")
        return pubs
