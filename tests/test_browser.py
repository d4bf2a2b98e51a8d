"""The browser fixture itself: loopback pages load, anything else never leaves the machine."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.browser import requests_outside

MARKER = "served-by-the-test"


class _Server:
    """An HTTP server on `host`, port 0, counting the requests that reach it."""

    def __init__(self, host: str) -> None:
        hits: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                body = f"<html><body><p id=m>{MARKER}</p></body></html>".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.hits = hits
        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _outside_address() -> str:
    """This machine's address on its network (not loopback); no packet is sent to find it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.123", 9))  # TEST-NET-1: routing picks the outward interface
        address = str(s.getsockname()[0])
    assert not address.startswith("127."), "this machine has no address but loopback"
    return address


@pytest.fixture(name="server")
def _server(request: pytest.FixtureRequest) -> Iterator[_Server]:
    server = _Server(request.param)
    yield server
    server.close()


@pytest.mark.parametrize("server", ["127.0.0.1"], indirect=True)
def test_a_loopback_page_loads(browser: Any, server: _Server) -> None:
    """A server a test runs on loopback is reachable (the web console's tests need this)."""
    requests_outside(browser)
    browser.get(f"http://127.0.0.1:{server.port}/page")
    assert browser.find_element("id", "m").text == MARKER
    assert server.hits[0] == "/page"  # (Chrome may ask for /favicon.ico after)
    assert requests_outside(browser) == []


def test_a_request_off_the_machine_never_arrives(browser: Any) -> None:
    """A page on this machine's own network address is refused: the request never reaches it."""
    server = _Server("0.0.0.0")
    try:
        url = f"http://{_outside_address()}:{server.port}/page"
        requests_outside(browser)
        try:
            browser.get(url)
        except Exception as exc:  # selenium raises on a failed navigation in some versions
            assert "ERR_" in str(exc), exc
        assert MARKER not in browser.page_source
        assert server.hits == []
        assert url in requests_outside(browser)
    finally:
        server.close()
