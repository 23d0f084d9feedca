"""A real `groupbuy serve` and a headless Chromium driving it (the browser tests and the
screenshot command).

Chromium and chromedriver are Debian's (`apt-get install -y chromium chromium-driver`),
driven by Selenium 4 (a test dependency). The service runs on the embedded default
(SQLite, its own engine) in a directory of its own, with known keys, and is stopped by
its PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

import groupbuy
from groupbuy.settings import ROLES
from tests.support.servers import free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "apt-get install -y chromium chromium-driver"
WIDTH, HEIGHT = 1280, 800
DEAD_PORT = 9  # discard: nothing listens on loopback here
WAIT_S = 15.0  # longest a page, an element or the service may take to be there

# The keys the service under test accepts, by role (a role the settings do not know yet
# is left out, so the same list serves before and after it exists).
KEYS: dict[str, str] = {
    role: f"{role}-browser-test-key" for role in ("admin", "service", "viewer") if role in ROLES
}


def missing() -> str | None:
    """Why no browser can run here, or None when Chromium and chromedriver are installed."""
    absent = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if not absent:
        return None
    return f"{' and '.join(absent)} missing: {INSTALL}"


def bearer(role: str) -> dict[str, str]:
    """The Authorization header of the role's key."""
    return {"Authorization": f"Bearer {KEYS[role]}"}


@dataclass
class Served:
    """A running `groupbuy serve`: its URL, process, and output file."""

    url: str
    process: subprocess.Popen[bytes]
    output: Path

    def text(self) -> str:
        """Everything the process printed so far."""
        return self.output.read_text(errors="replace")


@contextlib.contextmanager
def serve(directory: Path, **variables: str) -> Iterator[Served]:
    """`groupbuy serve` (the command line, a process of its own) on a free loopback port,
    its files under `directory`, answering /healthz; SIGTERM by PID at the end (SIGKILL if
    it has not stopped within 30 s). `variables` are more GROUPBUY_* settings."""
    port = free_port()
    package_root = str(Path(groupbuy.__file__).resolve().parent.parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
        "GROUPBUY_REDIS_URL": "",
        "GROUPBUY_API_KEYS": ",".join(f"{role}:{key}" for role, key in KEYS.items()),
        "GROUPBUY_EMBEDDED_DATA_DIR": str(directory / "data"),
        "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{directory / 'groupbuy.db'}",
        **variables,
    }
    output = directory / f"serve-{port}.log"
    with output.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "groupbuy.cli", "serve", "--host", "127.0.0.1"]
            + ["--port", str(port)],
            cwd=directory,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    served = Served(f"http://127.0.0.1:{port}", process, output)
    try:
        _wait_healthy(served)
        yield served
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()


def _wait_healthy(served: Served) -> None:
    deadline = time.monotonic() + 60
    while True:
        if served.process.poll() is not None:
            raise RuntimeError(f"serve exited with {served.process.returncode}:\n{served.text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{served.url}/healthz", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"serve did not answer /healthz within 60 s:\n{served.text()}")
        time.sleep(0.05)


def start_chromium() -> webdriver.Chrome:
    """A headless Chromium whose pages are WIDTH x HEIGHT, keeping its console log."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={WIDTH},{HEIGHT}")
    # The network is cut but for loopback (Chromium never sends loopback through a proxy):
    # every other host goes to a proxy nobody runs, so a page that needs one fails loudly.
    options.add_argument(f"--proxy-server=http://127.0.0.1:{DEAD_PORT}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=DriverService(str(CHROMEDRIVER)))
    # --window-size counts the window's frame: the page itself gets WIDTH x HEIGHT this way.
    metrics = {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    return driver


def console_entries(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """The console entries the browser logged since the last call (each read once)."""
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return entries


@dataclass
class Browser:
    """A Chromium on one service: open its pages, find elements, read the console log."""

    driver: webdriver.Chrome
    base_url: str
    console: list[dict[str, Any]] = field(default_factory=list)

    def open(self, path: str) -> None:
        """Load `path` of the service and wait until the document has loaded; then no
        SEVERE entry may be in the console log (AssertionError naming them)."""
        self.driver.get(f"{self.base_url}{path}")
        self.wait_for(
            lambda: self.driver.execute_script("return document.readyState") == "complete",
            path,
        )
        self.assert_clean_console(f"after loading {path}")

    def assert_clean_console(self, when: str = "") -> None:
        """AssertionError listing the SEVERE console entries logged so far, if any."""
        errors = self.severe()
        assert not errors, f"browser console errors {when}:\n" + "\n".join(errors)

    def wait_for(self, condition: Any, what: str = "the page") -> Any:
        """Wait (at most WAIT_S) until `condition()` is truthy; its value."""
        return WebDriverWait(self.driver, WAIT_S).until(
            lambda _driver: condition(), f"{what} did not come within {WAIT_S:g} s"
        )

    def element(self, css: str) -> Any:
        """The first element matching `css`, once it is displayed."""
        return self.wait_for(
            lambda: next(
                (e for e in self.driver.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()),
                None,
            ),
            css,
        )

    def read_console(self) -> list[dict[str, Any]]:
        """The console entries logged since the last read (added to `console`)."""
        entries = console_entries(self.driver)
        self.console.extend(entries)
        return entries

    def severe(self) -> list[str]:
        """Every SEVERE console entry so far, as text (a page's error, a failed load)."""
        self.read_console()
        return [entry["message"] for entry in self.console if entry["level"] == "SEVERE"]


def sign_in(browser: Browser, key: str, path: str = "/console") -> None:
    """Sign in to the console with `key` through its stable hooks (`form#signin`,
    `input[name=key]`), starting at `path`; returns once the sign-in form is gone."""
    browser.open(path)
    form = browser.element("form#signin")
    field_ = form.find_element(By.CSS_SELECTOR, "input[name=key]")
    field_.clear()
    field_.send_keys(key)
    form.submit()
    browser.wait_for(
        lambda: not browser.driver.find_elements(By.CSS_SELECTOR, "form#signin"),
        "the page after signing in",
    )
    browser.assert_clean_console("after signing in")
