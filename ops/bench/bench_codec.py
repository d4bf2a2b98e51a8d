"""Cost of decoding and encoding one APEX data: the general path against the canonical fast one.

Run: `.venv/bin/python -m ops.bench.bench_codec [--recipients 1] [--size 100] [--number 20000]`.

The data is what the bench clients send: one originator, `--recipients` recipients, `--size`
octets of content, no options, as `encode()` writes it. Each figure is the best of `--repeat`
runs of `--number` calls, in CPU time of this process (`time.process_time`), the general and
fast runs taking turns, so other work on a shared machine inflates them less and alike.
"""

from __future__ import annotations

import argparse
import sys

from adapters.apex.codec import (
    Data,
    _decode_fast,
    _decode_general,
    _encode_fast,
    _encode_general,
    decode,
    encode,
)
from adapters.apex.endpoint import Endpoint
from ops.bench._timing import micros


def sample(recipients: int, size: int) -> Data:
    """A data as a bench client sends it."""
    return Data(Endpoint.parse("c1/app=bench@bench.example"),
                tuple(Endpoint.parse(f"apex=sink{i}@bench.example") for i in range(recipients)),
                bytes(range(256)) * (size // 256) + b"x" * (size % 256))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipients", type=int, default=1)
    parser.add_argument("--size", type=int, default=100, help="content octets")
    parser.add_argument("--number", type=int, default=20000, help="calls per run")
    parser.add_argument("--repeat", type=int, default=7, help="runs; the best counts")
    args = parser.parse_args(argv)

    data = sample(args.recipients, args.size)
    content_type, body = encode(data)
    fast = _decode_fast(content_type, body)
    general = _decode_general(content_type, body)
    if fast is None or fast != general or decode(content_type, body) != general:
        print("the fast path declined the canonical data or disagrees", file=sys.stderr)
        return 1
    print(f"data: {args.recipients} recipient(s), {args.size} content octets,"
          f" {len(body)} octets encoded")

    rows = [
        ("decode", lambda: _decode_general(content_type, body),
         lambda: decode(content_type, body)),
        ("encode", lambda: _encode_general(data), lambda: encode(data)),
    ]
    for name, slow_call, fast_call in rows:
        slow, quick = micros([slow_call, fast_call], args.number, args.repeat)
        print(f"{name}: general {slow:7.2f} us  fast {quick:6.2f} us"
              f"  speed-up {slow / quick:4.1f}x")
    assert _encode_fast(data) is not None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
