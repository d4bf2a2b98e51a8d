"""RobustConfig: what the capability query advertises, checked once at start."""

from __future__ import annotations

import pytest

from broker.robust.config import RobustConfig
from common.errors import ConfigError


def test_defaults_are_consistent() -> None:
    """The defaults fit each other: a maximum gap well inside half the 32-bit space."""
    c = RobustConfig()
    assert (c.seq_bits, c.heartbeat_ms, c.max_gap) == (32, 5000, 10_000)


@pytest.mark.parametrize("kwargs", [{"seq_bits": 8}, {"heartbeat_ms": 0}, {"max_gap": 0},
                                    {"seq_bits": 16, "max_gap": 40_000}])
def test_bad_settings_are_refused(kwargs: dict[str, int]) -> None:
    """An unsupported resolution, a non-positive setting, or a maximum gap of half the space
    or more is a configuration error."""
    with pytest.raises(ConfigError):
        RobustConfig(**kwargs)
