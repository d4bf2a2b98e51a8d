"""The robust service's settings: what the capability query advertises (docs/robust-binding.md
§6), apart from the Kafka-side link retention, which lives in `KafkaConfig` because it is a
topic setting."""

from __future__ import annotations

from dataclasses import dataclass

from broker.robust.linkseq import DEFAULT_BITS, SUPPORTED_BITS
from common.errors import ConfigError

__all__ = ["DEFAULT_HEARTBEAT_MS", "DEFAULT_MAX_GAP", "DEFAULT_MAX_REPAIR", "RobustConfig"]

#: XEP-0040 leaves it to the component. 5 s: a desk notices a lost message within 5 s even on a
#: quiet topic, and 1,000 idle links cost 200 small records/s.
DEFAULT_HEARTBEAT_MS = 5_000
#: One gap request is answered from one scan of the links topic plus one of the journal; 10,000
#: is well inside a second on a local Kafka and well inside the 16-bit window (32,767).
DEFAULT_MAX_GAP = 10_000
#: A source repair may replay a long outage; a million messages is minutes of a busy feed.
DEFAULT_MAX_REPAIR = 1_000_000


@dataclass(frozen=True)
class RobustConfig:
    """seq_bits: link seq resolution (16, 32 or 64).
    heartbeat_ms: heartbeat interval on an idle link.
    max_gap: most link seqs one gap request may name (more: 570).
    max_repair: most messages one source repair may resend (more: 570).
    """

    seq_bits: int = DEFAULT_BITS
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS
    max_gap: int = DEFAULT_MAX_GAP
    max_repair: int = DEFAULT_MAX_REPAIR

    def __post_init__(self) -> None:
        if self.seq_bits not in SUPPORTED_BITS:
            raise ConfigError(f"seq_bits must be one of {SUPPORTED_BITS}")
        for name in ("heartbeat_ms", "max_gap", "max_repair"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive")
        if self.max_gap > (1 << (self.seq_bits - 1)) - 1:
            raise ConfigError("max_gap must be less than half the link seq space")
