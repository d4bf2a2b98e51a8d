"""The one hardened XML parser every part of apexps uses on input it did not write.

BEEP channel 0, APEX control documents and published messages all arrive from peers that may
be hostile. They are parsed here, once, the same way:

* a size limit is checked before lxml sees a byte;
* optionally, any `<!DOCTYPE` or `<!ENTITY` in the raw bytes is refused outright -- even inside
  CDATA, which costs a legitimate document almost nothing and makes the refusal independent of
  how the parser treats declarations;
* the parser resolves no entity, loads no DTD, touches no network and keeps libxml2's own
  huge-document limits on; comments and processing instructions are dropped;
* a DOCTYPE that still reaches the tree is refused, and so is nesting deeper than `max_depth`.

Refusals raise `UnsafeXml` with a reason; each caller turns it into the reply code of its
protocol (BEEP 500 without ending the session, APEX 500, a published message 561). This module
lives in `broker/` because the selectors need it and `broker/` never imports the wire.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import cast

from lxml import etree

__all__ = ["UnsafeXml", "checked_attributes", "parse_hardened", "xml_depth"]

_DECLARATION = re.compile(rb"<!(?:DOCTYPE|ENTITY)", re.IGNORECASE)


class UnsafeXml(ValueError):
    """The document was refused; `str(exc)` says why in words a peer can act on."""


def _new_parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
    )


class _PerThread(threading.local):
    # lxml parsers keep state and are not safe to share across threads, but one thread may
    # reuse its own parser (lxml resets it for every document); making one cost about as much
    # as parsing an APEX reply.
    parser: etree.XMLParser | None = None


_local = _PerThread()


def _parser() -> etree.XMLParser:
    parser = _local.parser
    if parser is None:
        parser = _local.parser = _new_parser()
    return parser


def xml_depth(root: etree._Element) -> int:
    """Nesting depth of `root` (1 for a childless element), without recursion."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        elem, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in elem)
    return deepest


def parse_hardened(
    data: bytes,
    *,
    max_bytes: int,
    max_depth: int | None = None,
    refuse_declarations: bool = True,
    what: str = "document",
) -> etree._Element:
    """Parse `data` into its document element, or raise UnsafeXml."""
    if len(data) > max_bytes:
        raise UnsafeXml(f"{what} of {len(data)} octets exceeds the limit of {max_bytes}")
    if refuse_declarations and _DECLARATION.search(data):
        raise UnsafeXml("DOCTYPE and ENTITY declarations are refused")
    try:
        root = etree.fromstring(data, _parser())
    except (etree.XMLSyntaxError, ValueError) as exc:
        raise UnsafeXml(f"{what} is not well-formed XML: {str(exc)[:200]}") from None
    if getattr(root.getroottree().docinfo, "doctype", None):
        raise UnsafeXml(f"a DOCTYPE is not allowed in a {what}")
    if not isinstance(root.tag, str):
        raise UnsafeXml(f"the {what} has no document element")
    # Each element opens with "<", so a document with no more of them than max_depth cannot
    # nest deeper: the walk is needed only for the few that could.
    if max_depth is not None and data.count(b"<") > max_depth and xml_depth(root) > max_depth:
        raise UnsafeXml(f"{what} nested deeper than {max_depth} elements")
    return root


def checked_attributes(elem: etree._Element, allowed: set[str] | frozenset[str],
                       required: set[str] | frozenset[str],
                       error: Callable[[str], Exception]) -> dict[str, str]:
    """`elem`'s attributes, if it has only `allowed` ones and every `required` one; otherwise
    raise `error(text)` (each vocabulary answers with its own reply code)."""
    # lxml gives names and values as str (its stubs allow bytes too)
    attrs = cast("dict[str, str]", dict(elem.items()))
    unknown = attrs.keys() - allowed
    if unknown:
        raise error(f"unexpected attribute {sorted(unknown)[0][:40]!r} in <{elem.tag}>")
    missing = required - attrs.keys()
    if missing:
        raise error(f"<{elem.tag}> lacks its {sorted(missing)[0]!r} attribute")
    return attrs
