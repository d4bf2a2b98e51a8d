"""Delivery reports served on the event loop (broker/report_pipe.py, `KafkaProducer.
serve_reports_on`), against the real Kafka: the report's callback runs on the loop's thread,
woken by librdkafka's pipe rather than by a poll thread, from the first report after the
take-over; a wait for Kafka on the loop's own thread (`produce_sync`, or a wait nothing
announced) still ends, served by the parked poll thread; a broker serves its journal's reports
on its loop; and a handle that is not the producer the pipe was asked for is refused, not
used."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import version as confluent_version

from adapters.app import BrokerApp
from adapters.client.pubsub_client import PubsubClient
from broker.kafka_io import KafkaConfig, Position, ensure_topics
from broker.kafka_producer import KafkaProducer
from broker.report_pipe import ReportPipe

pytestmark = pytest.mark.kafka


def _topic(config: KafkaConfig) -> str:
    topic = config.topic("reports")
    ensure_topics(config, {topic: (1, {})})
    return topic


def test_reports_run_on_the_loop_thread_woken_by_the_pipe(kafka_config: KafkaConfig) -> None:
    topic = _topic(kafka_config)

    async def main() -> list[tuple[int, object]]:
        loop = asyncio.get_running_loop()
        producer = KafkaProducer(kafka_config)
        try:
            assert producer.serve_reports_on(loop)
            seen: list[tuple[int, object]] = []
            done = asyncio.Event()

            def report(err: Exception | None, pos: Position | None) -> None:
                seen.append((threading.get_ident(), err or pos))
                if len(seen) == 20:
                    done.set()  # on the loop's thread, or this would not be safe

            for n in range(20):
                producer.produce(topic, None, b"r%d" % n, report)
                await asyncio.sleep(0.01)  # one at a time: each report alone on the queue
            await asyncio.wait_for(done.wait(), 30)
            return seen
        finally:
            producer.close()

    seen = asyncio.run(main())
    assert {who for who, _ in seen} == {threading.get_ident()}
    assert [pos.offset for _, pos in seen] == sorted(pos.offset for _, pos in seen)  # type: ignore[union-attr]


def test_the_first_report_after_the_take_over_runs_on_the_loop(kafka_config: KafkaConfig) -> None:
    """Until `serve_reports_on`, the poll thread serves, 50 ms a poll; one it is inside when
    the loop takes over would serve a report that comes meanwhile on its own thread. So the
    take-over returns once that thread has parked, and a record produced at once is reported
    on the loop. Ten producers, each warmed so that Kafka answers well within one poll."""
    topic = _topic(kafka_config)

    async def main() -> set[int]:
        loop = asyncio.get_running_loop()
        threads: set[int] = set()
        for _ in range(10):
            producer = KafkaProducer(kafka_config)
            try:
                producer.produce_sync(topic, None, b"warm")  # served by the poll thread
                assert producer.serve_reports_on(loop)
                reported: asyncio.Future[None] = loop.create_future()

                def report(err: Exception | None, pos: Position | None,
                           reported: asyncio.Future[None] = reported) -> None:
                    threads.add(threading.get_ident())
                    loop.call_soon_threadsafe(reported.set_result, None)

                producer.produce(topic, None, b"first", report)
                await asyncio.wait_for(reported, 30)
            finally:
                producer.close()
        return threads

    assert asyncio.run(main()) == {threading.get_ident()}


def test_a_wait_for_kafka_on_the_loop_thread_still_ends(kafka_config: KafkaConfig) -> None:
    """`produce_sync` on the loop's thread wakes the poll thread to serve its report; a wait
    nobody announced (a blocked loop) is served once the loop has not served for a while."""
    topic = _topic(kafka_config)

    async def main() -> tuple[Position, bool]:
        producer = KafkaProducer(kafka_config)
        try:
            assert producer.serve_reports_on(asyncio.get_running_loop())
            pos = producer.produce_sync(topic, None, b"sync")
            reported = threading.Event()
            producer.produce(topic, None, b"blocked", lambda err, pos: reported.set())
            return pos, reported.wait(10)  # blocks the loop: only the poll thread can serve
        finally:
            producer.close()

    pos, reported = asyncio.run(main())
    assert pos.offset >= 0
    assert reported


def test_a_broker_serves_its_journal_reports_on_its_loop(kafka_config: KafkaConfig) -> None:
    async def main() -> set[int]:
        async with BrokerApp(kafka_config, domain="example.com") as app:
            journal = app.core.journal
            threads: set[int] = set()
            finish = journal._finish  # the journal's one callback per produced batch

            def spying(batch: object) -> None:
                threads.add(threading.get_ident())
                finish(batch)  # type: ignore[arg-type]

            journal._finish = spying  # type: ignore[method-assign]
            async with await PubsubClient.connect("127.0.0.1", app.port,
                                                  "pub@example.com") as pub:
                await pub.create_topic("q.reports")
                for n in range(5):
                    await pub.publish("q.reports", b"<q n='%d'/>" % n, "application/xml")
            # Not what the close's flush serves on its worker thread (WKT records in flight).
            journal._finish = finish  # type: ignore[method-assign]
            return set(threads)

    threads = asyncio.run(main())
    assert threads == {threading.get_ident()}


def test_a_handle_that_is_not_the_named_producer_is_refused(kafka_config: KafkaConfig) -> None:
    conf = {"bootstrap.servers": kafka_config.bootstrap}
    name = f"apexps-{uuid.uuid4().hex[:12]}"
    producer = Producer({**conf, "client.id": name})
    consumer = Consumer({**conf, "client.id": name, "group.id": name})
    try:
        version = confluent_version()
        assert ReportPipe.open(consumer, name, version) is None  # a consumer
        assert ReportPipe.open(producer, "someone-else", version) is None  # not its name
        assert ReportPipe.open(producer, name, "3.0.0") is None  # a layout not checked
        pipe = ReportPipe.open(producer, name, version)
        assert pipe is not None
        pipe.close()
    finally:
        consumer.close()
