"""APEX pubsub topic names, validated once at the edge of the domain.

The pubsub draft (§6.1 `%TOPIC;`) gives `[a-z][a-z0-9.-_]*` — read literally that class is the
range `.` to `_`, which admits `/`, `@`, `<` and `=`; the evident intent is dotted lowercase
words (`finance.vc.findandflip`, `music.jazz.milesdavis`). apexps accepts that intent, plus
upper case (the content-based draft's own `WKT=Topics` is mixed case) and `-`/`_` inside words:

    name     = word *("." word)          ; at most 255 characters, case-sensitive
    word     = ALPHA *(ALPHA / DIGIT / "-" / "_")   ; the first word starts with a letter,
                                                    ; later words may start with a digit
    reserved = "WKT=" name               ; only the registered well-known topics

`/` and `@` are excluded on purpose: a topic is the subaddress of `apex=pubsub/TOPIC@domain`,
and either character would make that endpoint ambiguous. Topics are not Kafka topics (every
topic shares the journal), so Kafka's own naming rules do not constrain them.
"""

from __future__ import annotations

import re

from common.errors import InvalidTopicName

__all__ = [
    "DEFAULT_HOPS",
    "MAX_TOPIC_LEN",
    "NOTIFY_TOPIC",
    "REPORT_SERVICE",
    "SERVICE",
    "WELL_KNOWN_TOPICS",
    "validate_topic",
]

#: The pubsub service's well-known endpoint (local part): data to `apex=pubsub@D` manages, data
#: to `apex=pubsub/TOPIC@D` publishes (draft-schwartz-apex-pubsub §4).
SERVICE = "apex=pubsub"
#: RFC 3340 §6.2: the report service's well-known endpoint (local part).
REPORT_SERVICE = "apex=report"
#: RFC 3342 §4 / draft §3: forwarded data carries a hop limit so a loop between pubsub servers
#: ends; a publication that arrives with one keeps what is left of it.
DEFAULT_HOPS = 8

MAX_TOPIC_LEN = 255
#: Content-based pubsub §6: the two well-known topics this broker serves itself.
#: The topic the service journals resource Notifies on (docs/event-binding.md §5): apexps's,
#: not the content-based draft's; each Notify reaches only the subscriber it is addressed to.
NOTIFY_TOPIC = "WKT=Notify"
WELL_KNOWN_TOPICS = frozenset({"WKT=Topics", "WKT=Subscriptions", NOTIFY_TOPIC})

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*(?:\.[A-Za-z0-9][A-Za-z0-9_-]*)*")


def validate_topic(name: object, *, allow_well_known: bool = True) -> str:
    """Return `name` if it is an acceptable topic name, else raise InvalidTopicName (553)."""
    if not isinstance(name, str):
        raise InvalidTopicName(f"a topic name is text, not {type(name).__name__}")
    if not name:
        raise InvalidTopicName("the topic name is empty")
    if len(name) > MAX_TOPIC_LEN:
        raise InvalidTopicName(f"the topic name is longer than {MAX_TOPIC_LEN} characters")
    if name.startswith("WKT="):
        if name in WELL_KNOWN_TOPICS and allow_well_known:
            return name
        raise InvalidTopicName(
            f"{name!r}: the WKT= prefix is reserved for the registered well-known topics "
            f"({', '.join(sorted(WELL_KNOWN_TOPICS))})"
        )
    if _NAME.fullmatch(name) is None:
        raise InvalidTopicName(
            f"{name!r} is not a topic name: use dot-separated words of letters, digits, "
            "'-' and '_', starting with a letter (e.g. music.jazz.milesdavis)"
        )
    return name
