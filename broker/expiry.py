"""Expiration and revisions of content-based messages (draft §5.2.1): pure rules, no clock.

Theory of operation
-------------------
A message's `expiration-date` header is one of three things (the journal keeps the header's
text as it was published, `JournalEntry.expiration_date`):

- absent or `*`: the message never expires;
- `0`: "distributed once and then immediately expires" — apexps reads that as: it goes to the
  subscribers the live fan-out finds when it forwards the message, and to nobody after that. It
  is never cached, never snapshotted, and a gap fill or source repair that reaches it finds it
  expired;
- a §4 date-time (`2003-03-15T12:15:00-08:00`, `Z`; without an offset it is UTC, as the
  ingest reads it): the message is valid until that instant, expired at and after it (the
  draft: "the date after which the message will no longer be valid" — apexps takes the instant
  itself as already expired, so a message published with its own publication date as
  expiration is never delivered).

`expired(text, now, live=...)` is the whole decision: time comes in as `now` (epoch
milliseconds, the service's clock port), so the rule is tested without a clock. Everything that
hands a journaled message to somebody asks it — the live fan-out (`live=True`), the gap fill
(an expired seq goes as a stamp without content, docs/robust-binding.md §2.4), the source
repair's catch-up, snapshots and cached messages — through `PubsubService.entitled`.

A header that does not parse is refused at publication by the ingest (broker/pubsub/ingest.py,
561), so the journal never holds one; should one be there anyway (an older writer), `expired`
treats it as never expiring rather than lose a message over a header it cannot read. The date
is read here as the ingest reads it (`datetime.fromisoformat`, naive means UTC); this module
cannot import the ingest (the item store below the service imports it), so the two are held
together by tests/broker/test_expiry.py.

Revisions (`parse_revision`): non-negative integers up to 2,147,483,647 (§5.2.1 by reference to
the APEX numbering scheme); a revision replaces a cached message only if it is strictly higher
(`supersedes`). Equal revisions do not replace: the draft asks for "a higher revision number",
and a copy of the same revision published twice is the same message, so the first one stays.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

from common.errors import InvalidParameter

__all__ = [
    "MAX_REVISION",
    "NEVER",
    "ONCE",
    "expired",
    "expires_at",
    "parse_revision",
    "supersedes",
]

#: The expiration-date that means "never".
NEVER = "*"
#: The expiration-date that means "to the current subscribers, once".
ONCE = "0"
#: §5.2.1: revisions are within 0..2,147,483,647.
MAX_REVISION = 2_147_483_647
#: Expiration headers longer than this are not a date-time (a cap on what is parsed).
_MAX_DATE_LEN = 64


@lru_cache(maxsize=4096)
def _instant(text: str) -> int:
    """Epoch milliseconds of a §4 date-time (naive: UTC); ValueError otherwise."""
    if len(text) > _MAX_DATE_LEN:
        raise ValueError("not a date-time")
    when = datetime.fromisoformat(text.strip())
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def expires_at(text: str | None) -> int | None:
    """When (epoch ms) a message with this header expires; None: never, or only once
    forwarded (`0`), or unreadable."""
    if text is None or text in (NEVER, ONCE):
        return None
    try:
        return _instant(text)
    except ValueError:
        return None


def expired(text: str | None, now: int, *, live: bool = False) -> bool:
    """Has a message with expiration header `text` expired at `now` (epoch ms)? `live`: the
    question is the live fan-out's, forwarding it for the first time (where `0` still goes)."""
    if text is None or text == NEVER:
        return False
    if text == ONCE:
        return not live
    at = expires_at(text)
    return at is not None and at <= now


def parse_revision(text: str | None) -> int | None:
    """The revision as a number; None if absent. InvalidParameter (553) if it is not an
    integer in 0..MAX_REVISION."""
    if text is None:
        return None
    value = text.strip()
    if not value.isdigit() or len(value) > 10 or int(value) > MAX_REVISION:
        raise InvalidParameter(f"revision-id {value[:20]!r} is not an integer in"
                               f" 0..{MAX_REVISION}")
    return int(value)


def supersedes(new: int | None, current: int | None) -> bool:
    """Does a message of revision `new` replace a cached one of revision `current`? A message
    without a revision is not a revision (the publish type decides, robust-binding §9.1);
    anything replaces a message that had none."""
    if new is None:
        return False
    return current is None or new > current
