"""Ingest: a published message's headers and selectable fields, from one parse (draft §5.2).

Theory of operation
-------------------
The broker reads a published XML message exactly once, here, as it accepts it, and stores what
selection needs beside the raw content in the journal record: the `ps:message-content` headers
(topic, publisher, publication-date, expiration-date, message-id, revision-id) in their own
columns, and the selectable fields (`broker.selectors.extract_fields`: every element and
attribute of the content by local name, plus the headers; only the names of the topic's
selector schema when it has one, §5.5) in `fields`. Everything downstream — the live matcher
(`SubscriptionIndex` over `fields`), robust gap fills, Spark audits — reads those columns and
never parses XML again.

What the content says is not all taken on trust. The `publisher` is the authenticated
originator, whatever the content claims (§5.2.1: the service fills in headers; a publisher must
not be able to impersonate another), and the `topic` is the one the data was addressed to. A
message without a publication-date gets the broker's clock. Headers that are present must be
well formed (a date per §4, `0` or `*` for the expiration, a revision 0..2^31-1): otherwise 561,
and nothing is journaled.

Only content whose media type is XML (`application/xml`, `text/xml`, `*+xml`) is parsed; any
other content is journaled as before, with no headers and no fields. The parsed tree is handed
to the optional `validate` hook (the topic's message schema, §5.3) before fields are taken, so
validation does not parse again either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lxml import etree

from broker.selectors import DEFAULT_MAX_MESSAGE_BYTES, SelectorSchema, extract_fields
from common.errors import InvalidMessage
from common.xml_safe import UnsafeXml, parse_hardened

__all__ = ["MAX_REVISION", "Ingested", "Validate", "ingest", "is_xml", "parse_date"]

#: §5.2.1: revision numbers are 0..2,147,483,647.
MAX_REVISION = 2_147_483_647
#: The longest message-id kept (the robust item store's keys have the same bound in spirit).
MAX_MESSAGE_ID = 256

#: Checks a parsed message against its topic's message schema; raises InvalidMessage (561).
Validate = Callable[[Any], None]

_XML_SPACE = " \t\r\n"


@dataclass(frozen=True, slots=True)
class Ingested:
    """What the journal record gets from one message."""

    publisher: str
    publication_date: int
    expiration_date: str | None = None
    message_id: str | None = None
    revision_id: str | None = None
    fields: dict[str, list[str]] = field(default_factory=dict)


def is_xml(content_type: str) -> bool:
    """Whether `content_type` names XML (RFC 7303: application/xml, text/xml, any +xml)."""
    media = content_type.partition(";")[0].strip().lower()
    return media in ("application/xml", "text/xml") or media.endswith("+xml")


def parse_date(text: str, what: str) -> int:
    """A §4 date-time (ISO 8601 with an offset; no offset means UTC) as epoch ms, or 561."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidMessage(f"{what} {text[:40]!r} is not an ISO 8601 date-time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _headers(root: Any) -> dict[str, str]:
    """The `ps:message-content` headers by local name (the drafts use several namespace URIs
    for `ps:`, as `extract_fields` also allows); empty for bare content."""
    if not isinstance(root.tag, str) or etree.QName(root.tag).localname != "message-content":
        return {}
    found: dict[str, str] = {}
    for child in root:
        if isinstance(child.tag, str):
            name = etree.QName(child.tag).localname
            if name != "content" and name not in found:
                found[name] = "".join(child.itertext()).strip(_XML_SPACE)
    return found


def _revision(text: str) -> str:
    if not text.isdigit() or len(text) > 10 or int(text) > MAX_REVISION:
        raise InvalidMessage(f"revision-id {text[:20]!r} is not 0..{MAX_REVISION}")
    return str(int(text))


def _expiration(text: str) -> str:
    if text in ("0", "*"):
        return text
    parse_date(text, "expiration-date")
    return text


def ingest(content: bytes, content_type: str, *, topic: str, publisher: str, now: int,
           schema: SelectorSchema | None = None, validate: Validate | None = None,
           message_id: str | None = None) -> Ingested:
    """Headers and fields of one published message (see the module docstring).

    `publisher`: the authenticated originator; `now`: the broker's clock (ms), the publication
    date of a message that gives none; `message_id`: the data item named outside the content
    (the apexps.publish option), which a message-id header must then agree with.

    Raises:
        InvalidMessage: (561) XML that is not well formed or hostile, a malformed header, a
            message-id that contradicts the option's, or what `validate` refuses.
    """
    if not is_xml(content_type):
        return Ingested(publisher, now, message_id=message_id)
    try:
        # as extract_fields parses: declarations are refused once the tree exists
        root = parse_hardened(content, max_bytes=DEFAULT_MAX_MESSAGE_BYTES,
                              refuse_declarations=False, what="message")
    except UnsafeXml as exc:
        raise InvalidMessage(str(exc)) from None
    if validate is not None:
        validate(root)
    heads = _headers(root)
    given_date = heads.get("publication-date")
    published = parse_date(given_date, "publication-date") if given_date else now
    expires = heads.get("expiration-date")
    expires = _expiration(expires) if expires else None
    revision = heads.get("revision-id")
    revision = _revision(revision) if revision else None
    header_id = heads.get("message-id") or None
    if header_id is not None and len(header_id) > MAX_MESSAGE_ID:
        raise InvalidMessage(f"message-id is longer than {MAX_MESSAGE_ID} characters")
    if message_id is not None and header_id is not None and header_id != message_id:
        raise InvalidMessage(f"the message-id header says {header_id[:40]!r}, the publish"
                             f" option {message_id[:40]!r}")
    fields = extract_fields(root, schema)
    # The broker's view of the headers, not the content's claims.
    keep = None if schema is None else schema.types
    if keep is None or "topic" in keep:
        fields["topic"] = [topic]
    if keep is None or "publisher" in keep:
        fields["publisher"] = [publisher]
    if keep is None or "publication-date" in keep:  # formatted only when kept: a datetime each
        fields["publication-date"] = [given_date or _iso(now)]
    return Ingested(publisher, published, expires, message_id or header_id, revision, fields)
