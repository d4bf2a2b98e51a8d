"""broker/pubsub/wkt.py: the well-known topics' messages (content-based draft §6), without Kafka:
rising revisions, messages the ingest reads back as they were meant, and the privacy rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from broker.kafka_io import Position
from broker.pubsub.ingest import ingest
from broker.pubsub.schemas import prepare
from broker.pubsub.wkt import (
    SUBSCRIPTIONS_TOPIC,
    TOPICS_TOPIC,
    Revisions,
    is_own,
    subscription_message,
    topic_message,
)
from broker.records import (
    JournalEntry,
    Publication,
    PublishType,
    RecordKind,
    Subscription,
    SubscriptionState,
    Topic,
)

NOW = 1_795_644_115_123
SERVICE = "apex=pubsub@example.com"
SUB = Subscription(subscriber="jade@example.com", subscription_id="7", topic="q.one",
                   duration_s=600, state=SubscriptionState.ACTIVE, created_at=NOW,
                   selector_class="JMS", selector="net-change-pct > 5.0 AND a < b")


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(-10_000_000, 10_000_000)),
                max_size=40),
       st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 1 << 31)), max_size=5))
def test_revisions_rise_per_id_whatever_the_clock_does(steps: list[tuple[str, int]],
                                                       seen: list[tuple[str, int]]) -> None:
    """Each id's revisions rise strictly, past any revision already published, even when
    the clock stands still or goes back."""
    revs = Revisions()
    last: dict[str, int] = {}
    for mid, rev in seen:
        revs.seen(TOPICS_TOPIC, mid, min(rev, 2_147_483_646))
        last[mid] = max(last.get(mid, -1), min(rev, 2_147_483_646))
    for mid, jitter in steps:
        got = revs.next(TOPICS_TOPIC, mid, NOW + jitter)
        assert got > last.get(mid, -1) or got == 2_147_483_647
        assert 0 <= got <= 2_147_483_647
        last[mid] = got


def _ingested(pub: Publication) -> dict[str, object]:
    got = ingest(pub.content, "application/xml", topic=pub.topic, publisher=SERVICE, now=0)
    return {"message_id": got.message_id, "revision_id": got.revision_id,
            "expiration_date": got.expiration_date, "publication_date": got.publication_date,
            "fields": got.fields}


def test_a_topic_message_says_what_its_record_says() -> None:
    """The content's headers are the record's (the ingest reads them back alike)."""
    created = topic_message(Topic("q.<one>", NOW, owner="admin@example.com"), service=SERVICE,
                            revision=12, now_ms=NOW, content_type="application/beep+xml")
    got = _ingested(created)
    assert (got["message_id"], got["revision_id"], got["expiration_date"]) == (
        "q.<one>", "12", "*")
    assert got["publication_date"] == NOW
    fields = got["fields"]
    assert isinstance(fields, dict)
    assert fields["topic-name"] == ["q.<one>"] and fields["disposition"] == ["publish"]
    assert created.publish_type is PublishType.UPDATE and created.source == SERVICE
    gone = topic_message("q.<one>", service=SERVICE, revision=13, now_ms=NOW,
                         content_type="application/beep+xml")
    assert gone.publish_type is PublishType.DROP and gone.message_id == "q.<one>"
    assert _ingested(gone)["fields"]["disposition"] == ["cancel"]  # type: ignore[index]


def test_a_subscription_message_carries_the_drafts_elements() -> None:
    """§6.3: subscriber, id, topic, selector, date, duration, status; ended: a drop with a
    reason."""
    active = subscription_message(SUB, service=SERVICE, revision=1, now_ms=NOW,
                                  content_type="application/beep+xml")
    fields = _ingested(active)["fields"]
    assert isinstance(fields, dict)
    assert fields["subscriber"] == ["jade@example.com"]
    assert fields["subscription-id"] == ["7"] and fields["topic-name"] == ["q.one"]
    assert fields["selector"] == ["net-change-pct > 5.0 AND a < b"]
    assert fields["class"] == ["JMS"] and fields["duration"] == ["600"]
    assert fields["current-status"] == ["ACTIVE"]
    assert active.fields == fields  # what the ingest would have stored
    ended = subscription_message(SUB, service=SERVICE, revision=2, now_ms=NOW,
                                 content_type="application/beep+xml", ended="expired")
    assert ended.publish_type is PublishType.DROP
    assert _ingested(ended)["fields"]["reason"] == ["expired"]  # type: ignore[index]


def test_only_the_subscriber_itself_sees_a_subscription_message() -> None:
    """§6.3.1's default selector: subscriber = the receiving endpoint, exactly."""
    pub = subscription_message(SUB, service=SERVICE, revision=1, now_ms=NOW,
                               content_type="application/beep+xml")
    entry = JournalEntry(
        position=Position(0, 0), kind=RecordKind.DATA, topic=SUBSCRIPTIONS_TOPIC,
        source=SERVICE, source_seq=1, gap_to=None, gap_reason=None,
        publish_type=pub.publish_type, publisher_seq=None, message_id=pub.message_id,
        revision_id=pub.revision_id, publication_date=NOW, expiration_date="*",
        permission_token=None, content_type=pub.content_type, content=pub.content,
        fields={k: list(v) for k, v in pub.fields.items()}, options={}, appended_at=NOW)
    assert is_own(entry, "jade@example.com")
    for other in ("fred@example.com", "JADE@example.com", "jade@example.com.evil", ""):
        assert not is_own(entry, other)


def test_a_topic_message_carries_the_topics_schemas() -> None:
    """§6.2: the message schema and each selector schema with its class; without a selector
    schema, §5.5.1's default offered to both classes."""
    xs = "xmlns:xs='http://www.w3.org/2001/XMLSchema'"
    message, selector = prepare(
        f"<message-schema><xs:schema {xs}><xs:element name='q' type='xs:string'/></xs:schema>"
        "</message-schema>",
        [f"<selector-schema class='JMS' {xs}><xs:attribute name='symbol' type='xs:string'/>"
         "</selector-schema>", "<selector-schema class='RFC-2254' />"])
    topic = Topic("q.s", NOW, owner="admin@example.com", description="quotes & more",
                  message_schema=message, selector_schema=selector)
    pub = topic_message(topic, service=SERVICE, revision=1, now_ms=NOW,
                        content_type="application/beep+xml")
    root = etree.fromstring(pub.content)
    content = root.find("{http://www.example.com/pubsub}content")
    assert content is not None
    assert [c.tag for c in content] == ["topic-name", "disposition", "publisher", "description",
                                        "message-schema", "selector-schema", "selector-schema"]
    assert content.findtext("description") == "quotes & more"
    assert content[4][0].tag == "{http://www.w3.org/2001/XMLSchema}schema"
    assert [c.get("class") for c in content[5:]] == ["JMS", "RFC-2254"]
    bare = topic_message(Topic("q.b", NOW), service=SERVICE, revision=1, now_ms=NOW,
                         content_type="application/beep+xml")
    tail = etree.fromstring(bare.content).find("{http://www.example.com/pubsub}content")
    assert tail is not None and tail[-1].tag == "selector-schema"
    assert tail[-1].get("class") == "JMS RFC-2254" and len(tail[-1]) == 0
