"""Would an in-loop Kafka client cut the broker's CPU at 1,000 msgs/s? One record at a time.

Run: `.venv/bin/python -m ops.bench.probe_inloop_producer --bootstrap HOST:PORT [--records N]`
(needs the bench extra for aiokafka: `.venv/bin/pip install -e '.[bench]'`)

At a paced 1,000 msgs/s the broker spends most of its CPU on wake-ups, not Python: every
message crosses its event loop and librdkafka's broker thread, each woken (docs/bench-peers.md,
"Where W1's broker waits"). A Kafka client written on the event loop itself (aiokafka) has no
thread to wake, so it looked like the design that would move issue 21's 300 µs target. This
measures it before anyone builds it: the same load, 512-octet records produced one every
millisecond (idempotent, acks=all, one partition, each awaited), by
- `rd-loop`: the broker's `KafkaProducer`, its reports served on the loop (the report pipe);
- `rd-thread`: the same producer with its poll thread serving the reports;
- `aio`: aiokafka's producer on the same loop,
alternating, and prints each one's process CPU and Kafka's JVM CPU per record, and the
latency from the record's due time to its acknowledgement.

Measured 2026-11-26 (quiet machine, fresh Kafka, 10,000 records, four rounds in two sittings):
rd-loop 129-150 µs per record, Kafka 139-150 µs, p50 0.28-0.45 ms; rd-thread 134-161 µs, Kafka
138-170 µs, p50 0.21-0.40 ms; aio 207-231 µs, Kafka 167-185 µs, p50 0.53-0.68 ms. The in-loop
client costs more, not less; and a lone producer with its Kafka already spends about 270-300 µs
per record here, the whole of issue 21's budget for the broker and Kafka together.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from adapters.cli import loop as event_loop
from broker.kafka_io import KafkaConfig, drop_namespace, ensure_topics
from broker.kafka_producer import KafkaProducer
from ops.bench.bench_pubsub import _cpu_seconds, _listener_pid

BODY = b"x" * 512
MODES = ("rd-loop", "aio", "rd-thread")
INSTALL_HINT = "the probe needs the bench extra: .venv/bin/pip install -e '.[bench]' (aiokafka)"

Send = Callable[[float, list[float]], Awaitable[None]]


async def _paced(mode: str, records: int, send: Send, kafka_pid: int | None) -> str:
    """`records` sends, one due every millisecond; the figures as one line (Kafka's CPU 0
    where its process cannot be found)."""
    latencies: list[float] = []
    began, cpu = time.perf_counter(), time.process_time()
    kafka = _cpu_seconds(kafka_pid) if kafka_pid else 0.0
    sends = []
    for i in range(records):
        wait = began + i / 1000 - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)  # pacing the load, not awaiting an event
        sends.append(asyncio.ensure_future(send(began + i / 1000, latencies)))
    await asyncio.gather(*sends)
    cpu = time.process_time() - cpu
    kafka = _cpu_seconds(kafka_pid) - kafka if kafka_pid else 0.0
    latencies.sort()
    return (f"{mode:9} process {cpu / records * 1e6:5.0f} µs/record, Kafka"
            f" {kafka / records * 1e6:5.0f} µs/record, latency p50"
            f" {latencies[len(latencies) // 2] * 1e3:.2f} ms p99"
            f" {latencies[int(len(latencies) * 0.99)] * 1e3:.2f} ms")


async def _librdkafka(config: KafkaConfig, topic: str, records: int, on_loop: bool,
                      kafka_pid: int | None) -> str:
    loop = asyncio.get_running_loop()
    producer = KafkaProducer(config)
    if on_loop and not producer.serve_reports_on(loop):
        raise SystemExit("this process cannot serve the reports on the loop (report_pipe.py)")
    for _ in range(50):  # its producer id and the connection, before the clock starts
        producer.produce_sync(topic, None, BODY)

    async def send(due: float, latencies: list[float]) -> None:
        done: asyncio.Future[None] = loop.create_future()

        def acked(_err: Exception | None, _pos: Any) -> None:
            latencies.append(time.perf_counter() - due)
            if on_loop:
                done.set_result(None)
            else:
                loop.call_soon_threadsafe(done.set_result, None)

        producer.produce(topic, None, BODY, acked)
        await done

    try:
        return await _paced("rd-loop" if on_loop else "rd-thread", records, send, kafka_pid)
    finally:
        await asyncio.to_thread(producer.close)


async def _aiokafka(bootstrap: str, topic: str, records: int, kafka_pid: int | None) -> str:
    try:
        from aiokafka import AIOKafkaProducer
    except ImportError:
        raise SystemExit(INSTALL_HINT) from None
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True, linger_ms=0)
    await producer.start()
    try:
        for _ in range(50):
            await (await producer.send(topic, BODY))

        async def send(due: float, latencies: list[float]) -> None:
            await (await producer.send(topic, BODY))
            latencies.append(time.perf_counter() - due)

        return await _paced("aio", records, send, kafka_pid)
    finally:
        await producer.stop()


async def _main(args: argparse.Namespace) -> None:
    config = KafkaConfig(bootstrap=args.bootstrap, namespace="probe-inloop")
    topic = config.topic("records")
    ensure_topics(config, {topic: (1, {})})
    kafka_pid = _listener_pid(args.bootstrap)
    try:
        for _ in range(args.rounds):
            for mode in MODES:
                if mode == "aio":
                    line = await _aiokafka(args.bootstrap, topic, args.records, kafka_pid)
                else:
                    line = await _librdkafka(config, topic, args.records, mode == "rd-loop",
                                             kafka_pid)
                print(line, flush=True)
    finally:
        drop_namespace(config)  # the Kafka may be shared


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--bootstrap", required=True, help="a running Kafka, HOST:PORT")
    ap.add_argument("--records", type=int, default=10_000, help="records per run (10,000)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the three (2)")
    event_loop.run(_main(ap.parse_args()))


if __name__ == "__main__":
    main()
