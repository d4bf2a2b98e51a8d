"""When a Kafka-backed log writes its checkpoints: the rule of the checkpoint book
(broker/checkpoints.py), for the journal, the link log and the item store."""

from __future__ import annotations

import time

__all__ = ["CHECKPOINT_EVERY", "CHECKPOINT_INTERVAL_S", "FlushPolicy"]

#: Flush checkpoints at least this often, or after this many deliveries.
CHECKPOINT_INTERVAL_S = 1.0
CHECKPOINT_EVERY = 1000


class FlushPolicy:
    """A flush is due once something changed and either `every` changes have piled up or
    `interval_s` has passed since the last flush: a restart then rescans at most about that
    much of the log's tail, and a busy log does not write a checkpoint per record."""

    def __init__(self, every: int = CHECKPOINT_EVERY,
                 interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        self.every, self.interval_s = every, interval_s
        self.changes = 0
        self._last = time.monotonic()

    def changed(self, n: int = 1) -> None:
        self.changes += n

    def due(self) -> bool:
        if self.changes == 0:
            return False
        return (self.changes >= self.every
                or time.monotonic() - self._last >= self.interval_s)

    def flushed(self) -> None:
        self.changes = 0
        self._last = time.monotonic()
