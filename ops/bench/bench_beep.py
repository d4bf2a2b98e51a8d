"""BEEP frame parser throughput on a recorded stream of realistic MSG/RPY/SEQ traffic.

Run: `.venv/bin/python -m ops.bench.bench_beep [--megabytes 50] [--chunk 65536]`.

The stream is what a listener reads from a busy APEX client: MSGs of 200..3000 octets with MIME
headers, cut to the 4096-octet window, answered by RPYs, with a SEQ after every 2048 octets, as
`BeepConnection` itself would write it. It is generated once, then fed to `FrameDecoder` in
socket-sized chunks; the figure is payload-inclusive wire octets per second.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from adapters.beep._frames import Frame, FrameDecoder, FrameType, SeqFrame, encode_frame, encode_seq


def record_stream(megabytes: float, seed: int = 3340) -> bytes:
    """A deterministic stream of MSG/RPY frames on 8 channels with SEQ updates."""
    rng = random.Random(seed)
    target = int(megabytes * 1024 * 1024)
    seqnos = dict.fromkeys(range(1, 17, 2), 0)
    unacked = dict.fromkeys(seqnos, 0)
    msgnos = dict.fromkeys(seqnos, 0)
    parts: list[bytes] = []
    size = 0
    while size < target:
        channel = rng.choice(list(seqnos))
        body = b"Content-Type: application/beep+xml\r\n\r\n<publish topic='t'>" + rng.randbytes(
            rng.randint(200, 3000)) + b"</publish>"
        ftype = FrameType.MSG if rng.random() < 0.6 else FrameType.RPY
        for start in range(0, len(body), 4096):
            chunk = body[start : start + 4096]
            more = start + 4096 < len(body)
            frame = Frame(ftype, channel, msgnos[channel], more, seqnos[channel], chunk)
            wire = encode_frame(frame)
            parts.append(wire)
            size += len(wire)
            seqnos[channel] = (seqnos[channel] + len(chunk)) % 2**32
            unacked[channel] += len(chunk)
            if unacked[channel] >= 2048:
                seq = encode_seq(SeqFrame(channel, seqnos[channel], 4096))
                parts.append(seq)
                size += len(seq)
                unacked[channel] = 0
        msgnos[channel] += 1
    return b"".join(parts)


def parse(stream: bytes, chunk: int) -> tuple[int, int]:
    """Decode the whole stream; return (data frames, SEQ frames)."""
    decoder = FrameDecoder()
    frames = seqs = 0
    for offset in range(0, len(stream), chunk):
        decoder.feed(stream[offset : offset + chunk])
        while (frame := decoder.next_frame()) is not None:
            if isinstance(frame, SeqFrame):
                seqs += 1
            else:
                frames += 1
    return frames, seqs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=50.0)
    parser.add_argument("--chunk", type=int, default=65536, help="octets per feed() call")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    args = parser.parse_args(argv)
    stream = record_stream(args.megabytes)
    best = float("inf")
    counts = (0, 0)
    for _ in range(args.repeat):
        started = time.perf_counter()
        counts = parse(stream, args.chunk)
        best = min(best, time.perf_counter() - started)
    mb = len(stream) / (1024 * 1024)
    print(f"stream: {mb:.1f} MiB, {counts[0]} data frames, {counts[1]} SEQ frames,"
          f" fed in {args.chunk}-octet chunks")
    print(f"FrameDecoder: {mb / best:.1f} MiB/s ({counts[0] / best:,.0f} frames/s),"
          f" best of {args.repeat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
