"""Who could see one message: `apexps audit --message SOURCE:SEQ`.

For the message (source, source seq), every subscription to its topic with the replayed
decision at its append (broker/spark/audit/decisions.py): entitled or, if not, why (not active
then, the token withheld, the selector), and whether and when its link carried it (first live
delivery: link seq, epoch, when recorded). Deliveries of the message on links no subscription
to its topic travels on are listed too, as not entitled.
"""

from __future__ import annotations

from typing import Any

from broker.spark.audit.job import Audit

__all__ = ["MESSAGE_COLUMNS", "parse_message", "who_could_see"]

DataFrame = Any

MESSAGE_COLUMNS = ("subscriber", "subscription", "link", "entitled", "why_not", "carried",
                   "link_seq", "epoch", "carried_at_ms", "latency_ms")


def parse_message(text: str) -> tuple[str, int]:
    """`SOURCE:SEQ` (the source may itself hold colons: the seq is after the last one).

    Raises:
        ValueError: not of that form, with the text in the message.
    """
    source, sep, seq = text.rpartition(":")
    if not sep or not source or not seq.isdigit() or int(seq) < 1:
        raise ValueError(f"{text!r} is not SOURCE:SEQ (a source endpoint, a colon and a "
                         "source seq of 1 or more, e.g. fred@example.com:42)")
    return source, int(seq)


def who_could_see(result: Audit, source: str, seq: int) -> list[dict[str, Any]]:
    """One row per subscription to the message's topic, then per other link that carried it;
    keys MESSAGE_COLUMNS. Empty when the window does not hold the message."""
    from pyspark.sql import functions as F

    mine = (F.col("source") == source) & (F.col("source_seq") == seq)
    carried = {r["link"]: r for r in result.judged.filter(mine).collect()}
    rows: list[dict[str, Any]] = []
    for p in result.pairs.filter(mine).orderBy("subscriber", "label").collect():
        c: Any = carried.get(p["link"])
        on = bool(c is not None and c["is_carried"])
        why = None if p["want"] else ", ".join(
            w for w, bad in (("not active then", not p["in_life"]),
                             ("token withheld", not p["allowed"]),
                             ("selector does not match", not p["selected"])) if bad)
        rows.append({
            "subscriber": p["subscriber"], "subscription": p["label"], "link": p["link"],
            "entitled": bool(p["want"]), "why_not": why, "carried": bool(on),
            "link_seq": c["link_seq"] if on else None, "epoch": c["epoch"] if on else None,
            "carried_at_ms": c["rec_ms"] if on else None,
            "latency_ms": c["rec_ms"] - p["at_ms"] if on else None})
    for u in result.unpaired.filter(mine).collect():
        rows.append({"subscriber": None, "subscription": None, "link": u["link"],
                     "entitled": False, "why_not": "no subscription to its topic on the link",
                     "carried": True, "link_seq": u["link_seq"], "epoch": None,
                     "carried_at_ms": u["at_ms"], "latency_ms": None})
    return rows
