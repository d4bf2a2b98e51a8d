"""The one exception hierarchy: codes, the registry, and its fallback."""

from __future__ import annotations

import pytest

from common.errors import (
    AccessDenied,
    ApexpsError,
    InvalidParameter,
    JournalUnavailable,
    ReplyCode,
    SelectorError,
    UnknownReplyError,
)


def test_root_is_abstract() -> None:
    """ApexpsError itself cannot be raised; only its leaves, which carry a code."""
    with pytest.raises(TypeError):
        ApexpsError("x")


def test_for_code_maps_to_most_general_class() -> None:
    """A reply code from a peer becomes the first class declared for it."""
    assert type(ApexpsError.for_code(537, "no")) is AccessDenied
    assert type(ApexpsError.for_code(553)) is InvalidParameter
    assert str(ApexpsError.for_code(537, "no")) == "no"


def test_every_apex_reply_code_maps_without_the_wire_package() -> None:
    """Codes the relay answers with resolve to their classes from common.errors alone."""
    from common import errors

    for code, name in ((501, "ParameterSyntaxError"), (504, "OptionNotImplemented"),
                       (554, "TransactionFailed"), (555, "TransactionInProgress"),
                       (556, "AttachmentOverridden")):
        assert type(ApexpsError.for_code(code)) is getattr(errors, name)


def test_for_code_falls_back_for_unknown_codes() -> None:
    """An unregistered code yields UnknownReplyError carrying the received code."""
    err = ApexpsError.for_code(599, "odd")
    assert isinstance(err, UnknownReplyError) and err.received_code == 599


def test_transient_codes_are_retriable() -> None:
    """A 4xx error says the same request may succeed later; a 5xx does not."""
    assert JournalUnavailable.retriable and JournalUnavailable.code.is_transient
    assert not AccessDenied.retriable and not ReplyCode.NOT_AUTHORIZED.is_transient


def test_selector_error_carries_position() -> None:
    """Selector errors keep the position and reason a user needs to fix the text."""
    err = SelectorError("unbalanced parenthesis", position=4)
    assert err.position == 4 and err.reason == "unbalanced parenthesis" and "4" in str(err)


def test_robust_delivery_codes() -> None:
    """The robust binding's codes (docs/robust-binding.md §4.2) resolve to their classes."""
    from common.errors import (
        BadGapRange,
        LinkContextGone,
        NotYourLink,
        RebuildRefused,
    )

    assert type(ApexpsError.for_code(569)) is LinkContextGone
    assert type(ApexpsError.for_code(570)) is RebuildRefused
    assert BadGapRange.code == 553 and isinstance(BadGapRange(), InvalidParameter)
    assert NotYourLink.code == 537 and isinstance(NotYourLink(), AccessDenied)
    assert not LinkContextGone.retriable and not RebuildRefused.retriable
