"""The three `ps:message-content` headers the cache and expiry need, read at publication.

Only what caching and expiry act on — message-id, revision-id, expiration-date (content-based
draft §5.2.1) — and only when the content's root is `message-content` (recognized by local
name: the drafts use more than one namespace URI for `ps:`). Content that is not XML, or not a
`message-content`, has none of them, and this says nothing about it: refusing a message is the
ingest's business (issue 20 item 1: headers, fields and 561), which reads these same three
headers with the rest and supersedes this reader when it lands.

Parsing uses the one hardened parser with the selectors' limits on size and depth.
"""

from __future__ import annotations

from typing import NamedTuple

from common.xml_safe import UnsafeXml, parse_hardened

__all__ = ["CacheHeaders", "cache_headers"]

#: As broker/selectors/_limits.py bounds a message the selectors read.
_MAX_BYTES = 16 * 1024 * 1024
_MAX_DEPTH = 64


class CacheHeaders(NamedTuple):
    message_id: str | None = None
    revision_id: str | None = None
    expiration_date: str | None = None


_NONE = CacheHeaders()
_WANTED = {"message-id": 0, "revision-id": 1, "expiration-date": 2}


def _local(tag: object) -> str:
    if not isinstance(tag, str):
        return ""
    return tag.rpartition("}")[2]


def cache_headers(content: bytes) -> CacheHeaders:
    """The headers of a `ps:message-content` document (trimmed text; absent: None)."""
    if b"message-content" not in content[:4096]:
        return _NONE  # the common case, without a parse
    try:
        root = parse_hardened(content, max_bytes=_MAX_BYTES, max_depth=_MAX_DEPTH,
                              what="message")
    except UnsafeXml:
        return _NONE
    if _local(root.tag) != "message-content":
        return _NONE
    found: list[str | None] = [None, None, None]
    for child in root:
        at = _WANTED.get(_local(child.tag))
        if at is not None and found[at] is None:
            found[at] = "".join(str(t) for t in child.itertext()).strip()
    return CacheHeaders(*found)
