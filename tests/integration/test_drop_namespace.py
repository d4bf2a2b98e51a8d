"""`drop_namespace` deletes a throwaway namespace's topics (the tests' fixture and the
benchmarks call it after each run), and only that namespace's. Real Kafka."""

from __future__ import annotations

import time
import uuid

import pytest

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, drop_namespace, existing_topics

pytestmark = [pytest.mark.kafka]


def test_drop_namespace_deletes_its_topics_and_no_others(kafka_bootstrap: str) -> None:
    gone, kept = (KafkaConfig(bootstrap=kafka_bootstrap, namespace=f"x{uuid.uuid4().hex[:12]}")
                  for _ in range(2))
    for config in (gone, kept):
        core = BrokerCore(config)
        core.open()
        core.close()
    made = {t for t in existing_topics(gone) if t.startswith(gone.namespace)}
    assert made and drop_namespace(gone, wait=True) == len(made)
    # deleted means the controller deleted them; the broker's metadata follows within moments
    deadline = time.monotonic() + 30
    left = existing_topics(gone)
    while {t for t in left if t.startswith(gone.namespace)}:
        assert time.monotonic() < deadline, "the namespace's topics are still listed"
        time.sleep(0.2)  # metadata has no event to await
        left = existing_topics(gone)
    assert {t for t in left if t.startswith(kept.namespace)}  # another namespace untouched
    assert drop_namespace(kept, wait=True) > 0
