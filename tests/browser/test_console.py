"""The console in a real browser: every page opens clean, numbers change on screen while
the API locks seats and grabs shares (no reload), an admin closes an activity with a
reason and finds it audited, a viewer sees no action form, and a signed-out address comes
back after the sign-in."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.expected_conditions import staleness_of

from tests.support.browser import KEYS, Browser, Served, bearer, sign_in

# The activity body's live counts: when the service under test carries none, the live
# counts test has nothing to watch.
COUNTS = ("teams_open", "teams_formed", "teams_failed", "members", "live_locks")


@pytest.fixture
def api(browser_service: Served) -> Iterator[httpx.Client]:
    """An HTTP client on the bench's service."""
    with httpx.Client(base_url=browser_service.url, timeout=30) as client:
        yield client


def _call(api: httpx.Client, method: str, path: str, role: str, **body: Any) -> Any:
    answer = api.request(method, path, json=body or None, headers=bearer(role))
    assert answer.status_code in (200, 201), (method, path, answer.status_code, answer.text)
    return answer.json()


def _fresh(prefix: str) -> str:
    """An id no other test of the session's service uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _activity(api: httpx.Client, size: int = 3) -> tuple[str, str]:
    """A new activity of `size` with one team opened by its leader: their ids."""
    aid, tid = _fresh("act"), "t1"
    _call(api, "POST", "/v1/activities", "admin", activity_id=aid, team_size=size)
    _call(api, "POST", f"/v1/activities/{aid}/teams", "service", leader_id="lead", team_id=tid)
    return aid, tid


def _packet(api: httpx.Client, count: int = 4) -> str:
    """A new funded red packet of `count` shares, none grabbed: its id."""
    pid, sender = _fresh("pk"), _fresh("sender")
    deposit = {"amount_cents": 100 * count, "reference": pid}
    _call(api, "POST", f"/v1/accounts/{sender}/deposits", "admin", **deposit)
    body = {"sender_id": sender, "amount_cents": 100 * count, "count": count, "packet_id": pid}
    _call(api, "POST", "/v1/redpackets", "service", **body)
    return pid


def _flush(api: httpx.Client) -> None:
    """Write the records behind to SQL now (the lists read SQL)."""
    _call(api, "POST", "/v1/admin/jobs/flush_records/run", "admin")


def _field(browser: Browser, hook: str, field: str) -> str:
    text: str = browser.element(f'[{hook}] [data-field="{field}"]').text
    return text


def _wait_field(browser: Browser, hook: str, field: str, expected: object) -> None:
    """Wait (bounded) until the page shows `expected` in the field, without a reload."""
    browser.wait_for(
        lambda: _field(browser, hook, field) == str(expected),
        f"{field} = {expected} on {hook}",
    )


def _mark(browser: Browser) -> str:
    """Set a marker on `window` that a reload would lose."""
    marker = uuid.uuid4().hex
    browser.driver.execute_script("window.consoleTestMarker = arguments[0];", marker)
    return marker


def _assert_not_reloaded(browser: Browser, marker: str) -> None:
    kept = browser.driver.execute_script("return window.consoleTestMarker;")
    assert kept == marker, "the page was reloaded"


def _wait_live(browser: Browser) -> None:
    """Wait until the page's live stream (or its polling) is on."""
    browser.wait_for(
        lambda: (
            browser.element("[data-live-state]").text.split(" ")[0] == "live"
            and "on" in (browser.element("[data-live-state]").get_attribute("class") or "")
        ),
        "live updates",
    )


def _pages(api: httpx.Client) -> list[tuple[str, str]]:
    """Every console page (path, a selector it shows) over fresh data."""
    aid, tid = _activity(api)
    _call(api, "POST", f"/v1/activities/{aid}/teams/{tid}/locks", "service", user_id="u1")
    pid = _packet(api)
    _call(api, "POST", f"/v1/redpackets/{pid}/grab", "service", user_id="g1")
    _flush(api)
    return [
        ("/console", "h1"),
        ("/console/activities", f'[data-activity="{aid}"]'),
        (f"/console/activities/{aid}", f'[data-activity="{aid}"]'),
        (f"/console/activities/{aid}?teams=full", f'[data-activity="{aid}"]'),
        (f"/console/activities/{aid}/teams/{tid}", ".timeline"),
        ("/console/redpackets", f'[data-packet="{pid}"]'),
        (f"/console/redpackets/{pid}", f'[data-packet="{pid}"]'),
        ("/console/events", "[data-events]"),
        ("/console/integrity", "h1"),
        ("/console/webhooks", "h1"),
        ("/console/audit", "h1"),
        ("/console/blocked-users", "h1"),
    ]


def test_every_console_page_opens_without_a_console_error(
    browser: Browser, api: httpx.Client
) -> None:
    pages = _pages(api)
    sign_in(browser, KEYS["admin"])
    for path, shown in pages:
        browser.open(path)
        browser.element(shown)
        assert browser.driver.find_elements(By.CSS_SELECTOR, "header.top nav a[href]")
        browser.assert_clean_console(f"on {path}")


def test_a_packets_remaining_count_changes_on_screen(browser: Browser, api: httpx.Client) -> None:
    pid = _packet(api, count=4)
    _flush(api)
    sign_in(browser, KEYS["admin"])
    for path, hook in (
        (f"/console/redpackets/{pid}", f'data-packet="{pid}"'),
        ("/console/redpackets", f'data-packet="{pid}"'),
    ):
        browser.open(path)
        _wait_live(browser)
        marker = _mark(browser)
        shown = int(_field(browser, hook, "remaining_count"))
        for _ in range(2):
            grabbed = _call(
                api, "POST", f"/v1/redpackets/{pid}/grab", "service", user_id=_fresh("g")
            )
            assert grabbed["remaining_count"] == shown - 1
            shown -= 1
            _wait_field(browser, hook, "remaining_count", shown)
        cents = _call(api, "GET", f"/v1/redpackets/{pid}", "service")["remaining_cents"]
        _wait_field(browser, hook, "remaining_cents", cents)
        _assert_not_reloaded(browser, marker)
    for _ in range(shown):
        _call(api, "POST", f"/v1/redpackets/{pid}/grab", "service", user_id=_fresh("g"))
    _wait_field(browser, f'data-packet="{pid}"', "status", "sold_out")


def test_an_activitys_counts_change_on_screen(browser: Browser, api: httpx.Client) -> None:
    aid, tid = _activity(api, size=4)
    body = _call(api, "GET", f"/v1/activities/{aid}", "service")
    assert set(COUNTS) <= set(body), f"the activity body carries no live counts: {body}"
    sign_in(browser, KEYS["admin"])
    for path in (f"/console/activities/{aid}", "/console/activities"):
        hook = f'data-activity="{aid}"'
        browser.open(path)
        _wait_live(browser)
        marker = _mark(browser)
        user = _fresh("u")
        before = _call(api, "GET", f"/v1/activities/{aid}", "service")
        _call(api, "POST", f"/v1/activities/{aid}/teams/{tid}/locks", "service", user_id=user)
        _wait_field(browser, hook, "live_locks", before["live_locks"] + 1)
        order = {"user_id": user, "order_id": _fresh("o")}
        _call(api, "POST", f"/v1/activities/{aid}/teams/{tid}/members", "service", **order)
        _wait_field(browser, hook, "members", before["members"] + 1)
        _wait_field(browser, hook, "live_locks", before["live_locks"])
        _assert_not_reloaded(browser, marker)
    last = _fresh("u")  # the fourth seat: the team forms
    _call(api, "POST", f"/v1/activities/{aid}/teams/{tid}/locks", "service", user_id=last)
    order = {"user_id": last, "order_id": _fresh("o")}
    _call(api, "POST", f"/v1/activities/{aid}/teams/{tid}/members", "service", **order)
    _wait_field(browser, f'data-activity="{aid}"', "teams_formed", 1)
    _wait_field(browser, f'data-activity="{aid}"', "teams_open", 0)


def test_an_activitys_sale_figures_change_on_screen(browser: Browser, api: httpx.Client) -> None:
    """The funnel's figures update without a reload: a lock taken, a refusal's code gets
    its row in the table, a confirm moves the conversion."""
    aid, tid = _activity(api, size=2)
    locks = f"/v1/activities/{aid}/teams/{tid}/locks"
    sign_in(browser, KEYS["admin"])
    browser.open(f"/console/activities/{aid}")
    _wait_live(browser)
    marker = _mark(browser)
    hook = f'data-activity="{aid}"'
    user = _fresh("u")
    _call(api, "POST", locks, "service", user_id=user)
    _wait_field(browser, hook, "locks_taken_window", 1)
    refused = api.post(locks, json={"user_id": _fresh("u")}, headers=bearer("service"))
    assert refused.status_code == 409 and refused.json()["code"] == "team_full", refused.text
    _wait_field(browser, hook, "refused_by_code.team_full", 1)
    order = {"user_id": user, "order_id": _fresh("o")}
    _call(api, "POST", f"/v1/activities/{aid}/teams/{tid}/members", "service", **order)
    _wait_field(browser, hook, "conversion", 100)
    _assert_not_reloaded(browser, marker)
    browser.assert_clean_console(f"on /console/activities/{aid}")


def test_an_admin_closes_an_activity_and_finds_it_audited(
    browser: Browser, api: httpx.Client
) -> None:
    aid, _tid = _activity(api)
    reason = f"closed early {uuid.uuid4().hex[:6]}"
    sign_in(browser, KEYS["admin"], f"/console/activities/{aid}")
    form = browser.element(f'form.action[action="/console/activities/{aid}/close"]')
    form.find_element(By.CSS_SELECTOR, "input[name=reason]").send_keys(reason)
    form.find_element(By.CSS_SELECTOR, "input[name=confirm]").click()
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    browser.wait_for(lambda: staleness_of(form)(browser.driver), "the page after the post")
    assert browser.element("[data-activity-status]").text == "closed"
    assert f"activity.close {aid}: done" in browser.element(".notice").text
    assert not browser.driver.find_elements(By.CSS_SELECTOR, "form.action")
    assert _call(api, "GET", f"/v1/activities/{aid}", "service")["status"] == "closed"
    browser.open("/console/audit")
    browser.element("tr[data-audit]")
    rows = [
        [cell.text for cell in row.find_elements(By.CSS_SELECTOR, "td")][2:5]
        for row in browser.driver.find_elements(By.CSS_SELECTOR, "tr[data-audit]")
    ]
    assert ["activity.close", aid, reason] in rows
    entries = _call(api, "GET", "/v1/admin/audit", "admin")["entries"]
    [entry] = [e for e in entries if e["action"] == "activity.close" and e["target"] == aid]
    assert entry["reason"] == reason and entry["actor"].startswith("admin:")


def test_a_viewer_sees_no_action_form(browser: Browser, api: httpx.Client) -> None:
    pages = _pages(api)
    sign_in(browser, KEYS["viewer"])
    assert "viewer" in browser.element(".who").text
    for path, shown in pages:
        browser.open(path)
        browser.element(shown)
        assert not browser.driver.find_elements(By.CSS_SELECTOR, "form.action"), path
        assert not browser.driver.find_elements(By.CSS_SELECTOR, "input[name=reason]"), path


def test_signed_out_a_console_address_leads_to_the_sign_in_and_back(browser: Browser) -> None:
    address = "/console/redpackets?status=active"
    browser.open(address)
    browser.element("form#signin input[name=key]")
    assert urlsplit(browser.driver.current_url).path == "/console/signin"
    sign_in(browser, KEYS["admin"], address)
    browser.element("h1")
    now = urlsplit(browser.driver.current_url)
    assert f"{now.path}?{now.query}" == address
