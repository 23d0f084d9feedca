"""Key guessing is throttled (SPEC §3): after `[auth] guess_limit` failed authentications
from one client address within `guess_window_s`, that address gets 429 `rate_limited` with
`Retry-After` on every authenticated route and on the console sign-in, counted in Redis.

The throttle touches no SQL: these run on SQLite only; on fakeredis, and where every
process must see one count, on a real redis-server shared by two apps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.cli import main
from groupbuy.settings import Settings
from tests.support.backends import FAKE, REAL
from tests.support.console import csrf_of
from tests.support.http import ADMIN_KEY, SERVICE, SERVICE_KEY, assert_ok, assert_problem
from tests.support.settings import settings_for, settings_without_redis

# The throttle touches no SQL; most of it needs no real Redis either.
SQLITE = pytest.mark.parametrize("database", ["sqlite"])
ON_FAKE = pytest.mark.parametrize("backend", [FAKE])
ON_REAL = pytest.mark.parametrize("backend", [REAL])

WRONG = {"Authorization": "Bearer wrong-key-wrong-key-wrong"}
FEED = "/v1/events"  # a service read: any authenticated route would do
GUESSER = "203.0.113.7"
PROXY = "10.0.0.1"


@pytest.fixture
def make_client(redis_url: str, database_url: str) -> Iterator[Any]:
    """A factory of clients calling from `address`, their apps with these [auth] values."""
    opened: list[TestClient] = []

    def make(address: str = GUESSER, **auth: Any) -> TestClient:
        values = {"guess_limit": 10, "guess_window_s": 60, **auth}  # the defaults, not the suite's
        settings = settings_for(redis_url, database_url).replace("auth", **values)
        client = TestClient(create_app(settings), client=(address, 40000)).__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


def forwarded(address: str, headers: dict[str, str] = WRONG) -> dict[str, str]:
    return {**headers, "X-Forwarded-For": address}


def assert_refused(response: httpx.Response, window_s: int = 60) -> None:
    """429 rate_limited, with the seconds left in the window in Retry-After and the body."""
    body = assert_problem(response, 429, "rate_limited")
    retry_after_s = int(response.headers["retry-after"])
    assert 1 <= retry_after_s <= window_s, response.headers
    assert body["retry_after_s"] == retry_after_s and body["limits"] == ["auth-guesses"], body


def refusals(surface: str) -> float:
    return REGISTRY.get_sample_value("groupbuy_auth_throttled_total", {"surface": surface}) or 0.0


@SQLITE
@ON_FAKE
def test_ten_failures_then_even_the_right_key_is_refused_for_the_window(make_client: Any) -> None:
    client = make_client()
    before = refusals("api")
    for _ in range(10):
        assert_problem(client.get(FEED, headers=WRONG), 401, "unauthorized")
    assert_refused(client.get(FEED, headers=SERVICE))  # refused before the key is looked at
    assert_refused(client.get(FEED, headers=WRONG))  # and not a 401 any more
    assert_refused(client.post("/v1/activities", json={"activity_id": "a1"}, headers=SERVICE))
    assert refusals("api") == before + 3
    # What needs no key is not throttled.
    assert client.get("/healthz").status_code == 200


@SQLITE
@ON_FAKE
def test_a_success_does_not_reset_the_count_and_a_403_is_no_failure(make_client: Any) -> None:
    client = make_client(guess_limit=3)
    for _ in range(2):
        assert_problem(client.get(FEED, headers=WRONG), 401)
        assert_ok(client.get(FEED, headers=SERVICE), 200)
    # A right key with the wrong role is no guess.
    for _ in range(3):
        assert_problem(client.get("/v1/admin/audit", headers=SERVICE), 403, "forbidden")
    assert_problem(client.get(FEED, headers=WRONG), 401)
    assert_refused(client.get(FEED, headers=SERVICE))


@SQLITE
@ON_FAKE
def test_bad_signatures_count_as_failures(make_client: Any) -> None:
    client = make_client(guess_limit=2)
    stale = {**SERVICE, "X-Groupbuy-Timestamp": "1", "X-Groupbuy-Signature": "0" * 64}
    for _ in range(2):
        assert_problem(client.get(FEED, headers=stale), 401, "bad_signature")
    assert_refused(client.get(FEED, headers=SERVICE))


@SQLITE
@ON_FAKE
def test_another_address_is_not_affected(make_client: Any) -> None:
    client = make_client(PROXY, trusted_proxies=(PROXY,))
    for _ in range(10):
        assert_problem(client.get(FEED, headers=forwarded("198.51.100.1")), 401)
    assert_refused(client.get(FEED, headers=forwarded("198.51.100.1", SERVICE)))
    assert_ok(client.get(FEED, headers=forwarded("198.51.100.2", SERVICE)), 200)
    assert_ok(client.get(FEED, headers=SERVICE), 200)  # the proxy itself


@SQLITE
@ON_FAKE
def test_the_exempt_addresses_are_never_throttled(make_client: Any) -> None:
    client = make_client("198.51.100.9", guess_exempt=("198.51.100.0/24",))
    for _ in range(15):
        assert_problem(client.get(FEED, headers=WRONG), 401, "unauthorized")
    assert_ok(client.get(FEED, headers=SERVICE), 200)


@SQLITE
@ON_FAKE
def test_x_forwarded_for_from_an_untrusted_peer_is_ignored(make_client: Any) -> None:
    client = make_client(GUESSER, trusted_proxies=(PROXY,))
    for n in range(10):  # a new address claimed each time: all are the peer's
        assert_problem(client.get(FEED, headers=forwarded(f"198.51.100.{n}")), 401)
    assert_refused(client.get(FEED, headers=forwarded("198.51.100.200", SERVICE)))


@SQLITE
@ON_FAKE
def test_x_forwarded_for_from_a_trusted_proxy_names_the_client(make_client: Any) -> None:
    client = make_client(PROXY, trusted_proxies=("10.0.0.0/8",))
    # Two proxies: the right-most address that is not a trusted proxy is the client.
    for _ in range(10):
        assert_problem(client.get(FEED, headers=forwarded("198.51.100.1, 10.0.0.5")), 401)
    # What the client itself writes in front changes nothing.
    assert_refused(client.get(FEED, headers=forwarded("192.0.2.1, 198.51.100.1", SERVICE)))
    assert_ok(client.get(FEED, headers=forwarded("198.51.100.1, 192.0.2.1", SERVICE)), 200)


def console_sign_in(client: TestClient, csrf: str, key: str) -> httpx.Response:
    return client.post(
        "/console/signin",
        data={"key": key, "csrf": csrf, "next": "/console"},
        follow_redirects=False,
    )


@SQLITE
@ON_FAKE
def test_failed_console_sign_ins_count_and_are_then_refused(make_client: Any) -> None:
    client = make_client()
    before = refusals("console")
    csrf = csrf_of(client.get("/console/signin").text)
    for _ in range(6):  # one form, posted again and again
        assert console_sign_in(client, csrf, "wrong-key-wrong-key-wrong").status_code == 401
    for _ in range(4):  # the API's failures count towards the same address
        assert_problem(client.get(FEED, headers=WRONG), 401)
    refused = console_sign_in(client, csrf, ADMIN_KEY)
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "Too many failed sign-ins" in refused.text
    assert "groupbuy_console" not in refused.cookies  # no session was started
    assert refusals("console") == before + 1
    assert_refused(client.get(FEED, headers=SERVICE))


@SQLITE
@ON_REAL
def test_two_apps_on_one_redis_see_one_count(make_client: Any) -> None:
    first, second = make_client(), make_client()
    for n in range(10):
        assert_problem((first if n % 2 else second).get(FEED, headers=WRONG), 401)
    assert_refused(first.get(FEED, headers=SERVICE))
    assert_refused(second.get(FEED, headers=SERVICE))
    # Another address, on either app, is not refused.
    assert make_client("192.0.2.50").get(FEED, headers=SERVICE).status_code == 200


def test_redis_down_turns_no_request_into_a_500(tmp_path: Path) -> None:
    """The throttle lets requests through while Redis does not answer: a wrong key is still
    a 401, and what needs no Redis still answers."""
    settings = settings_without_redis(tmp_path)
    with TestClient(create_app(settings), client=(GUESSER, 40000)) as client:
        for _ in range(12):
            assert_problem(client.get(FEED, headers=WRONG), 401, "unauthorized")
        answer = client.get(FEED, headers={"Authorization": f"Bearer {SERVICE_KEY}"})
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_short_secret_refuses_the_start_naming_its_role_not_the_secret(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    short = "not-twenty-chars"
    monkeypatch.setenv("GROUPBUY_API_KEYS", f"admin:{ADMIN_KEY},service:{short}")
    monkeypatch.delenv("GROUPBUY_CONFIG", raising=False)
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    assert main([command]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert "service key (entry 2)" in line and "20 characters" in line, line
    assert short not in captured.err + captured.out


def test_settings_of_the_throttle(tmp_path: Path) -> None:
    settings: Settings = settings_without_redis(tmp_path)
    auth = settings.replace(
        "auth", guess_exempt=("10.0.0.0/8", "2001:db8::1"), trusted_proxies=("127.0.0.1",)
    ).auth
    assert [str(n) for n in auth.exempt_networks] == ["10.0.0.0/8", "2001:db8::1/128"]
    with pytest.raises(ValueError, match="'10.0.0.300' is not an IP address"):
        settings.replace("auth", trusted_proxies=("10.0.0.300",))
    with pytest.raises(ValueError, match=r"\[auth\] guess_limit"):
        settings.replace("auth", guess_limit=-1)
