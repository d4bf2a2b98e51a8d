"""A headless browser for tests: Debian's chromium driven through its chromium-driver by selenium.

`browser` (session-wide) is a WebDriver for pages a test opens from disk (`file://`) or from a
server it runs itself on loopback: the audit's report.html today, the web console of issue 22
later. It is one Chrome for the whole run (starting one costs a second or two); a test that
needs a clean slate navigates to `about:blank` or opens a new window.

No network. A page under test must not depend on anything outside the machine (the report
promises to open without one), and a test must not pass because a CDN happened to answer. So
every request that is not for loopback goes to a proxy on 127.0.0.1's discard port, where the
connection is refused; host names other than localhost resolve to nothing; the browser's own
background traffic (component updates, sync, first-run fetches) is switched off. Loopback stays
reachable, for servers a test starts. `requests_outside(driver)` lists the non-loopback URLs a
page asked for (they failed, but a test should still say that it tried).

Never a skip: a missing chromium, chromedriver or selenium fails the test with the command that
installs them (ops/bootstrap does, as root). Selenium is given both paths, so its own manager
never tries to download a browser or a driver.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

#: Where Debian puts them; APEXPS_CHROMIUM / APEXPS_CHROMEDRIVER point elsewhere.
CHROMIUM = os.environ.get("APEXPS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = (os.environ.get("APEXPS_CHROMEDRIVER") or shutil.which("chromedriver")
                or "/usr/bin/chromedriver")
_INSTALL = "apt-get install chromium chromium-driver (ops/bootstrap does it as root)"

#: The proxy every non-loopback request is sent to: the discard port, where nothing listens.
NOWHERE = "127.0.0.1:9"

_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
_NETWORK = {"http", "https", "ws", "wss", "ftp"}


def chrome_options(user_data_dir: Path) -> Any:
    """Headless, sandbox off (CI runs as root), no network but loopback, performance log on."""
    from selenium.webdriver.chrome.options import Options

    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",                 # root in CI: Chrome refuses its sandbox as root
        "--disable-dev-shm-usage",      # a container's /dev/shm is small
        "--disable-gpu",
        "--window-size=1280,2000",
        f"--user-data-dir={user_data_dir}",
        f"--proxy-server=http://{NOWHERE}",
        # Chrome never proxies loopback itself; everything else goes to NOWHERE and fails. And
        # should the proxy be bypassed, no name or address but loopback resolves.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1, "
        "EXCLUDE [::1]",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-sync",
        "--no-first-run",
        "--no-default-browser-check",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return options


def requests_outside(driver: Any) -> list[str]:
    """URLs of network requests since the last call (this driver's) to anywhere but loopback."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") != "Network.requestWillBeSent":
            continue
        url = message["params"]["request"]["url"]
        parts = urlsplit(url)
        # (chrome://, file:, data: and the like are the browser's own or the page's, not network)
        if parts.scheme in _NETWORK and parts.hostname not in _LOOPBACK:
            urls.append(url)
    return urls


def console_errors(driver: Any) -> list[str]:
    """The page's console messages at level SEVERE since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture(scope="session", name="browser")
def _browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A headless Chrome WebDriver with no network but loopback (fails, never skips, without it)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"no browser for the browser tests ({', '.join(missing)} missing): {_INSTALL}",
                    pytrace=False)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: pip install -e '.[dev]'", pytrace=False)
    service = Service(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(service=service,
                              options=chrome_options(tmp_path_factory.mktemp("chrome")))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
