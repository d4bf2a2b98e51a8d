"""The apex=pubsub service (draft-schwartz-apex-pubsub §4), over the journal and the registries.

Theory of operation
-------------------
Each management operation follows the draft's numbered steps in order and either returns or
raises the `ApexpsError` whose code the draft prescribes (537 access, 553 topic/duration); the
wire adapter turns that into the `reply` element carrying the operation's transID. State changes
go to Kafka first (`Registry.put` returns once the compacted topic holds the record) and only
then to memory, so what a caller was told is what a restart rebuilds.

Publishing: `accept(...)` checks `core:data`, the topic (550 for an unknown one) and, on the
one parse ingest makes (`ingest.py`: headers and selectable fields into the record), the topic's
message schema (561, content-based draft §5.9.1; `schemas.py`), and hands back the
`Publication` to append; the caller answers `ok` once the journal says it is durable.
Forwarding does not start here: a follower reads the journal back (`broker.pubsub.follower`) and
asks `recipient_links_for(entry)` for each record, so what subscribers get is what Kafka holds.

Subscriptions (content-based §5.8): each has an id unique for its subscriber, and a subscriber
may hold several per topic, each with or without a selector (compiled at subscribe: 566, 567).
Subscribing again with the same selector and link renews that one (§4.5 step 5.2) under its
id. `_table.SubscriptionTable` keeps the active ones and answers the fan-out: which
(subscriber, link) a record goes to — once per pair, however many of its subscriptions the
stored fields satisfy — and the InRe ids of each. A cancel names an id, a topic or neither
(568 when nothing matches). Expired ones are removed by `expire_due`, which returns them so the
adapter can send each originator its cancel naming the id. A subscriber whose local part is
`apex=pubsub/TOPIC` is a redistributing pubsub server (§2.4): subscribe and cancel requests for
subjects in its domain are forwarded to it (§4.5 step 4, §4.6 step 3) instead of being applied
here.

Every method may block on Kafka for a few milliseconds; an asyncio caller runs them in a thread.
State shared with the delivery path is guarded by one lock.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import structlog

from broker import selectors
from broker.core import BrokerCore
from broker.expiry import expired
from broker.names import NOTIFY_TOPIC, SERVICE, WELL_KNOWN_TOPICS, validate_topic
from broker.pubsub import wkt
from broker.pubsub.ingest import ingest
from broker.pubsub.wkt import SUBSCRIPTIONS_TOPIC
from broker.records import (
    JournalEntry,
    Publication,
    PublishType,
    Subscription,
    SubscriptionState,
    Topic,
    now_ms,
)
from broker.robust.linkid import validate_link_id
from broker.selectors import Selector, SelectorSchema
from common.errors import (
    AccessDenied,
    ApexpsError,
    InvalidMessage,
    InvalidParameter,
    MessageNotConforming,
    NotTaken,
    UnknownSubscription,
)

from . import schemas
from ._table import Key, SubscriptionTable, link_of
from .ingest import is_xml
from .schemas import TopicSchemas, check_selector

__all__ = [
    "MAX_DURATION_S",
    "AccessPolicy",
    "Forward",
    "PubsubService",
    "redistributor_local",
]

log = structlog.get_logger(__name__)

#: %SECONDS; of the APEX core DTD: the largest duration a subscribe may ask for.
MAX_DURATION_S = 2_147_483_647


class AccessPolicy(Protocol):
    """What the service needs of access control (broker.access.AccessControl provides it)."""

    def allowed(self, originator: str, token: str, topic: str | None = None) -> bool: ...

    def token_allowed(self, subscriber: str, token: str, topic: str | None = None) -> bool: ...

    def grant_subscriber(self, topic: str, subscriber: str) -> object: ...

    def revoke_subscriber(self, topic: str, subscriber: str) -> object: ...


@dataclass(frozen=True, slots=True)
class Forward:
    """§4.5 step 4 / §4.6 step 3: send the request on to this redistributing pubsub server."""

    to: str


def redistributor_local(topic: str) -> str:
    """The local part a redistributing pubsub server subscribes under for `topic`."""
    return f"{SERVICE}/{topic}"


def _validate_message(topic: Topic, root: Any) -> None:
    """Content-based §5.9.1: 561 for a message (ingest's one parse of it) that its topic's
    message schema refuses (broker/pubsub/schemas.py)."""
    if topic.message_schema is not None:
        schemas.TopicSchemas.of(topic).validate(root)


def _domain(endpoint: str) -> str:
    return endpoint.rpartition("@")[2].lower()


def _local(endpoint: str) -> str:
    return endpoint.rpartition("@")[0]


class PubsubService:
    def __init__(self, core: BrokerCore, access: AccessPolicy, domain: str, *,
                 clock: Callable[[], int] = now_ms) -> None:
        self.core, self.access, self.domain, self._clock = core, access, domain.lower(), clock
        self.endpoint = f"{SERVICE}@{self.domain}"
        self._lock = threading.Lock()
        self._table = SubscriptionTable()
        self._expiries: list[tuple[int, str, Key]] = []  # (expires_at, topic, key), lazily pruned
        #: subscriber -> the highest numeric subscription id it was given
        self._last_id: dict[str, int] = {}
        #: the topic's message-schema check (§5.3), given the message parsed once at
        #: ingest: raises MessageNotConforming (561); None: no check
        self.message_validator: Callable[[Topic, Any], None] | None = _validate_message
        #: a compiled selector against the topic's selector schema (§5.8.1): the selector as
        #: the subscription evaluates it (typed by the schema), or 566 / 567; None: as compiled
        self.selector_check: Callable[[Topic, Selector], Selector] | None = _check_selector
        for sub in core.subscriptions:
            if sub.state is SubscriptionState.ACTIVE:
                self._restore(sub)

    def now(self) -> int:
        return self._clock()

    # --- management -------------------------------------------------------------------

    def _check(self, originator: str, token: str, topic: str | None = None) -> None:
        if not self.access.allowed(originator, token, topic):
            where = f" on topic {topic}" if topic else ""
            raise AccessDenied(f"{originator} lacks {token}{where}")

    def _existing(self, topic: str) -> Topic:
        validate_topic(topic)
        if topic in WELL_KNOWN_TOPICS:  # the service's own, always there (§6)
            return Topic(name=topic, created_at=0, owner=self.endpoint)
        found = self.core.topics.get(topic)
        if found is None:
            raise InvalidParameter(f"topic {topic!r} does not exist")
        return found

    def create_topic(self, originator: str, topic: str, *, description: str | None = None,
                     message_schema: str | None = None,
                     selector_schemas: Iterable[str] = ()) -> Topic:
        """§4.2: 537 without pubsub:createtopic, 553 if the topic exists (or is not a name).
        Content-based §6.2.3: the `<message-schema>` and `<selector-schema>` elements' XML;
        553 for a schema refused, 566 for a selector class apexps lacks (schemas.prepare) —
        and then no topic."""
        self._check(originator, "pubsub:createtopic")
        validate_topic(topic)
        if topic in self.core.topics or topic in WELL_KNOWN_TOPICS:
            raise InvalidParameter(f"topic {topic!r} already exists")
        message, selector = schemas.prepare(message_schema, selector_schemas,
                                            named=self.core.topics.get)
        created = self.core.topics.put(Topic(
            name=topic, created_at=self._clock(), owner=originator, description=description,
            message_schema=message, selector_schema=selector))
        log.info("topic created", topic=topic, by=originator,
                 message_schema=message is not None, selector_schema=selector is not None)
        return created

    def topic_schemas(self, topic: str) -> schemas.TopicSchemas:
        """The compiled schemas of `topic` (550 if there is none): what subscribe checks a
        selector against (`schemas.check_selector`) and what publications must satisfy."""
        found = self.core.topics.get(topic)
        if found is None:
            raise NotTaken(f"no topic {topic!r} at {self.domain}")
        return schemas.TopicSchemas.of(found)

    def delete_topic(self, originator: str, topic: str) -> list[Subscription]:
        """§4.3: 537, 553 for an unknown topic. Its subscriptions end with it; they are
        returned so each subscriber can be told (the cancel the service may initiate)."""
        self._check(originator, "pubsub:deletetopic")
        self._existing(topic)
        if topic in WELL_KNOWN_TOPICS:
            raise AccessDenied(f"{topic} is a well-known topic of the service (§6)")
        self.core.topics.delete(topic)
        with self._lock:
            ended = self._table.of_topic(topic)
            for sub in ended:
                self._table.remove(topic, _key(sub))
        for sub in ended:
            self._drop(sub)
        log.info("topic deleted", topic=topic, by=originator, subscriptions_ended=len(ended))
        return ended

    def list_topics(self, originator: str) -> list[str]:
        """§4.4: 537 without pubsub:listtopics; else every topic of this domain, sorted."""
        self._check(originator, "pubsub:listtopics")
        return sorted(t.name for t in self.core.topics)

    def _redistributor(self, topic: str, subject: str) -> str | None:
        wanted = (redistributor_local(topic), _domain(subject))
        with self._lock:
            for sub in self._table.of_topic(topic):
                who = sub.subscriber
                if (_local(who), _domain(who)) == wanted and who != subject:
                    return who
        return None

    def subscribe(self, originator: str, subscriber: str, topic: str, duration_s: int,
                  trans_id: int | None = None, *, link: str | None = None,
                  claim: Callable[[], object] | None = None,
                  activate: bool = True, selector_class: str | None = None,
                  selector: str | None = None) -> Subscription | Forward:
        """§4.5 steps 1-5: 537, 553 (unknown topic), 553 (duration ≤ 0), forward to a
        redistributor of the subject's domain, else record the subscription. `link`: the link
        its data travel on (docs/robust-binding.md §3; default: the subscriber endpoint).
        `selector_class`/`selector` (§5.6, §5.8): 566 for a class the topic does not support,
        567 for a selector that does not compile or does not fit the topic's selector schema.
        The subscription gets an id unique for the subscriber; a subscriber may hold several
        per topic, and subscribing again with the same selector and link renews that one
        (§4.5 step 5.2) under its id.
        `claim`: runs once every check has passed and before anything is recorded — the caller
        claims the link there, so that a claim that fails records nothing and no delivery can
        reach the link before its owner's reset. `activate=False`: recorded, but the fan-out
        does not see it until the caller passes it to `activate` (a snapshot subscription: the
        caller queues the snapshot and activates in one event-loop step, robust-binding §9)."""
        self._check(originator, "pubsub:subscribe", topic)
        described = self._existing(topic)
        if topic in (SUBSCRIPTIONS_TOPIC, NOTIFY_TOPIC) and subscriber != originator:
            # §6.3.1: each endpoint reads its own subscriptions, nobody another's
            raise AccessDenied(f"{originator} may not read the subscriptions of {subscriber}")
        if duration_s <= 0:
            raise InvalidParameter(f"duration must be positive, not {duration_s}")
        if duration_s > MAX_DURATION_S:
            raise InvalidParameter(f"duration exceeds {MAX_DURATION_S} seconds")
        link_id = None if link is None else validate_link_id(link)
        compiled = None
        if selector_class is not None:
            compiled = self.compile_selector(described, selector_class, selector or "")
            selector = selector or ""
        via = self._redistributor(topic, subscriber)
        if via is not None:
            return Forward(via)
        if claim is not None:
            claim()
        now = self._clock()
        with self._lock:
            same = [s for s in self._table.of_topic(topic)
                    if s.subscriber == subscriber and s.link_id == link_id
                    and s.selector_class == selector_class and s.selector == selector]
            sub_id = same[0].subscription_id if same else self._new_id(subscriber)
        sub = Subscription(subscriber=subscriber, subscription_id=sub_id, topic=topic,
                           duration_s=duration_s, state=SubscriptionState.ACTIVE,
                           created_at=now, expires_at=now + duration_s * 1000,
                           originator=originator, trans_id=trans_id, link_id=link_id,
                           selector_class=selector_class, selector=selector)
        self.core.subscriptions.put(sub)
        self.access.grant_subscriber(topic, subscriber)
        if activate:
            self._remember(sub, compiled)
        log.info("subscribed", topic=topic, subscriber=subscriber, duration_s=duration_s,
                 subscription_id=sub_id, selector_class=selector_class)
        return sub

    def compile_selector(self, topic: Topic, selector_class: str, text: str) -> Selector:
        """`text` compiled for `topic`: 566 for a class this broker does not have or the
        topic's selector schema does not list, 567 for a selector that does not parse or does
        not fit the schema (`selector_check`, broker/pubsub/schemas.py)."""
        compiled = selectors.compile(selector_class, text)
        check = self.selector_check
        return compiled if check is None else check(topic, compiled)

    def _new_id(self, subscriber: str) -> str:
        """The next subscription id of `subscriber` (under the lock): numbers from 1, never
        one it holds; after a restart they go on above the highest it holds."""
        number = self._last_id.get(subscriber, 0) + 1
        self._last_id[subscriber] = number
        return str(number)

    def activate(self, sub: Subscription) -> None:
        """Make a subscription recorded with `subscribe(..., activate=False)` visible to the
        fan-out (`recipient_links`) and to expiry."""
        self._restore(sub)

    def check_snapshot(self, originator: str, topic: str) -> None:
        """May `originator` have the current state of `topic`'s items (robust-binding §9)?
        537 without pubsub:subscribe on it (a snapshot reads what a subscription would), 550
        for a topic this domain does not have."""
        self._check(originator, "pubsub:subscribe", topic)
        validate_topic(topic)
        if topic not in self.core.topics and topic not in WELL_KNOWN_TOPICS:
            raise NotTaken(f"no topic {topic!r} at {self.domain}")

    def cancel(self, originator: str, subscriber: str, topic: str | None = None,
               subscription_id: str | None = None) -> list[Subscription] | Forward:
        """§4.6, §5.8.2: the subject's subscription `subscription_id`; without an id, all of
        its subscriptions to `topic`; with neither, all of its subscriptions. 537, 553 (an
        unknown topic), forward to a redistributor of the subject's domain, 568 when nothing
        matches; else returns what ended."""
        self._check(originator, "pubsub:cancel", topic)
        if topic is not None:
            self._existing(topic)
            via = self._redistributor(topic, subscriber)
            if via is not None:
                return Forward(via)
        with self._lock:
            topics = [topic] if topic is not None else self._table.topics()
            ended = [s for t in topics for s in self._table.of_topic(t)
                     if s.subscriber == subscriber
                     and (subscription_id is None or s.subscription_id == subscription_id)]
            for sub in ended:
                self._table.remove(sub.topic, _key(sub))
        if not ended:
            what = "" if subscription_id is None else f" {subscription_id}"
            where = "" if topic is None else f" to topic {topic!r}"
            raise UnknownSubscription(f"{subscriber} has no subscription{what}{where}")
        for sub in ended:
            self._drop(sub)
            log.info("cancelled", topic=sub.topic, subscriber=subscriber, by=originator,
                     subscription_id=sub.subscription_id)
        return ended

    def selection(self, sub: Subscription) -> Callable[[JournalEntry], bool] | None:
        """Which entries `sub`'s selector takes, from their stored fields (its cached messages
        and snapshot go through it, content-based §5.8); None: it has none, it takes all."""
        if sub.selector_class is None:
            return None
        compiled = selectors.compile(sub.selector_class, sub.selector or "")
        topic = self.core.topics.get(sub.topic)
        if topic is not None and self.selector_check is not None:
            compiled = self.selector_check(topic, compiled)
        return lambda entry: compiled.matches_fields(entry.fields)

    def _restore(self, sub: Subscription) -> None:
        """A recorded subscription back in the table (a restart, or `activate`)."""
        compiled = None
        if sub.selector_class is not None:
            try:
                topic = self.core.topics.get(sub.topic)
                compiled = selectors.compile(sub.selector_class, sub.selector or "")
                if topic is not None and self.selector_check is not None:
                    compiled = self.selector_check(topic, compiled)
            except ApexpsError as exc:  # accepted once; refused by a stricter engine now
                log.warning("recorded selector no longer compiles; subscription left out",
                            subscriber=sub.subscriber, subscription_id=sub.subscription_id,
                            error=str(exc))
                return
        self._remember(sub, compiled)

    def _remember(self, sub: Subscription, compiled: Selector | None) -> None:
        with self._lock:
            self._table.add(sub, compiled)
            if sub.subscription_id.isdigit():
                number = int(sub.subscription_id)
                if number > self._last_id.get(sub.subscriber, 0):
                    self._last_id[sub.subscriber] = number
            if sub.expires_at is not None:
                heapq.heappush(self._expiries, (sub.expires_at, sub.topic, _key(sub)))

    def _drop(self, sub: Subscription) -> None:
        self.core.subscriptions.delete(sub.key)
        with self._lock:
            still = any(s.subscriber == sub.subscriber for s in self._table.of_topic(sub.topic))
        if not still:  # its last subscription to the topic
            self.access.revoke_subscriber(sub.topic, sub.subscriber)

    def next_expiry(self) -> int | None:
        """When (ms) the earliest subscription runs out, if any does."""
        with self._lock:
            return self._expiries[0][0] if self._expiries else None

    def expire_due(self, now: int | None = None) -> list[Subscription]:
        """Remove every subscription whose duration has run out; return them (for the cancel)."""
        now = self._clock() if now is None else now
        due: list[Subscription] = []
        with self._lock:
            while self._expiries and self._expiries[0][0] <= now:
                at, topic, key = heapq.heappop(self._expiries)
                sub = self._table.get(topic, key)
                if sub is not None and sub.expires_at == at:  # not renewed meanwhile
                    self._table.remove(topic, key)
                    due.append(sub)
        for sub in due:
            self._drop(sub)
            log.info("subscription expired", topic=sub.topic, subscriber=sub.subscriber,
                     subscription_id=sub.subscription_id)
        return due

    # --- publishing -------------------------------------------------------------------

    def accept(self, originator: str, topic: str, content: bytes, content_type: str,
               options: Mapping[str, str] | None = None, *,
               publish_type: PublishType = PublishType.UPDATE, message_id: str | None = None,
               permission_token: str | None = None,
               publisher_seq: int | None = None) -> Publication:
        """§4.7.1 step 1 (550 for an unknown topic) after the `core:data` check (537).
        The keywords are what the publisher said of the message (its publish type, data item,
        permission token and own seq), journaled with it. 553 for a message that would take its
        data item past the item store's limits (broker/robust/items.py: send an image). 537 on
        a well-known topic: only the service publishes there (content-based §6)."""
        self._check(originator, "core:data", topic)
        if topic in WELL_KNOWN_TOPICS:
            raise AccessDenied(f"{topic} is published by the service alone")
        described = self.core.topics.get(topic)
        if described is None:
            raise NotTaken(f"no topic {topic!r} at {self.domain}")
        validate = self.message_validator
        try:
            if described.message_schema is not None and not is_xml(content_type):
                raise MessageNotConforming(f"topic {topic!r} has a message schema: its"
                                           f" messages are XML, not {content_type!r}")
            got = ingest(content, content_type, topic=topic, publisher=originator,
                         now=self._clock(), schema=self._selector_schema(described),
                         validate=None if validate is None else partial(validate, described),
                         message_id=message_id)
        except InvalidMessage as exc:
            log.info("publication refused", topic=topic, publisher=originator,
                     code=int(exc.code), reason=str(exc))
            raise
        if got.message_id is not None:
            self.core.items.check_publish(topic, got.message_id, publish_type, len(content))
        return Publication(topic=topic, source=originator, content=content,
                           content_type=content_type, options=dict(options or {}),
                           publish_type=publish_type, message_id=got.message_id,
                           revision_id=got.revision_id, publication_date=got.publication_date,
                           expiration_date=got.expiration_date, fields=got.fields,
                           permission_token=permission_token, publisher_seq=publisher_seq)

    def _selector_schema(self, topic: Topic) -> SelectorSchema | None:
        """The names ingest keeps in `fields`: the topic's selector schema, or §5.5.1's default
        (its message schema and the headers); None, every field, when neither names any."""
        found = schemas.TopicSchemas.of(topic).selector
        return found if found is not None and found.types else None

    def entitled(self, entry: JournalEntry, subscriber: str, *, live: bool = False) -> bool:
        """May `subscriber` receive `entry` now? Not once it has expired (broker/expiry.py;
        `live`: the live fan-out asks, where an expiration of `0` still goes), not if its
        permission token (XEP-0040 §5.1) is not granted to the subscriber or is denied
        (broker/entitlements.py), and on WKT=Subscriptions only if it describes one of the
        subscriber's own subscriptions (content-based §6.3.1); on WKT=Notify only if it is
        addressed to the subscriber (docs/event-binding.md §5)."""
        exp = entry.expiration_date
        if exp is not None and expired(exp, self._clock(), live=live):
            return False
        if entry.topic in (SUBSCRIPTIONS_TOPIC, NOTIFY_TOPIC) and not wkt.is_own(entry,
                                                                                subscriber):
            return False  # a Notify is its subscriber's alone, too (event-binding.md §5)
        token = entry.permission_token
        return token is None or self.access.token_allowed(subscriber, token, entry.topic)

    def recipients(self, topic: str, now: int | None = None) -> list[str]:
        """Subscribers whose subscription to `topic` is active now (§4.7.1 step 2)."""
        now = self._clock() if now is None else now
        with self._lock:
            return list(dict.fromkeys(s.subscriber for s in self._table.of_topic(topic)
                                      if s.expires_at is None or s.expires_at > now))

    def recipients_for(self, entry: JournalEntry, now: int | None = None,
                       ) -> list[tuple[str, tuple[str, ...] | None]]:
        """Each subscriber `entry` goes to on the plain (unsequenced) path, once, with the
        InRe ids it satisfied (None: leave InRe out)."""
        now = self._clock() if now is None else now
        with self._lock:
            return self._recipients_for(entry, now)

    def _recipients_for(self, entry: JournalEntry, now: int,
                        ) -> list[tuple[str, tuple[str, ...] | None]]:
        """`recipients_for`, the caller holding the lock."""
        out: dict[str, tuple[str, ...] | None] = {}
        for who, link in self._table.deliveries(entry, now):
            ids = self._table.in_re(entry, who, link, now)
            if who in out:  # two links of one subscriber: one data, every id
                ids = tuple(dict.fromkeys((*(out[who] or ()), *(ids or ()))))
            out[who] = ids
        return list(out.items())

    def recipients_for_many(self, entries: Sequence[JournalEntry], now: int | None = None,
                            ) -> list[list[tuple[str, tuple[str, ...] | None]]]:
        """`recipients_for` of each entry of a batch, under one lock and one clock reading."""
        now = self._clock() if now is None else now
        with self._lock:
            return [self._recipients_for(entry, now) for entry in entries]

    def recipient_links(self, topic: str, now: int | None = None) -> list[tuple[str, str]]:
        """(subscriber, link) of each subscription to `topic` active now."""
        now = self._clock() if now is None else now
        with self._lock:
            return list(dict.fromkeys((s.subscriber, link_of(s))
                                      for s in self._table.of_topic(topic)
                                      if s.expires_at is None or s.expires_at > now))

    def recipient_links_for(self, entry: JournalEntry, now: int | None = None,
                            ) -> Sequence[tuple[str, str]]:
        """(subscriber, link) of each endpoint and link `entry` goes to: its subscriptions
        without a selector and those whose selector it satisfies, from the journal record's
        stored fields, one pair however many it satisfies (§5.10). What the fan-out asks once
        per message: a shared tuple for a topic without selectors (not a copy)."""
        now = self._clock() if now is None else now
        with self._lock:
            return self._table.deliveries(entry, now)

    def in_re(self, entry: JournalEntry, who: str, link: str, now: int | None = None,
              ) -> tuple[str, ...] | None:
        """The ids of `who`'s subscriptions on `link` that `entry` satisfies, for the InRe
        option (§5.10.1); None where InRe says nothing (the pair's one plain subscription)."""
        if self._table.quiet(entry.topic):  # asked per delivery: the common case, unlocked
            return None
        now = self._clock() if now is None else now
        with self._lock:
            return self._table.in_re(entry, who, link, now)

    def wants(self, link: str, entry: JournalEntry, now: int | None = None) -> bool:
        """Whether an active subscription travelling on `link` takes `entry` (a repair's
        catch-up carries only those)."""
        now = self._clock() if now is None else now
        with self._lock:
            return self._table.wants(link, entry, now)

    def link_topics(self, link: str, now: int | None = None) -> dict[str, str]:
        """Topic -> subscriber of each subscription active now that travels on `link`: what a
        source repair of the link resends (docs/robust-binding.md §5.2)."""
        now = self._clock() if now is None else now
        with self._lock:
            return {s.topic: s.subscriber for s in self._table.all()
                    if link_of(s) == link and (s.expires_at is None or s.expires_at > now)}

    def links_of_subscribers(self) -> dict[str, str]:
        """Every link an active subscription travels on -> its subscriber (for heartbeats)."""
        with self._lock:
            return {link_of(s): s.subscriber for s in self._table.all()}

    def subscriptions(self, topic: str | None = None,
                      subscriber: str | None = None) -> list[Subscription]:
        with self._lock:
            subs = self._table.of_topic(topic) if topic else list(self._table.all())
        return [s for s in subs if subscriber is None or s.subscriber == subscriber]


def _key(sub: Subscription) -> Key:
    return (sub.subscriber, sub.subscription_id)


def _check_selector(topic: Topic, selector: Selector) -> Selector:
    return check_selector(selector, TopicSchemas.of(topic))
