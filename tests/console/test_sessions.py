"""Console sessions end on the server (SPEC §3 Console): after sign-out a copy of the cookie,
kept aside before, signs nobody in, in this process or another; and the cookie is `Secure`
whenever the service listens beyond loopback, unless a setting says otherwise."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.settings import Settings
from tests.support.backends import REAL
from tests.support.console import csrf_of, sign_in
from tests.support.http import ADMIN_KEY, app_services, portal

COOKIE = "groupbuy_console"


def _signs_in(client: TestClient, cookie: str) -> bool:
    """True when `cookie` alone opens the overview (a fresh browser holding a copy of it)."""
    client.cookies.clear()
    client.cookies.set(COOKIE, cookie, path="/console")
    return client.get("/console", follow_redirects=False).status_code == 200


def _sign_out(client: TestClient) -> None:
    csrf = csrf_of(client.get("/console").text)
    out = client.post("/console/signout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303, out.text


def test_a_copy_of_the_cookie_taken_before_sign_out_no_longer_signs_in(
    client: TestClient,
) -> None:
    sign_in(client, ADMIN_KEY)
    kept = client.cookies[COOKIE]
    assert _signs_in(client, kept)
    _sign_out(client)
    assert not _signs_in(client, kept)
    assert client.get("/console/live.json?page=overview").status_code == 401


@pytest.mark.parametrize("backend", [REAL])  # one Redis server that both apps reach
def test_sign_out_ends_the_session_in_every_process(settings: Settings) -> None:
    # Two apps on one Redis stand for two processes (or replicas) of one service.
    with TestClient(create_app(settings)) as first, TestClient(create_app(settings)) as second:
        sign_in(first, ADMIN_KEY)
        kept = first.cookies[COOKIE]
        assert _signs_in(second, kept)
        first.cookies.set(COOKIE, kept, path="/console")
        _sign_out(first)
        assert not _signs_in(second, kept)


def test_sign_out_ends_only_its_own_session(client: TestClient) -> None:
    sign_in(client, ADMIN_KEY)
    other = client.cookies[COOKIE]
    client.cookies.clear()
    sign_in(client, ADMIN_KEY)
    mine = client.cookies[COOKIE]
    _sign_out(client)
    assert not _signs_in(client, mine)
    assert _signs_in(client, other)


def test_a_session_lives_in_redis_as_long_as_the_cookie(client: TestClient) -> None:
    sign_in(client, ADMIN_KEY)
    services = app_services(client)
    keys = portal(client).call(services.redis.keys, f"{services.keys.prefix}:console_session:*")
    assert len(keys) == 1
    ttl = portal(client).call(services.redis.ttl, keys[0])
    assert 28_700 < ttl <= 28_800  # [console] session_max_age_s
    _sign_out(client)
    assert portal(client).call(services.redis.exists, keys[0]) == 0


@pytest.mark.parametrize(
    ("host", "https_only", "secure"),
    [
        ("127.0.0.1", None, False),
        ("localhost", None, False),
        ("::1", None, False),
        ("0.0.0.0", None, True),
        ("::", None, True),
        ("10.1.2.3", None, True),
        ("shop.internal", None, True),
        ("0.0.0.0", False, False),  # forced off: behind a proxy on plain HTTP, say
        ("127.0.0.1", True, True),  # forced on: a loopback port behind an HTTPS proxy
    ],
)
def test_the_cookie_is_secure_beyond_loopback_unless_set(
    settings: Settings, host: str, https_only: bool | None, secure: bool
) -> None:
    chosen = settings.replace("server", host=host).replace("console", https_only=https_only)
    with TestClient(create_app(chosen), base_url="https://testserver") as client:
        cookie = sign_in(client, ADMIN_KEY).headers["set-cookie"].lower()
    assert ("; secure" in cookie) is secure, cookie
