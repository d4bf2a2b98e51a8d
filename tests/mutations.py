"""Edits of a document's octets, for property tests that hold a fast decoder to the general one
on near-miss input: what the fast path accepts, the general path must accept alike."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

#: The edits `edit_octets` makes, inserts weighted up (they reach the most guards).
EDITS = ["flip", "insert", "insert", "insert", "swap", "delete", "truncate", "case", "copy"]


def edit_octets(draw: st.DrawFn, doc: bytes, kind: str, *, seams: Sequence[int],
                inserts: Sequence[bytes], swaps: Sequence[tuple[bytes, bytes]]) -> bytes:
    """`doc` with one edit of `kind` (one of EDITS): at any offset or, as often, at one of
    `seams` (where the layout's guards have to tell); `inserts` are pieces worth putting in,
    `swaps` pairs of octets the layout treats alike, or nearly."""
    at = draw(st.integers(0, len(doc)) | st.sampled_from(list(seams) or [0]))
    end = draw(st.integers(at, min(len(doc), at + 40)))
    if kind == "flip":
        if at < len(doc):
            doc = doc[:at] + bytes([doc[at] ^ draw(st.integers(1, 255))]) + doc[at + 1:]
    elif kind == "insert":
        piece = draw(st.sampled_from(list(inserts)) | st.binary(min_size=1, max_size=4))
        doc = doc[:at] + piece + doc[at:]
    elif kind == "swap":
        old, new = draw(st.sampled_from(list(swaps)))
        found = doc.find(old, at)
        if found >= 0:
            doc = doc[:found] + new + doc[found + len(old):]
    elif kind == "delete":
        doc = doc[:at] + doc[end:]
    elif kind == "truncate":
        doc = doc[:at]
    elif kind == "case":
        change = draw(st.sampled_from([bytes.upper, bytes.lower, bytes.swapcase]))
        doc = doc[:at] + change(doc[at:end]) + doc[end:]
    elif kind == "copy":
        doc = doc[:at] + doc[at:end] + doc[at:]
    else:
        raise ValueError(f"no such edit: {kind}")
    return doc
