"""The one hardened XML parser: hostile documents are refused, ordinary ones parse."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.xml_safe import UnsafeXml, parse_hardened

LAUGHS = (b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "lol"><!ENTITY b "&a;&a;&a;&a;">]>'
          b"<l>&b;</l>")
EXTERNAL = b'<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><x>&e;</x>'


def test_ordinary_document_parses() -> None:
    """A plain document comes back as its root element, comments dropped."""
    root = parse_hardened(b"<a x='1'><!-- c --><b>t</b></a>", max_bytes=100)
    assert root.tag == "a" and root.get("x") == "1" and [c.tag for c in root] == ["b"]


@pytest.mark.parametrize("doc", [LAUGHS, EXTERNAL, b"<!DOCTYPE a><a/>"])
def test_declarations_are_refused(doc: bytes) -> None:
    """Billion laughs, external entities and any DOCTYPE are refused before parsing."""
    with pytest.raises(UnsafeXml, match="DOCTYPE"):
        parse_hardened(doc, max_bytes=10_000)


@pytest.mark.parametrize("doc", [EXTERNAL, LAUGHS])
def test_entities_never_expand_without_the_prescan(doc: bytes) -> None:
    """With the byte scan off, the DOCTYPE still refuses the document and nothing expands."""
    with pytest.raises(UnsafeXml):
        parse_hardened(doc, max_bytes=10_000, refuse_declarations=False)


def test_size_and_depth_limits() -> None:
    """Documents over the size or nesting limit are refused with the limit named."""
    with pytest.raises(UnsafeXml, match="exceeds the limit of 10"):
        parse_hardened(b"<a>0123456789</a>", max_bytes=10)
    deep = b"<a>" * 50 + b"</a>" * 50
    assert parse_hardened(deep, max_bytes=1000, max_depth=50).tag == "a"
    with pytest.raises(UnsafeXml, match="nested deeper than 49"):
        parse_hardened(deep, max_bytes=1000, max_depth=49)


@given(st.binary(max_size=300))
def test_any_bytes_parse_or_are_refused(data: bytes) -> None:
    """Arbitrary bytes give an element or UnsafeXml, never another exception."""
    with contextlib.suppress(UnsafeXml):
        parse_hardened(data, max_bytes=200, max_depth=10)
