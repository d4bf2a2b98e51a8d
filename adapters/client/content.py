"""`message_content`: wrap a message body in the draft's `ps:message-content` headers (§5.2).

The content-based draft carries a message's headers in the content itself: the broker reads
message-id, revision-id and expiration-date from there at ingest (broker/pubsub/ingest.py), and
fills in the topic, the publisher (the authenticated originator) and the publication date
itself. So a publisher that wants revisions or expiry sends its body inside this envelope; the
CLI's `publish --revision/--expires` does it for you.
"""

from __future__ import annotations

import re

from broker.pubsub.ingest import MAX_REVISION, parse_date
from common.errors import ParameterSyntaxError

__all__ = ["PS_NAMESPACE", "check_expires", "message_content"]

#: The namespace of the draft's examples; the broker recognizes headers by local name.
PS_NAMESPACE = "http://www.example.com/pubsub"

_DECLARATION = re.compile(rb"^\s*<\?xml[^>]*\?>")


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def check_expires(text: str) -> str:
    """An expiration-date as §5.2.1 allows it: a date-time, `0` (deliver now, never cache) or
    `*` (never expires); ParameterSyntaxError otherwise."""
    if text in ("0", "*"):
        return text
    try:
        parse_date(text, "expiration-date")
    except Exception:
        raise ParameterSyntaxError(
            f"--expires {text[:40]!r} is not an ISO 8601 date-time, 0 or *") from None
    return text


def message_content(body: bytes, *, message_id: str | None = None,
                    revision: int | None = None, expires: str | None = None,
                    publication_date: str | None = None) -> bytes:
    """`body` (one XML element, an XML declaration allowed) inside `ps:message-content` with
    the headers given."""
    if revision is not None and not 0 <= revision <= MAX_REVISION:
        raise ParameterSyntaxError(f"revision is 0..{MAX_REVISION}")
    heads = [("publication-date", publication_date), ("expiration-date",
             None if expires is None else check_expires(expires)),
             ("message-id", message_id),
             ("revision-id", None if revision is None else str(revision))]
    parts = [f"<ps:{name}>{_esc(value)}</ps:{name}>" for name, value in heads
             if value is not None]
    head = f"<ps:message-content xmlns:ps='{PS_NAMESPACE}'>{''.join(parts)}<ps:content>"
    return head.encode() + _DECLARATION.sub(b"", body, count=1) + \
        b"</ps:content></ps:message-content>"
