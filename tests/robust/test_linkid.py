"""Link ids (broker/robust/linkid.py): explicit names and the endpoint default."""

from __future__ import annotations

import pytest

from broker.robust.linkid import MAX_LINK_ID_LEN, default_link_id, validate_link_id
from common.errors import InvalidParameter


def test_names_and_endpoints_are_link_ids() -> None:
    """Subscriber-chosen names and endpoints (the default) are accepted as they are."""
    assert validate_link_id("desk-1") == "desk-1"
    assert default_link_id("fred/appl=wb@example.com") == "fred/appl=wb@example.com"
    assert validate_link_id("x" * MAX_LINK_ID_LEN)


@pytest.mark.parametrize("bad", ["", " a", "a ", "a\x00b", "a\nb", "x" * (MAX_LINK_ID_LEN + 1),
                                 None, 5])
def test_unusable_link_ids_are_553(bad: object) -> None:
    """Empty, padded, control characters, too long, or not text: 553."""
    with pytest.raises(InvalidParameter):
        validate_link_id(bad)
