"""`/` and `/docs` in a real browser: what they show, the links, try-it-out with a key, and
that nothing they load comes from another host (the bench's Chromium has no network but
loopback)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from selenium.webdriver.common.by import By

from groupbuy import __version__
from groupbuy.api.pages import LINKS
from tests.support.browser import KEYS, Browser, Served, bearer, sign_in

ACCOUNT_PATH = "/v1/accounts/{user_id}"


def _loaded_resources(browser: Browser) -> list[str]:
    urls: list[str] = browser.driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    return urls


def _path_of(url: str) -> str:
    return urlsplit(url).path


def _check_landing(browser: Browser, path: str) -> None:
    if path == "/docs":
        browser.element(".swagger-ui .opblock")
    elif path == "/openapi.json":
        assert json.loads(browser.element("body").text)["openapi"].startswith("3.1")
    elif path == "/metrics":
        assert "# TYPE" in browser.element("body").text
    elif path == "/docs/problems":
        assert browser.element("h1#problems").text == "Problem codes"
        assert browser.element("tr#team_full").text.startswith("team_full 409")
    else:  # the console, signed out: its sign-in
        browser.element("form#signin input[name=key]")


def test_home_names_the_service_and_its_version(browser: Browser) -> None:
    browser.open("/")
    assert browser.element("h1#service").text == "groupbuy"
    assert browser.element("#version").text == __version__
    assert browser.driver.title == f"groupbuy {__version__}"
    hrefs = [a.get_attribute("href") for a in browser.driver.find_elements(By.CSS_SELECTOR, "a")]
    assert hrefs == [f"{browser.base_url}{path}" for path, _what in LINKS]


@pytest.mark.parametrize("path", [path for path, _what in LINKS])
def test_each_link_of_home_leads_to_its_page(browser: Browser, path: str) -> None:
    browser.open("/")
    browser.element(f'a[href="{path}"]').click()
    # Signed out, /console leads on to /console/signin.
    browser.wait_for(lambda: _path_of(browser.driver.current_url).startswith(path), path)
    _check_landing(browser, path)
    browser.assert_clean_console(f"after following {path}")


def test_docs_shows_every_operation_of_the_document(
    browser: Browser, browser_service: Served
) -> None:
    document = httpx.get(f"{browser_service.url}/openapi.json").json()
    expected = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }
    browser.open("/docs")
    browser.element(".swagger-ui .opblock")
    shown = {
        (
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"),
        )
        for block in browser.driver.find_elements(By.CSS_SELECTOR, ".opblock")
    }
    assert shown == expected
    assert browser.element(".swagger-ui .info .title").text.startswith("groupbuy")
    resources = _loaded_resources(browser)
    assert any(url.endswith("/openapi.json") for url in resources), resources
    assert all(url.startswith(f"{browser.base_url}/") for url in resources), resources


def _operation(browser: Browser, method: str, path: str) -> Any:
    for block in browser.driver.find_elements(By.CSS_SELECTOR, f".opblock-{method}"):
        summary = block.find_element(By.CSS_SELECTOR, ".opblock-summary-path")
        if summary.get_attribute("data-path") == path:
            return block
    raise AssertionError(f"{method.upper()} {path} is not on the page")


def _authorize(browser: Browser, key: str) -> None:
    browser.element(".swagger-ui .btn.authorize").click()
    dialog = browser.element(".swagger-ui .modal-ux")
    dialog.find_element(By.CSS_SELECTOR, "input").send_keys(key)
    dialog.find_element(By.CSS_SELECTOR, ".auth-btn-wrapper .authorize").click()
    browser.element(".swagger-ui .modal-ux .btn-done").click()


def test_try_it_out_with_a_key_shows_the_answer(browser: Browser, browser_service: Served) -> None:
    deposit = {"amount_cents": 1234, "reference": "try-it-out"}
    answer = httpx.post(
        f"{browser_service.url}/v1/accounts/docs-reader/deposits",
        json=deposit,
        headers=bearer("admin"),
    )
    assert answer.status_code in (200, 201), answer.text
    browser.open("/docs")
    browser.element(".swagger-ui .opblock")
    _authorize(browser, KEYS["service"])
    block = _operation(browser, "get", ACCOUNT_PATH)
    block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    browser.wait_for(
        lambda: block.find_elements(By.CSS_SELECTOR, ".try-out__btn"), "Try it out"
    ).pop().click()
    block.find_element(By.CSS_SELECTOR, 'input[placeholder="user_id"]').send_keys("docs-reader")
    block.find_element(By.CSS_SELECTOR, ".execute").click()
    status = browser.wait_for(
        lambda: block.find_elements(
            By.CSS_SELECTOR, ".live-responses-table tr.response .response-col_status"
        ),
        "the answer",
    )
    assert status[0].text.strip() == "200"
    body = block.find_element(
        By.CSS_SELECTOR, ".live-responses-table tr.response .response-col_description pre"
    )
    shown = json.loads(body.text)
    assert shown["user_id"] == "docs-reader" and shown["balance_cents"] == 1234, shown
    curl = block.find_element(By.CSS_SELECTOR, ".curl-command").text
    assert "Authorization: Bearer" in curl


def test_without_a_key_try_it_out_shows_the_401(browser: Browser) -> None:
    browser.open("/docs")
    block = _operation(browser, "get", ACCOUNT_PATH)
    block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    browser.wait_for(
        lambda: block.find_elements(By.CSS_SELECTOR, ".try-out__btn"), "Try it out"
    ).pop().click()
    block.find_element(By.CSS_SELECTOR, 'input[placeholder="user_id"]').send_keys("nobody")
    block.find_element(By.CSS_SELECTOR, ".execute").click()
    status = browser.wait_for(
        lambda: block.find_elements(
            By.CSS_SELECTOR, ".live-responses-table tr.response .response-col_status"
        ),
        "the answer",
    )
    assert status[0].text.strip() == "401"
    # The browser logs the failed fetch itself; that entry is the one expected here.
    entries = [e["message"] for e in browser.read_console() if e["level"] == "SEVERE"]
    assert all("401" in message for message in entries), entries
    browser.console.clear()


@pytest.mark.parametrize("role", ["admin", "viewer"])
def test_sign_in_reaches_the_console(browser: Browser, role: str) -> None:
    sign_in(browser, KEYS[role])
    assert _path_of(browser.driver.current_url) == "/console"
    browser.open("/console/events")  # signed in: the page itself, not the sign-in
    assert _path_of(browser.driver.current_url) == "/console/events"
    assert not browser.driver.find_elements(By.CSS_SELECTOR, "form#signin")
