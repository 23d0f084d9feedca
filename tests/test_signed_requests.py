"""Signed requests (SPEC §3): HMAC-SHA256 over method, target, timestamp and body hash,
within a clock skew, each signature accepted once.

The signatures here are computed from the SPEC's words with hashlib and hmac directly, not
with groupbuy_client.signing, so the server is checked against the contract rather than against
its own helper. Every test runs on fakeredis and on a real redis-server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from groupbuy_client.signing import canonical_request, signature
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.settings import Settings
from tests.support.http import (
    ADMIN_KEY,
    SERVICE_KEY,
    app_services,
    assert_ok,
    assert_problem,
    portal,
)
from tests.support.settings import settings_without_redis

SKEW_S = 300
_LAST_STAMP: dict[tuple[str, str, str, bytes], int] = {}


def spec_signature(secret: str, method: str, target: str, stamp: str, body: bytes) -> str:
    """The signature exactly as SPEC §3 words it."""
    body_hash = hashlib.sha256(body).hexdigest()
    message = f"{method}\n{target}\n{stamp}\n{body_hash}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signed_headers(
    method: str,
    target: str,
    body: bytes = b"",
    *,
    secret: str = SERVICE_KEY,
    bearer: str | None = None,
    stamp: int | None = None,
) -> dict[str, str]:
    """Authorization (the bearer of `secret` unless told), timestamp and signature headers.

    The same request twice in one second would have the same signature (a replay): without
    an explicit `stamp` each repeat takes the next second, as groupbuy_client.client does.
    """
    if stamp is None:
        same = (secret, method, target, body)
        stamp = max(int(time.time()), _LAST_STAMP.get(same, 0) + 1)
        _LAST_STAMP[same] = stamp
    when = str(stamp)
    return {
        "Authorization": f"Bearer {bearer or secret}",
        "Content-Type": "application/json",
        "X-Groupbuy-Timestamp": when,
        "X-Groupbuy-Signature": spec_signature(secret, method, target, when, body),
    }


def call(
    client: TestClient,
    method: str,
    target: str,
    body: Any = None,
    *,
    secret: str = SERVICE_KEY,
    sign_as: tuple[str, str, Any] | None = None,
    **options: Any,
) -> httpx.Response:
    """Send `method target body`, signed for `sign_as` (method, target, body) when given,
    else for what is sent: a differing `sign_as` is a tampered request."""
    raw = b"" if body is None else json.dumps(body).encode()
    signed_method, signed_target, signed_body = sign_as or (method, target, body)
    signed_raw = b"" if signed_body is None else json.dumps(signed_body).encode()
    headers = signed_headers(signed_method, signed_target, signed_raw, secret=secret, **options)
    return client.request(method, target, content=raw, headers=headers)


@pytest.fixture
def signed_client(settings: Settings) -> Iterator[TestClient]:
    """The API with `[auth] signed_requests = true`."""
    with TestClient(create_app(settings.replace("auth", signed_requests=True))) as client:
        yield client


def make_team(client: TestClient) -> None:
    """Activity a1 (teams of 3) with team t1 opened by L, through signed requests."""
    assert_ok(call(client, "POST", "/v1/activities", {"activity_id": "a1"}, secret=ADMIN_KEY), 201)
    team = {"leader_id": "L", "team_id": "t1"}
    assert_ok(call(client, "POST", "/v1/activities/a1/teams", team), 201)


def team_version(client: TestClient) -> int:
    return int(assert_ok(call(client, "GET", "/v1/activities/a1/teams/t1"), 200)["version"])


def test_the_canonical_request_is_the_one_the_spec_describes() -> None:
    body = b'{"user_id":"u1"}'
    target = b"/v1/activities/a1/teams?limit=5&cursor=x%20y"
    expected = (
        b"POST\n/v1/activities/a1/teams?limit=5&cursor=x%20y\n1700000000\n"
        + hashlib.sha256(body).hexdigest().encode()
    )
    assert canonical_request("POST", target, "1700000000", body) == expected
    assert signature("k", "POST", target, "1700000000", body) == spec_signature(
        "k", "POST", target.decode(), "1700000000", body
    )
    # Without a body: the SHA-256 of the empty string.
    assert canonical_request("GET", b"/v1/x", "1", b"").endswith(
        b"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


def test_signed_requests_are_answered(signed_client: TestClient) -> None:
    make_team(signed_client)
    lock = call(signed_client, "POST", "/v1/activities/a1/teams/t1/locks", {"user_id": "u1"})
    assert assert_ok(lock, 201)["status"] == "locked"
    page = assert_ok(call(signed_client, "GET", "/v1/activities/a1/teams?limit=5"), 200)
    assert [team["team_id"] for team in page["teams"]] == ["t1"]
    released = call(signed_client, "DELETE", "/v1/activities/a1/teams/t1/locks/u1")
    assert assert_ok(released, 200) == {"released": True}
    # A timestamp inside the skew on either side is accepted.
    for offset in (-(SKEW_S - 5), SKEW_S - 5):
        stamp = int(time.time()) + offset
        assert_ok(call(signed_client, "GET", "/v1/activities/a1", stamp=stamp), 200)


def test_the_unauthenticated_routes_need_no_signature(signed_client: TestClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert signed_client.get(path).status_code == 200, path


def test_an_unsigned_or_wrongly_signed_request_applies_nothing(
    signed_client: TestClient,
) -> None:
    make_team(signed_client)
    before = team_version(signed_client)
    lock_url, body = "/v1/activities/a1/teams/t1/locks", {"user_id": "u1"}
    now = int(time.time())
    refused = {
        "no signature at all": (
            "missing",
            signed_client.post(
                lock_url, json=body, headers={"Authorization": f"Bearer {SERVICE_KEY}"}
            ),
        ),
        "the admin key's secret": (
            "wrong",
            call(signed_client, "POST", lock_url, body, secret=ADMIN_KEY, bearer=SERVICE_KEY),
        ),
        "another body": (
            "wrong",
            call(
                signed_client,
                "POST",
                lock_url,
                body,
                sign_as=("POST", lock_url, {"user_id": "u2"}),
            ),
        ),
        "another path": (
            "wrong",
            call(
                signed_client,
                "POST",
                lock_url,
                body,
                sign_as=("POST", "/v1/activities/a1/teams/t2/locks", body),
            ),
        ),
        "another method": (
            "wrong",
            call(
                signed_client,
                "DELETE",
                f"{lock_url}/L",
                sign_as=("GET", f"{lock_url}/L", None),
            ),
        ),
        "a timestamp too old": (
            "stale",
            call(signed_client, "POST", lock_url, body, stamp=now - SKEW_S - 5),
        ),
        "a timestamp in the future": (
            "stale",
            call(signed_client, "POST", lock_url, body, stamp=now + SKEW_S + 5),
        ),
    }
    for case, (reason, response) in refused.items():
        problem = assert_problem(response, 401, "bad_signature")
        assert response.headers["www-authenticate"] == "Bearer", case
        assert problem["reason"] == reason, (case, problem)
    assert team_version(signed_client) == before
    assert_problem(call(signed_client, "GET", "/v1/activities/a1/users/u1/lock"), 404, "no_lock")


def test_a_tampered_query_is_refused(signed_client: TestClient) -> None:
    make_team(signed_client)
    signed_for = ("GET", "/v1/activities/a1/teams?limit=5", None)
    sent = call(signed_client, "GET", "/v1/activities/a1/teams?limit=6", sign_as=signed_for)
    assert_problem(sent, 401, "bad_signature")
    # Signed without the query that is sent, or with a '?' that is not: refused too.
    without = ("GET", "/v1/activities/a1/teams", None)
    assert_problem(
        call(signed_client, "GET", "/v1/activities/a1/teams?limit=5", sign_as=without),
        401,
        "bad_signature",
    )
    trailing = ("GET", "/v1/activities/a1/teams?", None)
    assert_problem(
        call(signed_client, "GET", "/v1/activities/a1/teams", sign_as=trailing),
        401,
        "bad_signature",
    )


@pytest.mark.parametrize(
    "drop", ["X-Groupbuy-Timestamp", "X-Groupbuy-Signature"], ids=["timestamp", "signature"]
)
def test_a_missing_header_is_refused(signed_client: TestClient, drop: str) -> None:
    make_team(signed_client)
    raw = json.dumps({"user_id": "u1"}).encode()
    url = "/v1/activities/a1/teams/t1/locks"
    headers = signed_headers("POST", url, raw)
    del headers[drop]
    assert_problem(signed_client.post(url, content=raw, headers=headers), 401, "bad_signature")
    assert_problem(call(signed_client, "GET", "/v1/activities/a1/users/u1/lock"), 404, "no_lock")


@pytest.mark.parametrize("stamp", ["", "abc", "1.5", "-1", "+1700000000", "1" * 13, "1e9", "0x10"])
def test_a_timestamp_that_is_not_unix_seconds_is_refused(
    signed_client: TestClient, stamp: str
) -> None:
    headers = signed_headers("GET", "/v1/events")
    headers["X-Groupbuy-Timestamp"] = stamp
    headers["X-Groupbuy-Signature"] = spec_signature(SERVICE_KEY, "GET", "/v1/events", stamp, b"")
    refused = assert_problem(signed_client.get("/v1/events", headers=headers), 401, "bad_signature")
    assert refused["reason"] == ("missing" if stamp == "" else "malformed"), refused


def test_a_replayed_request_is_refused_and_remembered_for_twice_the_skew(
    signed_client: TestClient,
) -> None:
    make_team(signed_client)
    url, raw = "/v1/activities/a1/teams/t1/locks", json.dumps({"user_id": "u1"}).encode()
    headers = signed_headers("POST", url, raw)
    assert_ok(signed_client.post(url, content=raw, headers=headers), 201)
    released = call(signed_client, "DELETE", f"{url}/u1")
    assert assert_ok(released, 200) == {"released": True}
    version = team_version(signed_client)
    # The same bytes again, well inside the skew: refused, and the lock is not taken again.
    replay = signed_client.post(url, content=raw, headers=headers)
    assert assert_problem(replay, 401, "bad_signature")["reason"] == "replayed"
    assert team_version(signed_client) == version
    assert_problem(call(signed_client, "GET", "/v1/activities/a1/users/u1/lock"), 404, "no_lock")

    services = app_services(signed_client)
    key = services.keys.seen_signature(headers["X-Groupbuy-Signature"])
    assert key.startswith(f"{services.settings.redis.key_prefix}:")
    ttl_ms = portal(signed_client).call(services.redis.pttl, key)
    assert 2 * SKEW_S * 1000 - 10_000 < ttl_ms <= 2 * SKEW_S * 1000


def test_a_wrong_signature_is_not_remembered(signed_client: TestClient) -> None:
    """A wrong signature does not use up the right one (nor fill Redis with keys)."""
    make_team(signed_client)
    url, raw = "/v1/activities/a1/teams/t1/locks", json.dumps({"user_id": "u1"}).encode()
    headers = signed_headers("POST", url, raw)
    wrong = {**headers, "X-Groupbuy-Signature": headers["X-Groupbuy-Signature"].upper()}
    assert_problem(signed_client.post(url, content=raw, headers=wrong), 401, "bad_signature")
    assert_ok(signed_client.post(url, content=raw, headers=headers), 201)


def test_an_unknown_key_is_unauthorized_before_any_signature(signed_client: TestClient) -> None:
    response = call(signed_client, "GET", "/v1/events", secret="nobody-has-this")
    assert_problem(response, 401, "unauthorized")


@pytest.fixture
def per_key_client(settings: Settings) -> Iterator[TestClient]:
    """Signing off globally; the service key must sign, the admin key need not."""
    keys = (f"admin:{ADMIN_KEY}", f"service+signed:{SERVICE_KEY}")
    with TestClient(create_app(settings.replace("auth", api_keys=keys))) as client:
        yield client


def test_a_key_marked_signed_must_sign_while_others_need_not(
    per_key_client: TestClient,
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert_ok(per_key_client.post("/v1/activities", json={"activity_id": "a1"}, headers=admin), 201)
    service = {"Authorization": f"Bearer {SERVICE_KEY}"}
    unsigned = per_key_client.post(
        "/v1/activities/a1/teams", json={"leader_id": "L", "team_id": "t1"}, headers=service
    )
    assert_problem(unsigned, 401, "bad_signature")
    assert_problem(per_key_client.get("/v1/activities/a1/teams/t1", headers=admin), 404)
    signed = call(per_key_client, "POST", "/v1/activities/a1/teams", {"leader_id": "L"})
    assert assert_ok(signed, 201)["leader_id"] == "L"
    assert_ok(per_key_client.get("/v1/activities/a1", headers=admin), 200)


def test_with_signing_off_unsigned_keys_work_and_a_signature_present_is_checked(
    client: TestClient,
) -> None:
    service = {"Authorization": f"Bearer {SERVICE_KEY}"}
    assert_ok(client.get("/v1/events", headers=service), 200)
    assert_ok(call(client, "GET", "/v1/events"), 200)
    tampered = call(client, "GET", "/v1/events?after=1", sign_as=("GET", "/v1/events", None))
    assert_problem(tampered, 401, "bad_signature")


def test_with_redis_down_a_signed_request_is_a_503_not_a_500(tmp_path: Path) -> None:
    """The replay check needs Redis: without it the answer says so (and nothing applies)."""
    settings = settings_without_redis(tmp_path).replace("auth", signed_requests=True)
    with TestClient(create_app(settings)) as client:
        response = call(client, "GET", "/v1/events")
        assert_problem(response, 503, "redis_unavailable")
        wrong = call(client, "GET", "/v1/events", sign_as=("GET", "/v1/events?after=1", None))
        assert_problem(wrong, 401, "bad_signature")  # refused before Redis is asked
