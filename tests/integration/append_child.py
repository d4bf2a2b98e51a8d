"""Child process for the crash test: append records, print each acknowledgement as it lands.

Usage: python -m tests.integration.append_child BOOTSTRAP NAMESPACE COUNT SOURCES
Prints `ACK source seq id` per durable record (flushed), so a parent reading the pipe knows
exactly what was acknowledged before it kills this process with SIGKILL.
"""

from __future__ import annotations

import sys
import threading

from broker.core import BrokerCore
from broker.kafka_io import KafkaConfig
from broker.records import Publication

PAYLOAD = 512


def content(ident: str) -> bytes:
    return f"<m id='{ident}'/>".encode().ljust(PAYLOAD, b" ")


def main() -> None:
    bootstrap, namespace, count, sources = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        int(sys.argv[4])
    prefix = sys.argv[5] if len(sys.argv) > 5 else "c"
    core = BrokerCore(KafkaConfig(bootstrap=bootstrap, namespace=namespace))
    core.open()
    lock = threading.Lock()
    out = sys.stdout

    def acked(source: str, ident: str) -> object:
        def cb(err: Exception | None, res: object) -> None:
            if err is None and res is not None:
                with lock:
                    out.write(f"ACK {source} {res.source_seq} {ident}\n")  # type: ignore[attr-defined]
                    out.flush()
        return cb

    for i in range(count):
        source = f"src{i % sources}@example.com"
        ident = f"{prefix}{i}"
        core.journal.append(Publication(topic="equity.quote", source=source,
                                        content=content(ident)), acked(source, ident))
    core.journal.flush()
    out.write("DONE\n")
    out.flush()
    core.close()


if __name__ == "__main__":
    main()
