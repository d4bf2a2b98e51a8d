"""The live console at the gateway's `/`, in the real headless browser (tests/browser.py): the
page lists the topics, subscribes from its form, and shows each delivery as a row with its link
seq; when its network is cut while messages are published, EventSource reconnects with
Last-Event-ID and the missed rows arrive, each once; the page asks for nothing outside the
machine. A resource watch from the same form shows its Notifies (seq, state, reason, events)
the same way, and a watch that expires shows as ended. The broker and gateway run on a loop in
a thread of their own (selenium blocks)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from broker.kafka_io import KafkaConfig
from broker.records import PublishType
from tests.apex.tcp_proxy import TcpProxy
from tests.browser import console_errors, requests_outside
from tests.gateway.live import Bench, bench

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

T = TypeVar("T")
WAIT = 60.0


class _Loop:
    """An event loop in a thread: `call` runs a coroutine there and waits for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT * 2)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@contextlib.contextmanager
def _stack(config: KafkaConfig) -> Iterator[tuple[_Loop, Bench, TcpProxy]]:
    """Broker, gateway and a proxy the browser goes through, on the thread's loop."""
    runner = _Loop()
    ready: asyncio.Future[tuple[Bench, TcpProxy]] = runner.loop.create_future()
    done = asyncio.Event()

    async def hold() -> None:
        async with bench(config) as b:
            proxy = await TcpProxy(b.gateway.port).start()
            ready.set_result((b, proxy))
            await done.wait()
            await proxy.close()

    async def started() -> tuple[Bench, TcpProxy]:
        return await ready

    task = asyncio.run_coroutine_threadsafe(hold(), runner.loop)
    try:
        b, proxy = runner.call(started())
        yield runner, b, proxy
    finally:
        runner.loop.call_soon_threadsafe(done.set)
        task.result(WAIT)
        runner.close()


def _until(check: Callable[[], T], what: str) -> T:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(None, WAIT, poll_frequency=0.05).until(  # type: ignore[arg-type]
        lambda _: check(), message=f"waiting for {what}")


def _rows(driver: Any) -> list[tuple[int, str]]:
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#rows tr')].map("
        "r => [Number(r.dataset.seq), r.children[4].textContent]);")
    return [(int(seq), content) for seq, content in cells]


def test_console_subscribes_shows_rows_and_fills_in_after_a_cut(
        kafka_config: KafkaConfig, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    with _stack(kafka_config) as (runner, b, proxy):
        async def publish(lo: int, hi: int) -> None:
            await b.publish("web.console", lo, hi)

        async def setup() -> None:
            await b.pub.create_topic("web.console")

        runner.call(setup())
        console_errors(browser)
        requests_outside(browser)
        browser.get(f"http://127.0.0.1:{proxy.port}/")
        _until(lambda: "web.console" in browser.find_element(By.ID, "topics").text, "topics")
        browser.find_element(By.ID, "topic").send_keys("web.console")
        browser.find_element(By.ID, "go").click()
        state = browser.find_element(By.ID, "state")
        _until(lambda: state.get_attribute("data-state") == "open", "the stream to open")
        runner.call(publish(0, 3))
        _until(lambda: len(_rows(browser)) == 3, "three rows")
        assert _rows(browser) == [(1, "m0"), (2, "m1"), (3, "m2")]

        # the network goes: the page's stream is cut and reconnects fail meanwhile
        proxy.refusing = True
        runner.loop.call_soon_threadsafe(proxy.cut)
        _until(lambda: state.get_attribute("data-state") == "connecting", "the cut to show")
        runner.call(publish(3, 6))
        sub = browser.find_element(By.ID, "sub").text
        feed = b.gateway.feeds.feeds[sub]
        _until(lambda: feed.buffer.last == 6, "the gateway to hold the missed messages")
        assert len(_rows(browser)) == 3
        proxy.refusing = False
        _until(lambda: len(_rows(browser)) >= 6, "the missed rows")
        _until(lambda: state.get_attribute("data-state") == "open", "the stream to reopen")
        assert browser.find_element(By.ID, "reconnects").text == "1"

        # the gateway drops the stream itself (its test hook): reconnect at once, no repeats
        runner.loop.call_soon_threadsafe(b.gateway.drop_streams, sub)
        _until(lambda: browser.find_element(By.ID, "reconnects").text == "2", "a reconnect")
        runner.call(publish(6, 8))
        _until(lambda: len(_rows(browser)) >= 8, "the last rows")
        assert _rows(browser) == [(k + 1, f"m{k}") for k in range(8)]
        assert requests_outside(browser) == []
        # the cut streams end mid-chunk, by design; nothing else may have gone wrong
        assert [e for e in console_errors(browser) if "/events " not in e] == []




def _notifies(driver: Any) -> list[tuple[int, str, str, str, str]]:
    """The Notify rows: (link seq, state, reason, events, content)."""
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#notifies tr')].map("
        "r => [Number(r.dataset.seq), ...[2, 3, 4, 5].map(k => r.children[k].textContent)]);")
    return [(int(seq), state, reason, events, content)
            for seq, state, reason, events, content in cells]


def test_console_watches_a_resource_and_fills_in_after_a_cut(
        kafka_config: KafkaConfig, browser: Any) -> None:
    """Figure 6 in the page: a watch of web.watch/item (created, modified) from the form; a new
    message-id shows as created, an update as modified; Notifies missed while the network was
    cut arrive once after the reconnect; a watch of one second ends with a terminated row."""
    from selenium.webdriver.common.by import By

    with _stack(kafka_config) as (runner, b, proxy):
        async def setup() -> None:
            await b.pub.create_topic("web.watch")

        async def publish(kind: PublishType, content: str) -> None:
            await b.pub.publish("web.watch", content.encode(), "text/plain", publish_type=kind,
                                message_id="item", implicit=False)

        runner.call(setup())
        console_errors(browser)
        requests_outside(browser)
        browser.get(f"http://127.0.0.1:{proxy.port}/")
        _until(lambda: "web.watch" in browser.find_element(By.ID, "topics").text, "topics")
        browser.find_element(By.ID, "resource").send_keys("web.watch/item")
        browser.find_element(By.CSS_SELECTOR, "input.event[value=deleted]").click()  # off
        browser.find_element(By.ID, "go").click()
        state = browser.find_element(By.ID, "state")
        _until(lambda: state.get_attribute("data-state") == "open", "the stream to open")
        # the current state first: the resource has none yet
        _until(lambda: len(_notifies(browser)) == 1, "the current-state Notify")
        (first,) = _notifies(browser)
        assert first[1:] == ("active", "", "current", "")
        watch = browser.find_element(By.ID, "watch")
        assert watch.get_attribute("data-state") == "active"

        runner.call(publish(PublishType.IMAGE, "v1"))
        _until(lambda: len(_notifies(browser)) == 2, "the created Notify")
        runner.call(publish(PublishType.UPDATE, "v2"))
        _until(lambda: len(_notifies(browser)) == 3, "the modified Notify")
        s0 = first[0]
        assert _notifies(browser)[1:] == [(s0 + 1, "active", "", "created", "v1"),
                                          (s0 + 2, "active", "", "modified", "v2")]

        # the network goes; two updates meanwhile; back, they arrive once each
        proxy.refusing = True
        runner.loop.call_soon_threadsafe(proxy.cut)
        _until(lambda: state.get_attribute("data-state") == "connecting", "the cut to show")
        runner.call(publish(PublishType.UPDATE, "v3"))
        runner.call(publish(PublishType.UPDATE, "v4"))
        feed = b.gateway.feeds.feeds[browser.find_element(By.ID, "sub").text]
        _until(lambda: feed.buffer.last == s0 + 4, "the gateway to hold the missed Notifies")
        assert len(_notifies(browser)) == 3
        proxy.refusing = False
        _until(lambda: len(_notifies(browser)) >= 5, "the missed Notifies")
        _until(lambda: state.get_attribute("data-state") == "open", "the stream to reopen")
        assert browser.find_element(By.ID, "reconnects").text == "1"
        assert _notifies(browser)[3:] == [(s0 + 3, "active", "", "modified", "v3"),
                                          (s0 + 4, "active", "", "modified", "v4")]

        # a watch of one second: its current state, then it ends, and the page says so
        expires = browser.find_element(By.ID, "expires")
        expires.clear()
        expires.send_keys("1")
        browser.find_element(By.ID, "go").click()
        _until(lambda: watch.get_attribute("data-state") == "ended", "the watch to end")
        current, last = _notifies(browser)[5:]
        assert current[1:] == ("active", "", "current", "v4")
        assert last[1:3] == ("terminated", "timeout")
        assert browser.find_element(By.CSS_SELECTOR, "#notifies tr:last-child"
                                    ).get_attribute("class") == "notify ended"
        _until(lambda: state.get_attribute("data-state") == "ended", "the stream's end")
        assert watch.text == "ended: timeout"
        assert requests_outside(browser) == []
        assert [e for e in console_errors(browser) if "/events " not in e] == []
