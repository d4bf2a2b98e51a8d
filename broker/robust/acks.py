"""The acknowledgement log: how far each subscriber has answered `ok` on its link, in Kafka.

Why. The link log says what each link *carried*; an audit that must prove delivery (DESIGN
invariant 8) also needs what the subscriber *acknowledged*, and from Kafka, not from the
broker's memory. A subscriber's APEX endpoint answers every data with `ok` (RFC 3340 §4.4.4),
and BEEP answers a channel's messages in order (RFC 3080 §2.6.1), so one number per link and
epoch says it all: the newest link record whose delivery was answered `ok`. Everything the link
carried before it on the same channel was answered too.

Written behind. A record per delivery would double the broker's Kafka writes for evidence
nobody reads until an audit. `acked` only raises a number in memory; `flush` writes the
numbers that moved, one record per (link, epoch), and the shell calls it at most every
`ACK_FLUSH_S`. So the log is a lower bound: an `ok` from the last half second before a crash
may be missing, never one the subscriber did not give. The audit reads it that way
(docs/audit.md): acknowledged through N, delivered beyond N with no answer yet on record.

The topic (`NS.acks`, compacted, one partition) is keyed by link and epoch, so each epoch's
last word survives compaction: a reset does not erase what the old epoch was acknowledged to.
"""

from __future__ import annotations

from typing import NamedTuple

import structlog

from broker.codec import Codec
from broker.kafka_io import KafkaConfig, Position
from broker.kafka_producer import KafkaProducer
from broker.records import now_ms

__all__ = ["ACK_FLUSH_S", "SCHEMA", "AckLog", "AckTag", "ack_key"]

log = structlog.get_logger(__name__)

SCHEMA = "link_ack"
#: How long an `ok` may wait in memory before it is written.
ACK_FLUSH_S = 0.5


class AckTag(NamedTuple):
    """The link record a delivery carried last (a `<batch>` carries several: its last)."""

    link: str
    epoch: int
    ordinal: int
    seq: int


def ack_key(link: str, epoch: int) -> bytes:
    """The record key: link and epoch (a link name holds no newline: RFC 3340 endpoints)."""
    return f"{link}\n{epoch}".encode()


class AckLog:
    """The newest acknowledged record per (link, epoch), written behind (module docstring)."""

    def __init__(self, config: KafkaConfig, producer: KafkaProducer, codec: Codec) -> None:
        self.topic = config.topic("acks")
        self._producer, self._codec = producer, codec
        #: (link, epoch) -> the newest acknowledged tag and when
        self._acked: dict[tuple[str, int], tuple[AckTag, int]] = {}
        self._dirty: set[tuple[str, int]] = set()

    def acked(self, tag: AckTag, at_ms: int | None = None) -> bool:
        """The recipient answered `ok` to the delivery that ended with `tag`; True when that
        moved the link's number (so a flush has something to write)."""
        key = (tag.link, tag.epoch)
        known = self._acked.get(key)
        if known is not None and known[0].ordinal >= tag.ordinal:
            return False
        self._acked[key] = (tag, now_ms() if at_ms is None else at_ms)
        self._dirty.add(key)
        return True

    def acknowledged(self, link: str, epoch: int) -> AckTag | None:
        """The newest acknowledged record of that epoch of `link`, as far as this broker knows."""
        known = self._acked.get((link, epoch))
        return None if known is None else known[0]

    @property
    def pending(self) -> int:
        """(link, epoch) pairs whose number moved since the last flush."""
        return len(self._dirty)

    def flush(self) -> int:
        """Write every number that moved; returns how many records were produced. A write that
        fails is logged and not retried: the next `ok` on that link writes a newer one."""
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            tag, at = self._acked[key]
            value = self._codec.encode(SCHEMA, {
                "link": tag.link, "epoch": tag.epoch, "ordinal": tag.ordinal, "seq": tag.seq,
                "acked_at": at})
            self._producer.produce(self.topic, ack_key(tag.link, tag.epoch), value, _logged,
                                   partition=0)
        return len(dirty)

    def forget(self, link: str) -> None:
        """Drop what is kept of `link` (it moved to another broker, or ended); what was written
        stays in Kafka."""
        for key in [k for k in self._acked if k[0] == link]:
            self._acked.pop(key, None)
            self._dirty.discard(key)


def _logged(err: Exception | None, _pos: Position | None) -> None:
    if err is not None:
        log.warning("acknowledgement not written; the audit will see an older one",
                    error=str(err))
