"""Differential: replay with a selector keeps exactly the messages the Python evaluator accepts.

The journal is real (written by the broker's journal to the shared Kafka): random messages from
tests/selectors/generator.py (repeated elements, attributes, absent names, values picked where
two backends could disagree), some stored with their fields and some with an empty map as live
traffic writes today, plus content the broker would refuse. Selectors of both classes come from
the same generator, seeded by Hypothesis. The Python answer per message is
`Selector.matches_fields` over the map the broker's ingest gives its content (for refused
content: `{}`, a message with no fields)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import selectors
from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.pubsub.ingest import ingest
from broker.records import Publication
from broker.spark.fields import ensure_fields
from broker.spark.journal_reader import load_journal
from broker.spark.replay import replay
from common.errors import InvalidMessage
from tests.selectors.generator import JmsGen, LdapGen, random_message

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

MESSAGES = 120
T0 = 1_764_000_000_000  # every record's publication date (ms): the ingest's clock
REFUSED = [b"<!DOCTYPE q [<!ENTITY e 'x'>]><quote price='&e;'/>", b"<quote><price>5</quote>"]


@pytest.fixture(scope="module", name="corpus")
def _corpus(kafka_bootstrap: str, spark: Any) -> Iterator[tuple[Any, dict[tuple[str, int],
                                                                      bytes]]]:
    """A cached journal of MESSAGES random messages (every third stored with its fields) and
    the refused ones, its fields ensured; and {(source, seq): content}."""
    config = KafkaConfig(bootstrap=kafka_bootstrap, namespace=f"t{uuid.uuid4().hex[:12]}")
    rng = random.Random(19)
    contents = [random_message(rng) for _ in range(MESSAGES)] + REFUSED
    core = BrokerCore(config)
    core.open()
    sent: dict[tuple[str, int], bytes] = {}
    seqs: dict[str, int] = {}
    try:
        for k, content in enumerate(contents):
            source = f"p{k % 4}@example.com"
            fields = _ingested(content, source) if k % 3 == 0 and k < MESSAGES else {}
            core.journal.append_sync(Publication("q.diff", source, content, fields=fields,
                                                 publication_date=T0))
            seqs[source] = seqs.get(source, 0) + 1
            sent[(source, seqs[source])] = content
    finally:
        core.close()
    # Fields ensured once (replay would otherwise run the extraction UDF per example).
    journal = ensure_fields(load_journal(spark, config)).cache()
    assert journal.count() == len(contents)
    yield journal, sent
    journal.unpersist()


def _ingested(content: bytes, source: str) -> dict[str, list[str]]:
    try:
        return ingest(content, "application/xml", topic="q.diff", publisher=source,
                      now=T0).fields
    except InvalidMessage:
        return {}


def _python(selector: selectors.Selector, source: str, content: bytes) -> bool:
    return selector.matches_fields(_ingested(content, source))


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), klass=st.sampled_from(["JMS", "RFC-2254"]))
def test_replay_with_a_selector_is_what_python_accepts(
        corpus: tuple[Any, dict[tuple[str, int], bytes]], seed: int, klass: str) -> None:
    """For a generated selector of either class: the replay's (source, seq)s are exactly those
    whose content the Python evaluator matches, in per-source order."""
    journal, sent = corpus
    rng = random.Random(seed)
    text = JmsGen(rng).cond() if klass == "JMS" else LdapGen(rng).selector()
    selector = selectors.compile(klass, text)
    got = [(r["source"], r["source_seq"]) for r in
           # No record here has an expiration date; leaving the expiry check out saves a
           # Python pass per example.
           replay(journal, topic="q.diff", selector=selector, include_expired=True)
           .select("source", "source_seq").collect()]
    want = sorted(k for k, content in sent.items() if _python(selector, k[0], content))
    assert got == want, text


def test_the_corpus_separates(corpus: tuple[Any, dict[tuple[str, int], bytes]]) -> None:
    """The generated messages are varied enough that selectors keep some and drop some (a
    differential over a corpus every selector keeps whole would prove nothing)."""
    _, sent = corpus
    rng = random.Random(7)
    kept = []
    for _ in range(40):
        sel = selectors.compile("JMS", JmsGen(rng).cond())
        kept.append(sum(_python(sel, k[0], c) for k, c in sent.items()))
    assert sum(0 < n < len(sent) for n in kept) >= 10
