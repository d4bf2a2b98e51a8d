"""The fan-out mark: how far the journal has been put onto subscriber links, durable in Kafka.

Why. A publisher's `ok` means its message is in the journal; the broker then reads it back and
gives it a link seq on every subscriber's link (broker/delivery/core.py). A broker killed
between the two would, on restart, follow the journal from its end and never sequence that
message: a loss no gap fill can see, since no link seq was ever assigned. So the fan-out keeps,
per journal partition, the offset below which every record is durable on its links (the
*mark*), and a restarted broker follows the journal from the marks, not from its end.

Not twice. The mark is written every `MARK_INTERVAL_S`, so what the last moments before a
crash put on links lies beyond it. The restarted broker reads the link records written since a
little before its newest mark (`LinkLog.carried_since`, `CARRIED_MARGIN_MS` back) and does not
put those (link, journal position) pairs on their links again: a link carries each message once
and its seqs stay in step with what it carried. Should that read miss one (a mark stuck for
longer than the margin), the message appears twice on its link under two link seqs with the
same source and source seq, and the subscriber stub discards the second (robust-binding §7).

A clean stop. Link records are sent before Kafka holds them (broker/delivery/core.py,
"Ordering"), so a crash can lose records a subscriber saw, and a restarted broker must begin a
new epoch on every link rather than hand those seqs to other messages. A broker that stops
cleanly (every link record durable) says so with one more record, key `clean`, naming its link
log writer (`stopped_clean`); a starting broker reads it (`clean_writer`) and deletes it before
it serves anything (`running`), so its presence proves that the last broker to serve stopped
cleanly, and its links may go on in their epochs.

The topic (`NS.fanout`, compacted, one partition) holds one record per journal partition,
keyed by the partition number, and the `clean` record (partition -1, its offset the writer);
only the broker that serves the live path writes it.
"""

from __future__ import annotations

import threading

import structlog

from broker.codec import Codec
from broker.kafka_io import KafkaConfig, Position, read_partition
from broker.kafka_producer import KafkaProducer
from broker.records import now_ms, to_ms
from common.errors import JournalUnavailable

__all__ = ["CARRIED_MARGIN_MS", "CLEAN_KEY", "MARK_INTERVAL_S", "SCHEMA", "FanoutMarks"]

log = structlog.get_logger(__name__)

SCHEMA = "fanout_mark"
#: How often the mark is written.
MARK_INTERVAL_S = 0.5
#: How far before its newest mark a restart looks for link records: a mark is computed when it
#: is written, but records of batches still settling then (and clock skew between this host and
#: Kafka's timestamps) may be a little older.
CARRIED_MARGIN_MS = 10_000
#: The key of the clean-stop record.
CLEAN_KEY = b"clean"


class FanoutMarks:
    def __init__(self, config: KafkaConfig, producer: KafkaProducer, codec: Codec) -> None:
        self.topic = config.topic("fanout")
        self._config, self._producer, self._codec = config, producer, codec
        self._written: dict[int, int] = {}
        #: when the newest loaded mark was written (ms; None: no marks)
        self.written_at: int | None = None
        #: the link log writer of the broker that last stopped cleanly (None: the last one to
        #: serve did not, or none ever did)
        self.clean_writer: int | None = None

    def load(self) -> dict[int, int]:
        """The newest mark of every journal partition that has one."""
        marks: dict[int, int] = {}
        for rec in read_partition(self._config, self.topic, 0):
            if rec.key == CLEAN_KEY:
                self.clean_writer = None
                if rec.value is not None:
                    self.clean_writer = self._codec.decode(rec.value, expect=SCHEMA)[1]["offset"]
                continue
            if rec.value is None:
                continue
            _, value = self._codec.decode(rec.value, expect=SCHEMA)
            marks[value["partition"]] = value["offset"]
            at = to_ms(value["updated_at"])
            if at is not None and (self.written_at is None or at > self.written_at):
                self.written_at = at
        self._written = dict(marks)
        log.info("fan-out marks loaded", partitions=len(marks))
        return marks

    def write(self, marks: dict[int, int]) -> None:
        """Record the partitions whose mark moved forward (asynchronously: a mark that does not
        reach Kafka only makes a restart sequence a little more again)."""
        for part, offset in marks.items():
            if offset <= self._written.get(part, -1):
                continue
            value = self._codec.encode(SCHEMA, {"partition": part, "offset": offset,
                                                "updated_at": now_ms()})
            self._producer.produce(self.topic, str(part).encode(), value, _ignore, partition=0)
            self._written[part] = offset


    def running(self) -> None:
        """Delete the clean-stop record before serving (see the module docstring); waits
        until Kafka holds the deletion (JournalUnavailable if it does not in time)."""
        if self.clean_writer is not None:
            self._write_now(None)

    def stopped_clean(self, writer: int) -> None:
        """Every link record of link log writer `writer` is durable and it serves no more;
        waits until Kafka holds the record."""
        self._write_now(self._codec.encode(SCHEMA, {"partition": -1, "offset": writer,
                                                    "updated_at": now_ms()}))

    def _write_now(self, value: bytes | None, timeout_s: float = 30.0) -> None:
        settled = threading.Event()
        failed: list[Exception] = []

        def done(err: Exception | None, _pos: Position | None) -> None:
            if err is not None:
                failed.append(err)
            settled.set()
        self._producer.produce(self.topic, CLEAN_KEY, value, done, partition=0)
        if not settled.wait(timeout_s) or failed:
            raise JournalUnavailable("the clean-stop record was not written: "
                                     f"{failed[0] if failed else 'no answer in time'}")


def _ignore(err: Exception | None, pos: Position | None) -> None:
    if err is not None:
        log.warning("fan-out mark not written; a restart will sequence more again",
                    error=str(err))
