"""The pubsub benchmark tells Kafka's CPU apart from the rest of the machine by finding the
process that listens on the bootstrap port."""

from __future__ import annotations

import os
import socket

from ops.bench.bench_pubsub import _listener_pid


def test_the_listening_process_is_found() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert _listener_pid(f"127.0.0.1:{port},127.0.0.1:1") == os.getpid()
    # closed: nobody listens there any more
    assert _listener_pid(f"127.0.0.1:{port}") is None


def test_a_bootstrap_it_cannot_read_finds_nobody() -> None:
    assert _listener_pid("no port here") is None
