"""The apex=pubsub service: topics, subscriptions and forwarding over the journal."""

from __future__ import annotations

from .follower import JournalFollower
from .service import MAX_DURATION_S, AccessPolicy, Forward, PubsubService, redistributor_local

__all__ = [
    "MAX_DURATION_S",
    "AccessPolicy",
    "Forward",
    "JournalFollower",
    "PubsubService",
    "redistributor_local",
]
