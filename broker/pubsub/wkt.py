"""The well-known topics the service publishes itself (content-based draft §6): pure builders.

Theory of operation
-------------------
`WKT=Topics` (§6.2) holds one message per topic of this domain, `WKT=Subscriptions` (§6.3) one
per subscription. The service publishes them; nobody else may (537). Each is an ordinary
journal record on its topic, published by `apex=pubsub@D` as `ps:message-content` with the
draft's headers, so it is durable, in the audit like any data, delivered live and by gap fill
like any data, and cached by the item store (broker/robust/items.py): a subscriber that
subscribes with `cached` gets the current list, rebuilt after a restart from Kafka like any
cached message. Journaling them is the point: the lists are then exactly as durable and
auditable as the operations that changed them, and nothing else has to be recovered.

Identity. The message-id is stable: the topic name (`WKT=Topics`), `SUBSCRIBER/ID`
(`WKT=Subscriptions`). The draft's schema types message-id as xs:int; apexps message-ids are
strings throughout (its journal, items and selectors), and a name needs no registry of numbers
that would itself have to survive a restart. The revision rises with every message about the
same id (§6.2.2): `Revisions.next` takes the larger of one more than the last it gave and the
seconds since 2020-01-01 — so it keeps rising across restarts and across a topic deleted and
created again (a cancel deletes the cached message, and with it the last revision the item
store knew) without anything kept beside the journal. It fits the draft's 31 bits until 2088;
more than one change a second to one id, sustained, runs ahead of the clock, and only a
restart inside that run could then repeat a revision.

Disposition. A topic created is a `publish` message; deleted, a `cancel` with a higher revision
(§6.2.2) whose publish type is `drop`: subscribers get it live, and the cache forgets the
topic, so `cached` gives the topics that exist. Likewise a subscription: `ACTIVE` while it
lasts, `TERMINATED` with a reason (cancelled, expired, topic deleted) as a drop when it ends.

Privacy (§6.3.1). A subscriber of `WKT=Subscriptions` receives only messages about its own
subscriptions: `is_own` is the default selector "subscriber = your endpoint", applied by the
service's entitlement check to live data, gap fills, repairs and cached messages alike, so
nothing of another endpoint's subscriptions reaches a link. The messages' `fields` are what the
ingest would store for them (`extract_fields`, every element and header), so a subscriber's own
selector and Spark read them like any message's, and `is_own` reads `subscriber` there.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from broker.records import JournalEntry, Publication, PublishType, Subscription, Topic
from broker.selectors import extract_fields

__all__ = [
    "PS_NAMESPACE",
    "SUBSCRIPTIONS_TOPIC",
    "TOPICS_TOPIC",
    "WATCH_MARK",
    "Revisions",
    "is_own",
    "subscription_message",
    "subscription_message_id",
    "topic_message",
    "watch_message",
    "watch_message_id",
]

TOPICS_TOPIC = "WKT=Topics"
SUBSCRIPTIONS_TOPIC = "WKT=Subscriptions"
#: The `ps:` namespace of the draft's examples (§5.2; its schema uses another, so readers
#: recognize `message-content` by local name).
PS_NAMESPACE = "http://www.example.com/pubsub"
#: 2020-01-01T00:00:00Z in epoch seconds: the zero of the clock part of revisions.
_REVISION_EPOCH_S = 1_577_836_800
_MAX_REVISION = 2_147_483_647


class Revisions:
    """The next revision per message-id (see the module docstring); not thread-safe: the
    handler calls it under its management lock."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], int] = {}

    def seen(self, topic: str, message_id: str, revision: int) -> None:
        """A revision already published (the cached state, at start)."""
        key = (topic, message_id)
        self._last[key] = max(self._last.get(key, -1), revision)

    def next(self, topic: str, message_id: str, now_ms: int) -> int:
        key = (topic, message_id)
        clock = max(0, now_ms // 1000 - _REVISION_EPOCH_S)
        rev = min(_MAX_REVISION, max(self._last.get(key, -1) + 1, clock))
        self._last[key] = rev
        return rev


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _message(topic: str, publisher: str, message_id: str, revision: int, *, now_ms: int,
             body: Iterable[str]) -> bytes:
    return "".join((
        f"<ps:message-content transID='{revision % _MAX_REVISION + 1}' content='#Content'"
        f" xmlns:ps='{PS_NAMESPACE}'>",
        f"<ps:topic>{_esc(topic)}</ps:topic>",
        f"<ps:publisher>{_esc(publisher)}</ps:publisher>",
        f"<ps:publication-date>{_date(now_ms)}</ps:publication-date>",
        "<ps:expiration-date>*</ps:expiration-date>",
        f"<ps:message-id>{_esc(message_id)}</ps:message-id>",
        f"<ps:revision-id>{revision}</ps:revision-id>",
        "<ps:content Name='Content'>", *body, "</ps:content>",
        "</ps:message-content>")).encode("utf-8")


#: §6.2: with no selector schema of its own a topic offers §5.5.1's default (every field of the
#: message) to both classes apexps implements.
DEFAULT_SELECTOR_SCHEMA = "<selector-schema class='JMS RFC-2254' />"
_WRAPPER = ("<selector-schemas>", "</selector-schemas>")


def _schemas(topic: Topic) -> list[str]:
    """The topic's `<message-schema>` and `<selector-schema>` elements (§6.2), from the XML
    text its record keeps (broker/pubsub/schemas.py `prepare`: a standalone xs:schema, and one
    `<selector-schema>` or several in `<selector-schemas>`, each serialized by lxml from a
    hardened parse, so well formed and without an XML declaration)."""
    out = []
    if topic.message_schema is not None:
        out.append(f"<message-schema>{topic.message_schema}</message-schema>")
    selector = topic.selector_schema
    if selector is None:
        out.append(DEFAULT_SELECTOR_SCHEMA)
    elif selector.startswith(_WRAPPER[0]) and selector.endswith(_WRAPPER[1]):
        out.append(selector[len(_WRAPPER[0]):-len(_WRAPPER[1])])
    else:
        out.append(selector)
    return out


def topic_message(topic: Topic | str, *, service: str, revision: int, now_ms: int,
                  content_type: str) -> Publication:
    """The `WKT=Topics` message for `topic`: created (a `Topic`: disposition publish, with
    its owner, description and schemas) or deleted (its name: disposition cancel, a drop)."""
    name = topic if isinstance(topic, str) else topic.name
    body = [f"<topic-name>{_esc(name)}</topic-name>"]
    if isinstance(topic, str):
        body.append("<disposition>cancel</disposition>")
    else:
        body.append("<disposition>publish</disposition>")
        if topic.owner:
            body.append(f"<publisher endpoint='{_esc(topic.owner)}' />")
        if topic.description:
            body.append(f"<description>{_esc(topic.description)}</description>")
        body.extend(_schemas(topic))
    content = _message(TOPICS_TOPIC, service, name, revision, now_ms=now_ms, body=body)
    return Publication(
        topic=TOPICS_TOPIC, source=service, content_type=content_type, content=content,
        publish_type=PublishType.DROP if isinstance(topic, str) else PublishType.UPDATE,
        message_id=name, revision_id=str(revision), publication_date=now_ms,
        expiration_date="*", fields=extract_fields(content))


def subscription_message_id(sub: Subscription) -> str:
    return f"{sub.subscriber}/{sub.subscription_id}"


def subscription_message(sub: Subscription, *, service: str, revision: int, now_ms: int,
                         content_type: str, ended: str | None = None) -> Publication:
    """The `WKT=Subscriptions` message for `sub`: ACTIVE, or TERMINATED with the reason
    `ended` (a drop: it leaves the cache)."""
    mid = subscription_message_id(sub)
    status = "ACTIVE" if ended is None else "TERMINATED"
    selector = sub.selector or ""
    cls = f" class='{_esc(sub.selector_class)}'" if sub.selector_class else ""
    body = [
        f"<subscriber>{_esc(sub.subscriber)}</subscriber>",
        f"<subscription-id>{_esc(sub.subscription_id)}</subscription-id>",
        f"<topic-name>{_esc(sub.topic)}</topic-name>",
        f"<selector{cls}>{_esc(selector)}</selector>",
        f"<subscription-date>{_date(sub.created_at)}</subscription-date>",
        f"<duration>{sub.duration_s}</duration>",
        f"<current-status>{status}</current-status>",
    ]
    if ended is not None:
        body.append(f"<reason>{_esc(ended)}</reason>")
    return _subscriptions_record(body, ended=ended is not None, service=service, mid=mid,
                                 revision=revision, now_ms=now_ms, content_type=content_type)


def _subscriptions_record(body: list[str], *, ended: bool, service: str, mid: str,
                          revision: int, now_ms: int, content_type: str) -> Publication:
    """A `WKT=Subscriptions` message of `body`: an update while the subscription (or watch)
    lives, a drop once it has ended; its fields kept for selectors."""
    content = _message(SUBSCRIPTIONS_TOPIC, service, mid, revision, now_ms=now_ms, body=body)
    return Publication(
        topic=SUBSCRIPTIONS_TOPIC, source=service, content_type=content_type, content=content,
        publish_type=PublishType.DROP if ended else PublishType.UPDATE,
        message_id=mid, revision_id=str(revision), publication_date=now_ms,
        expiration_date="*", fields=extract_fields(content))


def is_own(entry: JournalEntry, subscriber: str) -> bool:
    """Is `entry` (on WKT=Subscriptions) about one of `subscriber`'s subscriptions?"""
    return entry.fields.get("subscriber") == [subscriber]


def watch_message_id(subscriber: str, resource: str, watch_id: str) -> str:
    return f"{subscriber}{WATCH_MARK}{resource}/{watch_id}"


WATCH_MARK = "/watch/"


def watch_message(*, subscriber: str, resource: str, watch_id: str, events: str,
                  expires: int, state: str, reason: str | None, created_at: int, link: str,
                  expires_at: int | None, service: str, revision: int, now_ms: int,
                  content_type: str) -> Publication:
    """The `WKT=Subscriptions` message for a resource watch (docs/event-binding.md §7): its
    state (ACTIVE, PENDING, TERMINATED with the reason) beside the topic subscriptions, with
    the resource and events; a terminated one is a drop, as for a subscription. The message
    is also what a restart rebuilds the watch from (its grant time is the publication date)."""
    topic, _, _ = resource.partition("/")
    mid = watch_message_id(subscriber, resource, watch_id)
    body = [
        f"<subscriber>{_esc(subscriber)}</subscriber>",
        f"<subscription-id>{_esc(watch_id)}</subscription-id>",
        f"<topic-name>{_esc(topic)}</topic-name>",
        f"<resource>{_esc(resource)}</resource>",
        f"<events>{_esc(events)}</events>",
        f"<link>{_esc(link)}</link>",
        f"<created-at>{created_at}</created-at>",
        *([] if expires_at is None else [f"<expires-at>{expires_at}</expires-at>"]),
        f"<subscription-date>{_date(created_at)}</subscription-date>",
        f"<duration>{expires}</duration>",
        f"<current-status>{state.upper()}</current-status>",
    ]
    if reason is not None:
        body.append(f"<reason>{_esc(reason)}</reason>")
    return _subscriptions_record(body, ended=reason is not None, service=service, mid=mid,
                                 revision=revision, now_ms=now_ms, content_type=content_type)
