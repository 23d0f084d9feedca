"""Rate limits per API key and per user id for each route class (SPEC §3), over HTTP."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from groupbuy.api.app import ENDPOINTS, create_app
from groupbuy.services import Services
from groupbuy.settings import RATE_CLASSES, Settings, load_settings
from tests.support.http import (
    ADMIN,
    SERVICE,
    app_services,
    assert_ok,
    assert_problem,
    deposit,
    grab,
    lock,
    make_activity,
    open_team,
    send,
)
from tests.support.settings import settings_for

# 1000 an hour: a test's requests never refill a bucket by the next one's.
GENEROUS = {
    f"{c}_{s}_{what}": value
    for c in RATE_CLASSES
    for s in ("key", "user")
    for what, value in (("quota", 1000), ("window_s", 3600))
}


def limited(settings: Settings, **values: Any) -> Settings:
    """Rate limits on: 1000 an hour everywhere but where `values` says otherwise."""
    return settings.replace("ratelimit", enabled=True, **{**GENEROUS, **values})


@pytest.fixture
def make_client(redis_url: str, database_url: str) -> Iterator[Any]:
    """A client factory whose apps have these [ratelimit] values; closed after the test."""
    opened: list[TestClient] = []

    def make(**values: Any) -> TestClient:
        settings = limited(settings_for(redis_url, database_url), **values)
        client = TestClient(create_app(settings)).__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


def fields(response: Any) -> tuple[str, str]:
    return response.headers["ratelimit-policy"], response.headers["ratelimit"]


def state(response: Any) -> dict[str, tuple[int, int]]:
    """The RateLimit field as {policy: (r, t)}."""
    found = re.findall(r'"([a-z]+-[a-z]+)";r=(\d+);t=(\d+)', response.headers["ratelimit"])
    return {name: (int(r), int(t)) for name, r, t in found}


def funded_packet(client: TestClient, pid: str, count: int, amount: int = 1000) -> None:
    assert_ok(deposit(client, "sender", amount, f"dep-{pid}"), 201)
    body = {"sender_id": "sender", "amount_cents": amount, "count": count, "packet_id": pid}
    assert_ok(send(client, **body), 201)


def test_answers_under_the_limit_carry_the_fields(make_client: Any) -> None:
    # One request back into the key's bucket every 864 ms: none between two grabs here.
    client = make_client(
        grab_key_quota=100_000, grab_key_window_s=86400, grab_user_quota=20, grab_user_window_s=2
    )
    funded_packet(client, "p1", 1)
    first = grab(client, "p1", "u1")
    assert_ok(first, 200)
    assert fields(first) == (
        '"grab-key";q=100000;w=86400, "grab-user";q=20;w=2',
        '"grab-key";r=99999;t=1, "grab-user";r=19;t=1',
    )
    # A problem answer of a counted request carries them too.
    sold_out = grab(client, "p1", "u2")
    assert_problem(sold_out, 409, "sold_out")
    assert fields(sold_out) == (
        '"grab-key";q=100000;w=86400, "grab-user";q=20;w=2',
        '"grab-key";r=99998;t=2, "grab-user";r=19;t=1',
    )
    assert "retry-after" not in sold_out.headers


def test_over_the_key_limit_a_grab_is_refused_and_grabs_nothing(make_client: Any) -> None:
    client = make_client(grab_key_quota=2, grab_key_window_s=60)
    funded_packet(client, "p1", 5)
    for user in ("u1", "u2"):
        assert_ok(grab(client, "p1", user), 200)
    refused = grab(client, "p1", "u3")
    problem = assert_problem(refused, 429, "rate_limited")
    assert problem["limits"] == ["grab-key"]
    assert 1 <= problem["retry_after_s"] <= 30  # one refill interval: 60 s / 2
    assert refused.headers["retry-after"] == str(problem["retry_after_s"])
    assert fields(refused)[0] == '"grab-key";q=2;w=60, "grab-user";q=1000;w=3600'
    # Full again in 60 s less the time since the first grab; the user's bucket is untouched.
    assert state(refused)["grab-key"][0] == 0 and 55 <= state(refused)["grab-key"][1] <= 60
    assert state(refused)["grab-user"] == (1000, 0)
    packet = assert_ok(client.get("/v1/redpackets/p1", headers=SERVICE), 200)
    assert [g["user_id"] for g in packet["grabs"]] == ["u1", "u2"]
    assert packet["remaining_count"] == 3


def test_the_bucket_refills_with_time(make_client: Any) -> None:
    client = make_client(grab_key_quota=2, grab_key_window_s=10)
    funded_packet(client, "p1", 10)
    assert [grab(client, "p1", u).status_code for u in ("u1", "u2", "u3")] == [200, 200, 429]
    clock = app_services(client).clock
    clock.advance(5.1)  # one interval (10 s / 2): room for one request
    assert [grab(client, "p1", u).status_code for u in ("u3", "u4")] == [200, 429]
    clock.advance(10.1)  # a whole window: the full quota again
    assert [grab(client, "p1", u).status_code for u in ("u4", "u5", "u6")] == [200, 200, 429]


def test_a_user_limit_refuses_that_user_only(make_client: Any) -> None:
    client = make_client(read_user_quota=2, read_user_window_s=60)
    for _ in range(2):
        assert_ok(client.get("/v1/accounts/u1", headers=SERVICE), 200)
    refused = client.get("/v1/accounts/u1", headers=SERVICE)
    assert assert_problem(refused, 429, "rate_limited")["limits"] == ["read-user"]
    assert state(refused)["read-key"][0] == 998  # two taken, the third not
    assert state(refused)["read-user"][0] == 0
    assert_ok(client.get("/v1/accounts/u2", headers=SERVICE), 200)
    # The same user through another API key has a bucket of its own.
    assert_ok(client.get("/v1/accounts/u1", headers=ADMIN), 200)


def test_a_key_limit_refuses_every_user_of_that_key_only(make_client: Any) -> None:
    client = make_client(read_key_quota=3, read_key_window_s=60)
    for user in ("u1", "u2", "u3"):
        assert_ok(client.get(f"/v1/accounts/{user}", headers=SERVICE), 200)
    for path in ("/v1/accounts/u4", "/v1/redpackets/p9", "/v1/events"):
        problem = assert_problem(client.get(path, headers=SERVICE), 429, "rate_limited")
        assert problem["limits"] == ["read-key"]
    assert_ok(client.get("/v1/accounts/u4", headers=ADMIN), 200)
    # Each class has buckets of its own: seat operations still go through.
    make_activity(client, "a")
    assert "ratelimit" in open_team_response(client).headers


def open_team_response(client: TestClient) -> Any:
    response = client.post("/v1/activities/a/teams", json={"leader_id": "L"}, headers=SERVICE)
    assert_ok(response, 201)
    return response


def test_over_the_user_limit_a_seat_lock_takes_no_seat(make_client: Any) -> None:
    client = make_client(seat_user_quota=2, seat_user_window_s=60)
    make_activity(client, "a", team_size=5)
    for team in ("t1", "t2", "t3"):
        open_team(client, "a", team, f"lead-{team}")
    assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert_ok(lock(client, "a", "t2", "u1"), 201)  # switches: t1's lock released
    refused = lock(client, "a", "t3", "u1")
    assert assert_problem(refused, 429, "rate_limited")["limits"] == ["seat-user"]
    current = assert_ok(client.get("/v1/activities/a/users/u1/lock", headers=SERVICE), 200)
    assert current["team_id"] == "t2"
    team = assert_ok(client.get("/v1/activities/a/teams/t3", headers=SERVICE), 200)
    assert team["locks"] == [] and team["free_seats"] == 4
    assert_ok(lock(client, "a", "t3", "u2"), 201)


def test_a_refused_send_debits_nothing(make_client: Any) -> None:
    client = make_client(send_user_quota=1, send_user_window_s=60)
    assert_ok(deposit(client, "s", 500, "d1"), 201)
    assert_ok(send(client, sender_id="s", amount_cents=100, count=1, packet_id="x1"), 201)
    refused = send(client, sender_id="s", amount_cents=100, count=1, packet_id="x2")
    assert assert_problem(refused, 429, "rate_limited")["limits"] == ["send-user"]
    assert assert_ok(client.get("/v1/accounts/s", headers=ADMIN), 200)["balance_cents"] == 400
    assert_problem(client.get("/v1/redpackets/x2", headers=ADMIN), 404, "packet_not_found")


def test_a_malformed_request_costs_nothing(make_client: Any) -> None:
    client = make_client(grab_key_quota=1, grab_key_window_s=60)
    funded_packet(client, "p1", 2)
    bad = client.post("/v1/redpackets/p1/grab", json={"user": "u1"}, headers=SERVICE)
    assert_problem(bad, 422, "invalid_request")
    assert "ratelimit" not in bad.headers
    assert_ok(grab(client, "p1", "u1"), 200)


def test_admin_and_operations_routes_are_not_limited(make_client: Any) -> None:
    client = make_client(**{f"{c}_key_quota": 1 for c in RATE_CLASSES})
    for _ in range(3):
        response = deposit(client, "u1", 10, "same-reference")
        assert response.status_code in (200, 201)
        assert "ratelimit" not in response.headers
        assert client.get("/healthz").status_code == 200
        assert client.post("/v1/admin/jobs/sweep_locks/run", headers=ADMIN).status_code == 200


def test_disabled_means_no_fields_and_no_refusal(redis_url: str, database_url: str) -> None:
    settings = limited(settings_for(redis_url, database_url), read_key_quota=1).replace(
        "ratelimit", enabled=False
    )
    with TestClient(create_app(settings)) as client:
        for _ in range(3):
            response = client.get("/v1/accounts/u1", headers=SERVICE)
            assert_ok(response, 200)
            assert "ratelimit" not in response.headers
            assert "ratelimit-policy" not in response.headers


def test_a_quota_of_zero_is_no_limit(make_client: Any) -> None:
    client = make_client(read_key_quota=0, read_user_quota=1, read_user_window_s=60)
    response = client.get("/v1/accounts/u1", headers=SERVICE)
    assert fields(response) == ('"read-user";q=1;w=60', '"read-user";r=0;t=60')
    assert "ratelimit" not in client.get("/v1/events", headers=SERVICE).headers
    assert_problem(client.get("/v1/accounts/u1", headers=SERVICE), 429, "rate_limited")


def test_every_service_route_has_a_rate_class() -> None:
    for endpoint in ENDPOINTS:
        if endpoint.role == "service":
            assert endpoint.rate_class in RATE_CLASSES, (endpoint.method, endpoint.path)
        else:
            assert endpoint.rate_class is None, (endpoint.method, endpoint.path)
        if endpoint.rate_user is not None:
            in_path = f"{{{endpoint.rate_user}}}" in endpoint.path
            in_body = endpoint.body is not None and endpoint.rate_user in endpoint.body.model_fields
            assert in_path or in_body, (endpoint.method, endpoint.path, endpoint.rate_user)


def test_the_limits_come_from_the_environment(tmp_path: Path) -> None:
    settings = load_settings(
        None, {"GROUPBUY_RATELIMIT_GRAB_USER_QUOTA": "5", "GROUPBUY_RATELIMIT_ENABLED": "false"}
    )
    assert settings.ratelimit.limit("grab", "user") == (5, 2)
    assert settings.ratelimit.enabled is False
    assert load_settings(None, {}).ratelimit.enabled is True


@pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])
async def test_200_concurrent_grabs_against_a_limit_of_50_let_exactly_50_through(
    settings: Settings, redis_client: Any
) -> None:
    from groupbuy.services import build_services, running
    from groupbuy.storage.db import Database

    limited_settings = limited(settings, grab_key_quota=50, grab_key_window_s=3600)
    database = Database(limited_settings.database.effective_url)
    services: Services = build_services(limited_settings, redis=redis_client, database=database)
    app = create_app(limited_settings, services)
    async with running(services, scheduler=False):
        await services.packets.accounts.deposit("sender", 10_000, "funds")
        await services.packets.sending.send("sender", 10_000, 500, packet_id="p1")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            answers = await asyncio.gather(
                *(
                    http.post("/v1/redpackets/p1/grab", json={"user_id": f"u{i}"}, headers=SERVICE)
                    for i in range(200)
                )
            )
        packet = await services.packets.reads.get("p1")
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {200: 50, 429: 150}, statuses
    assert len(packet["grabs"]) == 50
    # One request back every 3600 s / 50 = 72 s, less the time the 200 requests took.
    assert {a.headers["retry-after"] for a in answers if a.status_code == 429} <= {
        "70",
        "71",
        "72",
    }


def test_the_openapi_document_declares_the_fields_of_limited_endpoints() -> None:
    from groupbuy.api.openapi import build_openapi

    document = build_openapi(ENDPOINTS)
    for endpoint in ENDPOINTS:
        responses = document["paths"][endpoint.path][endpoint.method.lower()]["responses"]
        if endpoint.rate_class is None:
            # A keyed route answers 429 only to a guessing address: Retry-After, no
            # RateLimit fields; a route without a key never does.
            assert ("429" in responses) == (endpoint.role is not None), endpoint.path
            if endpoint.role is not None:
                assert set(responses["429"]["headers"]) == {"Retry-After"}, endpoint.path
            others = [r for status, r in responses.items() if status != "429"]
            assert all("headers" not in r for r in others), endpoint.path
            continue
        assert responses["429"]["headers"]["Retry-After"]["required"] is True
        for response in responses.values():
            assert {"RateLimit-Policy", "RateLimit"} <= set(response["headers"]), endpoint.path


def test_while_redis_is_down_requests_are_not_limited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.settings import settings_without_redis

    settings = limited(settings_without_redis(tmp_path), read_key_quota=1)
    with TestClient(create_app(settings)) as client, caplog.at_level("INFO"):
        for _ in range(2):  # the events feed is served from SQL: it keeps answering
            events = client.get("/v1/events", headers=SERVICE)
            assert_ok(events, 200)
            assert "ratelimit" not in events.headers
        # What needs Redis answers 503 itself, not 429 and not 500.
        assert_problem(grab(client, "p1", "u1"), 503, "redis_unavailable")
    throttles = [r for r in caplog.records if r.name == "groupbuy.storage.throttles"]
    said = [r.getMessage() for r in throttles if "rate limits" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("rate limits not applied"), said
    # Redis's state is logged at WARNING once, by the reachability log, not here too.
    assert not [r for r in throttles if r.levelno >= logging.WARNING]
