"""Sign-in: admin and viewer keys, the session cookie, the way back to the page asked for,
sign-out, and the signing secret shared by every worker."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.console.identity import safe_next, session_secret
from groupbuy.settings import Settings, load_settings
from tests.support.console import (
    VIEWER_KEY,
    assert_secure_headers,
    console_context,
    csrf_of,
    sign_in,
)
from tests.support.http import ADMIN_KEY, SERVICE_KEY

PAGES = [
    "/console",
    "/console/events?type=team.formed",
    "/console/activities/a1",
    "/console/activities/a1/teams/t1",
    "/console/redpackets/p1",
    "/console/integrity",
    "/console/webhooks",
    "/console/webhooks/e1",
    "/console/audit",
    "/console/blocked-users",
]


@pytest.mark.parametrize("page", PAGES)
def test_a_signed_out_page_leads_to_the_sign_in_and_back(client: TestClient, page: str) -> None:
    away = client.get(page, follow_redirects=False)
    assert away.status_code == 303, away.text
    assert away.headers["location"] == f"/console/signin?next={quote(page, safe='')}"
    assert_secure_headers(away)
    form = client.get(away.headers["location"])
    assert form.status_code == 200
    assert 'id="signin"' in form.text and 'name="key"' in form.text
    assert f'name="next" value="{page.replace("&", "&amp;")}"' in form.text
    signed = client.post(
        "/console/signin",
        data={"key": ADMIN_KEY, "csrf": csrf_of(form.text), "next": page},
        follow_redirects=False,
    )
    assert signed.status_code == 303, signed.text
    assert signed.headers["location"] == page


@pytest.mark.parametrize(
    "given",
    [
        "https://evil.example/console",
        "//evil.example/console",
        "/console//evil.example",
        "/consolex",
        "/console\\evil",
        "/v1/admin/dead-letters",
        "javascript:alert(1)",
        "",
    ],
)
def test_next_never_leaves_the_console(given: str) -> None:
    assert safe_next(given) == "/console"


def test_next_keeps_a_console_address_with_its_query() -> None:
    assert safe_next("/console/events?type=team.formed") == "/console/events?type=team.formed"
    assert safe_next("/console") == "/console"


def test_the_sign_in_refuses_a_redirect_out_of_the_site(client: TestClient) -> None:
    signed = sign_in(client, ADMIN_KEY, next_page="https://evil.example/")
    assert signed.status_code == 303
    assert signed.headers["location"] == "/console"


def test_a_wrong_key_is_refused_and_no_session_starts(client: TestClient) -> None:
    refused = sign_in(client, "not-a-key")
    assert refused.status_code == 401
    assert "That key is not valid." in refused.text
    assert client.get("/console", follow_redirects=False).status_code == 303


def test_a_service_key_is_refused_with_a_clear_message(client: TestClient) -> None:
    refused = sign_in(client, SERVICE_KEY)
    assert refused.status_code == 401
    assert "A service key cannot sign in to the console" in refused.text
    assert client.get("/console", follow_redirects=False).status_code == 303


@pytest.mark.parametrize("key", [ADMIN_KEY, VIEWER_KEY])
def test_admin_and_viewer_keys_sign_in(client: TestClient, key: str) -> None:
    assert sign_in(client, key).status_code == 303
    overview = client.get("/console")
    assert overview.status_code == 200
    role = "admin" if key == ADMIN_KEY else "viewer"
    assert f'<span class="who">{role} · ' in overview.text


def test_the_cookie_is_httponly_strict_expiring_and_holds_no_secret(client: TestClient) -> None:
    signed = sign_in(client, ADMIN_KEY)
    cookie = signed.headers["set-cookie"]
    flags = [part.strip().lower() for part in cookie.split(";")]
    assert "httponly" in flags
    assert "samesite=strict" in flags
    assert "max-age=28800" in flags
    assert "path=/console" in flags
    assert "secure" not in flags  # [console] https_only is off by default
    value = cookie.split(";")[0].split("=", 1)[1]
    payload = json.loads(base64.b64decode(value.split(".")[0] + "=="))
    assert payload["role"] == "admin"
    assert set(payload) == {"role", "key", "sid", "at", "csrf"}
    assert ADMIN_KEY not in cookie and ADMIN_KEY not in json.dumps(payload)


def test_https_only_makes_the_cookie_secure(settings: Settings) -> None:
    with TestClient(create_app(settings.replace("console", https_only=True))) as client:
        cookie = sign_in(client, ADMIN_KEY).headers["set-cookie"].lower()
    assert "; secure" in cookie


def test_a_sign_in_without_the_form_token_is_refused(client: TestClient) -> None:
    client.get("/console/signin")
    refused = client.post(
        "/console/signin", data={"key": ADMIN_KEY, "next": "/console"}, follow_redirects=False
    )
    assert refused.status_code == 403
    assert client.get("/console", follow_redirects=False).status_code == 303


def test_a_tampered_cookie_is_a_signed_out_visitor(client: TestClient) -> None:
    sign_in(client, ADMIN_KEY)
    value = client.cookies["groupbuy_console"]
    forged = base64.b64encode(b'{"role": "admin", "key": "x", "at": 0}').decode()
    client.cookies.clear()
    client.cookies.set("groupbuy_console", forged + value[value.index(".") :], path="/console")
    assert client.get("/console", follow_redirects=False).status_code == 303


def test_a_sign_in_older_than_the_session_age_is_over(settings: Settings) -> None:
    short = settings.replace("console", session_max_age_s=60)
    app = create_app(short)
    with TestClient(app) as client:
        sign_in(client, ADMIN_KEY)
        assert client.get("/console").status_code == 200
        gate = console_context(app).gate
        gate._clock = lambda: 10**10  # a day far beyond the sign-in
        assert client.get("/console", follow_redirects=False).status_code == 303


def test_sign_out_ends_the_session(client: TestClient) -> None:
    sign_in(client, ADMIN_KEY)
    page = client.get("/console")
    out = client.post("/console/signout", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/console/signin"
    assert client.get("/console", follow_redirects=False).status_code == 303


def test_sign_out_needs_the_form_token(client: TestClient) -> None:
    sign_in(client, ADMIN_KEY)
    refused = client.post("/console/signout", data={"csrf": "wrong"}, follow_redirects=False)
    assert refused.status_code == 403
    assert client.get("/console").status_code == 200


def test_the_signing_secret_is_shared_by_workers_and_restarts(settings: Settings) -> None:
    # Two apps with the same keys stand for two workers, or one before and after a restart.
    first, second = create_app(settings), create_app(settings)
    with TestClient(first) as client:
        sign_in(client, ADMIN_KEY)
        cookie = client.cookies["groupbuy_console"]
    with TestClient(second) as other:
        other.cookies.set("groupbuy_console", cookie, path="/console")
        assert other.get("/console").status_code == 200


def test_the_secret_comes_from_the_keys_or_the_setting() -> None:
    a1, a2 = "admin:a1-console-secret-0123", "admin:a2-console-secret-0123"
    one = load_settings(None, {"GROUPBUY_API_KEYS": a1})
    same = load_settings(None, {"GROUPBUY_API_KEYS": a1})
    other = load_settings(None, {"GROUPBUY_API_KEYS": a2})
    chosen = load_settings(None, {"GROUPBUY_API_KEYS": a1, "GROUPBUY_CONSOLE_SECRET": "s3cret"})
    assert session_secret(one) == session_secret(same)
    assert session_secret(one) != session_secret(other)
    assert "a1-console-secret" not in session_secret(one)
    assert session_secret(chosen) == "s3cret"


def test_a_removed_key_loses_its_session(settings: Settings) -> None:
    # One configured secret: only the key list differs between the two apps.
    fewer = tuple(k for k in settings.auth.api_keys if not k.startswith("viewer:"))
    trimmed = settings.replace("auth", api_keys=fewer).replace("console", secret="fixed")
    kept = settings.replace("console", secret="fixed")
    with TestClient(create_app(kept)) as client:
        sign_in(client, VIEWER_KEY)
        cookie = client.cookies["groupbuy_console"]
    with TestClient(create_app(trimmed)) as client:
        client.cookies.set("groupbuy_console", cookie, path="/console")
        assert client.get("/console", follow_redirects=False).status_code == 303
