"""Per-record decode cost: fastavro against the compiled reader (broker/_avro_reader.py).

Run: `.venv/bin/python -m ops.bench.bench_avro [--records 2000] [--rounds 40]`.

Not a test (pytest does not collect it): it prints figures. The records are what a gap fill
reads: journal_record v2 DATA records with 512 bytes of content, and the link_record v2 DATA
records that point at them, each with its own seq and offset. Their times are 1 ms apart (a
burst: the reader's per-second datetime cache hits) or 1.001 s apart (a trickle: it never does;
the cache is emptied before every round). Both paths decode the same bytes through
`Codec.decode`, one codec with the compiled readers and one without (`fast_read=False`), taking
turns in many short rounds; the figure is the best round's process CPU time per record, so other
load on the machine inflates it less than wall time would.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from broker import _avro_reader
from broker.codec import Codec
from broker.records import Publication

_T0 = 1_700_000_000_000  # ms


def journal_records(count: int, codec: Codec, step_ms: int) -> list[bytes]:
    out = []
    for i in range(count):
        pub = Publication(topic="music.jazz", source="fred@example.com",
                          content=bytes(range(256)) * 2, message_id=f"m-{i}")
        out.append(codec.encode("journal_record", pub.to_avro(1_000_000 + i, _T0 + i * step_ms)))
    return out


def link_records(count: int, codec: Codec, step_ms: int) -> list[bytes]:
    return [codec.encode("link_record", {
        "link": "barney@example.com/42", "ordinal": 5_000_000 + i, "epoch": 3,
        "epoch_start": 4_999_000, "bits": 32, "kind": "DATA", "journal_partition": i % 6,
        "journal_offset": 70_000_000 + i, "source": "fred@example.com",
        "source_seq": 1_000_000 + i, "owner": None, "writer": _T0 - 3_600_000,
        "recorded_at": _T0 + i * step_ms, "snapshot": False,
    }) for i in range(count)]


def per_record_us(decoders: list[Callable[[bytes], object]], records: list[bytes],
                  rounds: int) -> list[float]:
    """Each decoder's best round, in µs per record. The decoders take turns within a round,
    so a burst of load elsewhere on the machine hits them alike."""
    best = [float("inf")] * len(decoders)
    for _ in range(rounds):
        for i, decode in enumerate(decoders):
            _avro_reader._SECONDS.clear()
            start = time.process_time()
            for data in records:
                decode(data)
            best[i] = min(best[i], time.process_time() - start)
    return [b / len(records) * 1e6 for b in best]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    fast, slow = Codec(), Codec(fast_read=False)
    for name, make in (("journal_record", journal_records), ("link_record", link_records)):
        for step_ms in (1, 1001):
            records = make(args.records, fast, step_ms)
            assert all(fast.decode(r) == slow.decode(r) for r in records)
            version = fast.schema(name).version
            reference, compiled = per_record_us([slow.decode, fast.decode], records, args.rounds)
            print(f"{name} v{version} ({len(records[0])} bytes, {step_ms} ms apart): "
                  f"fastavro {reference:.2f} µs, compiled {compiled:.2f} µs per record "
                  f"({reference / compiled:.1f}x)")


if __name__ == "__main__":
    main()
