"""Link identities: who a link is, stable across the subscriber's reconnects.

A link is named explicitly by the subscriber on subscribe (the `link` attribute), or defaults to
the subscriber endpoint it delivers to; the name keys the link's records in Kafka, so it must be
an unambiguous key: 1..1024 characters (the longest endpoint), no control character (NUL
separates index keys), no leading or trailing space. Link ids are global: the first subscriber
to use one owns it, and anybody else naming it is refused with 537.
"""

from __future__ import annotations

import re

from common.errors import InvalidParameter

__all__ = ["MAX_LINK_ID_LEN", "default_link_id", "validate_link_id"]

#: An endpoint is the default link id, and endpoints are at most this long.
MAX_LINK_ID_LEN = 1024

_LINK = re.compile(r"[^\x00-\x1f\x7f]+")
#: Link ids already found valid (bounded: hostile traffic naming ever-new links starts it over).
_VALID: set[str] = set()
_VALID_LIMIT = 65_536


def validate_link_id(link: object) -> str:
    """`link` if it is a usable link id, else InvalidParameter (553)."""
    if type(link) is str and link in _VALID:  # every record and stamp names its link
        return link
    if not isinstance(link, str):
        raise InvalidParameter(f"a link id is text, not {type(link).__name__}")
    if not link or len(link) > MAX_LINK_ID_LEN:
        raise InvalidParameter(f"a link id has 1..{MAX_LINK_ID_LEN} characters")
    if not _LINK.fullmatch(link) or link != link.strip():
        raise InvalidParameter(
            "a link id has no control characters and no leading or trailing space")
    if type(link) is str:  # not a subclass: its comparisons could differ
        if len(_VALID) >= _VALID_LIMIT:
            _VALID.clear()
        _VALID.add(link)
    return link


def default_link_id(subscriber: str) -> str:
    """The link a subscriber gets when it names none: its endpoint (subaddress included, so
    two applications attached as fred/appl=a and fred/appl=b keep separate links)."""
    return validate_link_id(subscriber)
