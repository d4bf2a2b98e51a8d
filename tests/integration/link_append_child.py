"""Child process for the link log crash test: append link records, print each as it is durable.

Usage: python -m tests.integration.link_append_child BOOTSTRAP NAMESPACE COUNT LINKS PREFIX
Appends COUNT records round-robin over LINKS links (DATA with made-up journal coordinates, every
tenth a HEARTBEAT), in batches, and prints `ACK link ordinal epoch linkseq kind sourceseq` per
durable record (flushed), so the parent knows exactly what was acknowledged before its SIGKILL.
"""

from __future__ import annotations

import sys
import threading

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig, Position
from broker.robust.link_records import LinkItem, LinkKind, LinkRecord
from common.errors import JournalUnavailable

BATCH = 50


def main() -> None:
    bootstrap, namespace = sys.argv[1], sys.argv[2]
    count, links, prefix = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    core = BrokerCore(KafkaConfig(bootstrap=bootstrap, namespace=namespace))
    core.open()
    lock = threading.Lock()
    out = sys.stdout

    def acked(outcomes: list[LinkRecord | JournalUnavailable]) -> None:
        with lock:
            for r in outcomes:
                if isinstance(r, LinkRecord):
                    out.write(f"ACK {r.link} {r.ordinal} {r.epoch} {r.link_seq} {r.kind}"
                              f" {r.source_seq or 0}\n")
            out.flush()

    items: list[LinkItem] = []
    for i in range(count):
        link = f"link-{i % links}"
        if i % 10 == 9:
            items.append(LinkItem.heartbeat(link))
        else:
            items.append(LinkItem(link, LinkKind.DATA, Position(0, i), f"{prefix}@example.com",
                                  i + 1))
        if len(items) == BATCH:
            core.links.append_many(items, acked)
            items = []
    if items:
        core.links.append_many(items, acked)
    core.links.flush()
    out.write("DONE\n")
    out.flush()
    core.close()


if __name__ == "__main__":
    main()
