"""The browser bench: one real `groupbuy serve` and one headless Chromium for the session,
a fresh `Browser` view of them per test that fails the test on any SEVERE console entry.

Without Chromium or chromedriver the tests skip, naming the apt command; with CI set they
fail instead (a CI run must not pass by skipping them)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver

from tests.support.browser import (
    Browser,
    Served,
    console_entries,
    missing,
    serve,
    start_chromium,
)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/browser is a `browser` test (`-m "not browser"` leaves them)."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def chromium() -> Iterator[webdriver.Chrome]:
    """The session's headless Chromium."""
    reason = missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {reason}")
        pytest.skip(reason)
    driver = start_chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def browser_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The session's `groupbuy serve` (SQLite, embedded engine, tests.support.browser.KEYS)."""
    with serve(tmp_path_factory.mktemp("browser-service")) as served:
        yield served


@pytest.fixture
def browser(chromium: webdriver.Chrome, browser_service: Served) -> Iterator[Browser]:
    """A Browser on the service, starting with an empty console log and no cookies; the
    test fails if a SEVERE console entry was logged by its end."""
    chromium.delete_all_cookies()
    chromium.get("about:blank")
    console_entries(chromium)  # what earlier tests left
    view = Browser(chromium, browser_service.url)
    yield view
    view.assert_clean_console("by the end of the test")
