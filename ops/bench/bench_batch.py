"""Cost of reading one live `<batch>`: the general path (lxml) and its compiled twin.

Run: `.venv/bin/python -m ops.bench.bench_batch [--items 1 6] [--size 512] [--number 20000]`.

Each batch is what a batching subscriber gets from the fan-out: `--items` data items of one
link (`s3@bench.example`), each from `pub@bench.example` on `bench.quotes` with `--size` octets
of content, as `BatchPacker` writes them. Each figure is the best of `--repeat` runs of
`--number` calls, in CPU time of this process (`time.process_time`), the runs taking turns, so
other work on a shared machine inflates them less and alike. `match_batch` is the C twin
(`adapters.speedups`); where it is not built every batch takes the general path, and the
bench says so and stops.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from adapters import speedups
from adapters.apex.batch_codec import (
    MAX_BATCH_XML,
    BatchPacker,
    _decode_general,
    batch_data_item,
)
from adapters.apex.batch_fast import match_batch
from adapters.apex.robust_stamp import data_stamp_xml
from ops.bench._timing import micros

LINK = "s3@bench.example"


def sample(items: int, size: int) -> bytes:
    """A batch of `items` live data items as the fan-out packs them."""
    packer = BatchPacker(LINK, items)
    content = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    for seq in range(1000, 1000 + items):
        stamp = data_stamp_xml(LINK, seq, epoch=0, source="pub@bench.example", source_seq=seq,
                               publish_type="update", topic="bench.quotes",
                               time=1_700_000_000_000 + seq)
        packer.add(batch_data_item(stamp, content, "application/octet-stream"))
    doc = packer.flush()
    assert doc is not None
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, nargs="+", default=[1, 6])
    parser.add_argument("--size", type=int, default=512, help="content octets per item")
    parser.add_argument("--number", type=int, default=20000, help="calls per run")
    parser.add_argument("--repeat", type=int, default=7, help="runs; the best counts")
    args = parser.parse_args(argv)

    if not speedups.active()["adapters.apex._speedups"]:
        print("the C twin is not built (or APEXPS_PURE_PYTHON is set): every batch takes the"
              " general path; build it with `bash ops/bootstrap`", file=sys.stderr)
        return 1
    for items in args.items:
        doc = sample(items, args.size)
        general = _decode_general(doc)
        if match_batch(doc, MAX_BATCH_XML) != (general[0], list(general[1])):
            print("the C twin declined the batch or disagrees", file=sys.stderr)
            return 1
        slow, c = micros([partial(_decode_general, doc),
                          partial(match_batch, doc, MAX_BATCH_XML)],
                         args.number, args.repeat)
        print(f"{items} item(s), {len(doc)} octets: general {slow:7.2f} us  C twin"
              f" {c:6.2f} us  ({slow / c:3.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
