"""Subscriptions' lifetimes and permission-token answers over time, from the registries' history.

Theory of operation
-------------------
The subscriptions and access topics are compacted registries: what the audit can read is each
key's surviving records, in offset order, with their Kafka timestamps. Both are small (one
record per subscription or entry change), so they are collected to the driver and walked in
Python; what comes out is handed to the Spark side as small frames.

Lifetimes. A subscription is visible to the fan-out while its ACTIVE record is the newest of
its key (broker/pubsub/service.py); a cancel or an expiry deletes the key (a tombstone), a
record in another state ends it too. So walking a key's records: an ACTIVE record opens a
lifetime at its `created_at` (a renewal while open keeps the start and moves the expiry); the
fan-out sees it once that record is durable (its Kafka timestamp: `visible_ms`); the lifetime
ends at the first of its `expires_at` and the Kafka timestamp of the record that closed it.
Compaction may have removed a key's older records: then the lifetime starts at the oldest
surviving record's `created_at`, which is the subscription's own start (a renewal
rewrites it, so a renewed subscription's start is the renewal's: the audit then expects less,
never more). A subscription whose every record is gone is invisible to the audit: docs/audit.md.

Permission tokens. The live decision is `broker.entitlements.EntitlementIndex.allowed` over the
broker's view of the access registry; the audit replays the same index over the registry's
records in Kafka-timestamp order, so its answer is the live rule's answer, computed by the
live code. For each (subscriber, topic, token) the job needs, the answer is a list of intervals
`[from_ms, to_ms)` with their verdict (consecutive equal verdicts merged, so an interval's edge
is a time when the answer changed). Before the registry's first record nothing is granted, as
live. The broker applies a change when its follower sees it, a little after the record's
timestamp: docs/audit.md says how the audit treats messages near such an edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.entitlements import EntitlementIndex
from broker.records import AccessEntry, to_ms

__all__ = ["FOREVER", "Lifetime", "entitlement_intervals", "lifetimes"]

#: An open end, as a number Spark compares like any other (year 2286).
FOREVER = 10**13


@dataclass(frozen=True, slots=True)
class Lifetime:
    """One span of one subscription: when the fan-out could see it and where it travelled."""

    label: str  # subscriber/subscription_id
    subscriber: str
    subscription_id: str
    topic: str
    link: str
    selector_class: str | None
    selector: str | None
    start_ms: int  # its created_at
    visible_ms: int  # when the record that opened it was durable (the fan-out sees it after)
    end_ms: int  # FOREVER when nothing ended it


def _ms(value: Any) -> int | None:
    return to_ms(value) if value is not None else None


def _order(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(rows, key=lambda r: (r["kafka_timestamp"], r["kafka_partition"],
                                       r["kafka_offset"]))


def lifetimes(rows: Iterable[Mapping[str, Any]]) -> list[Lifetime]:
    """The lifetimes the subscription registry's records show (see the module doc). `rows`:
    decoded records of `broker.spark.readers.decode_subscriptions`, without decode errors."""
    out: list[Lifetime] = []
    # key -> (record, start, visible, end)
    open_: dict[str, tuple[Mapping[str, Any], int, int, int]] = {}

    def close(key: str, at: int) -> None:
        rec, start, visible, end = open_.pop(key)
        subscriber = rec["subscriber"]
        out.append(Lifetime(
            label=f"{subscriber}/{rec['subscription_id']}", subscriber=subscriber,
            subscription_id=rec["subscription_id"], topic=rec["topic"],
            link=rec["link_id"] or subscriber,  # broker.robust.linkid.default_link_id
            selector_class=rec["selector_class"], selector=rec["selector"],
            start_ms=start, visible_ms=visible, end_ms=min(end, at)))

    for r in _order(rows):
        key = r["kafka_key"]
        at = _ms(r["kafka_timestamp"]) or 0
        if not r["deleted"] and r["state"] == "active":
            expires = _ms(r["expires_at"])
            end = FOREVER if expires is None else expires
            if key in open_:
                _, start, visible, _ = open_[key]
            else:
                start, visible = _ms(r["created_at"]) or at, at
            open_[key] = (r, start, max(start, visible), end)
        elif key in open_:
            close(key, at)
    for key in list(open_):
        close(key, FOREVER)
    return out


Triple = tuple[str, str, str]  # (subscriber, topic, token)


def entitlement_intervals(access_rows: Iterable[Mapping[str, Any]], needed: Iterable[Triple],
                          ) -> list[tuple[str, str, str, int, int, bool]]:
    """(subscriber, topic, token, from_ms, to_ms, allowed) covering all time for every triple
    in `needed` (see the module doc). `access_rows`: decoded access records with their keys."""
    triples = sorted(set(needed))
    index = EntitlementIndex()
    current: dict[Triple, tuple[int, bool]] = dict.fromkeys(triples, (0, False))
    out: list[tuple[str, str, str, int, int, bool]] = []

    def settle(at: int) -> None:
        for t in triples:
            since, verdict = current[t]
            now = index.allowed(t[0], t[2], t[1])
            if now != verdict:
                out.append((*t, since, at, verdict))
                current[t] = (at, now)

    rows = _order(access_rows)
    for i, r in enumerate(rows):
        entry = None
        if not r["deleted"] and r["kind"] == "permtoken":
            entry = AccessEntry.from_avro({k: r[k] for k in (
                "entry_id", "originator", "tokens", "topic", "effect", "created_at", "kind")})
        index.replace(r["kafka_key"], entry)
        at = _ms(r["kafka_timestamp"]) or 0
        # Records of one instant are one change: settle after the last of them.
        if i + 1 == len(rows) or (_ms(rows[i + 1]["kafka_timestamp"]) or 0) != at:
            settle(at)
    for t in triples:
        since, verdict = current[t]
        out.append((*t, since, FOREVER, verdict))
    return out
