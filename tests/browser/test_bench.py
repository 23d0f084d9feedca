"""The bench itself: a console error fails the check, and other hosts are out of reach (so
a page that loads anything from a CDN fails its test)."""

from __future__ import annotations

import pytest
from selenium.common.exceptions import WebDriverException

from tests.support.browser import Browser, console_entries


def test_a_console_error_fails_the_page(browser: Browser) -> None:
    with pytest.raises(AssertionError, match="404"):
        browser.open("/no-such-page")  # Chromium logs the 404 as a SEVERE entry
    browser.console.clear()  # seen: not the end-of-test failure


def test_other_hosts_are_out_of_reach(browser: Browser) -> None:
    with pytest.raises(WebDriverException, match="ERR_PROXY_CONNECTION_FAILED"):
        browser.driver.get("http://example.com/")
    browser.driver.get("about:blank")
    console_entries(browser.driver)  # the failed load, expected here
