"""`kafka_io.answers`: whether a Kafka is there, which every command asks before its work (and
exits 3 on no). A port that accepts and then says nothing, or says something that is not Kafka,
must read as no Kafka, within the timeout given, never as a hang or a yes: a TCP accept is not
an answer (the crowded shared Kafka of 2026-11-26 accepted, then answered a metadata request in
3-15 s)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from broker.kafka_io import answers


@pytest.fixture(name="listener")
def _listener() -> Iterator[tuple[socket.socket, list[socket.socket]]]:
    """A port that accepts connections and keeps them; the test says what it sends."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield server, accepted
    server.close()
    for conn in accepted:
        conn.close()


def _address(server: socket.socket) -> str:
    host, port = server.getsockname()[:2]
    return f"{host}:{port}"


def test_the_suites_kafka_answers(kafka_bootstrap: str) -> None:
    assert answers(kafka_bootstrap, timeout_s=10)


def test_a_closed_port_is_no_kafka() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = _address(server)
    assert not answers(address, timeout_s=2)


def test_a_port_that_accepts_and_says_nothing_is_no_kafka(
        listener: tuple[socket.socket, list[socket.socket]]) -> None:
    server, accepted = listener
    assert not answers(_address(server), timeout_s=2)
    assert accepted  # it was asked, and got no answer: not refused


def test_a_port_that_answers_nonsense_is_no_kafka(
        listener: tuple[socket.socket, list[socket.socket]]) -> None:
    server, accepted = listener
    stop = threading.Event()

    def babble() -> None:  # whatever it is asked, bytes that are no Kafka response
        while not stop.wait(0.05):
            for conn in list(accepted):
                try:
                    conn.sendall(b"\x00\x00\x00\x04HTTP")
                except OSError:
                    accepted.remove(conn)

    threading.Thread(target=babble, daemon=True).start()
    try:
        assert not answers(_address(server), timeout_s=2)
    finally:
        stop.set()
