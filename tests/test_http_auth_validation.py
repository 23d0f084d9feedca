"""HTTP tests of auth, validation, error bodies, size limits, routing and OpenAPI (SPEC §2, §3).

Every test runs on fakeredis and on a real redis-server (the `client` fixture).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Route
from starlette.testclient import TestClient

from groupbuy.api.app import ENDPOINTS
from tests.support.fixtures import OpenTeam
from tests.support.http import (
    ADMIN,
    ADMIN_KEY,
    SERVICE,
    SERVICE_KEY,
    app_of,
    assert_ok,
    assert_problem,
)

MAX_BODY = 64 * 1024

TEAM = "/v1/activities/a/teams/t1"
# Every POST endpoint: its route template, a URL, a body it accepts, and the key it needs.
POSTS: dict[str, tuple[str, str, dict[str, Any], dict[str, str]]] = {
    "activities": ("/v1/activities", "/v1/activities", {"activity_id": "new-act"}, ADMIN),
    "teams": (
        "/v1/activities/{activity_id}/teams",
        "/v1/activities/a/teams",
        {"leader_id": "L2", "team_id": "t2", "order_id": "o2"},
        SERVICE,
    ),
    "locks": (
        "/v1/activities/{activity_id}/teams/{team_id}/locks",
        f"{TEAM}/locks",
        {"user_id": "u1"},
        SERVICE,
    ),
    "members": (
        "/v1/activities/{activity_id}/teams/{team_id}/members",
        f"{TEAM}/members",
        {"user_id": "u1", "order_id": "o1"},
        SERVICE,
    ),
}
ID_FIELDS = {
    "activities": ["activity_id"],
    "teams": ["leader_id", "team_id", "order_id"],
    "locks": ["user_id"],
    "members": ["user_id", "order_id"],
}
REQUIRED = {
    "activities": ["activity_id"],
    "teams": ["leader_id"],
    "locks": ["user_id"],
    "members": ["user_id", "order_id"],
}
BAD_IDS = [
    "",
    "x" * 65,
    "a b",
    "a/b",
    "a:b",
    "a{b",
    "a}b",
    "é",
    "a\n",
    "\na",
    "a\nb",
    "a.b",
    "a*",
    " a",
    "日本",
    "a\x00b",
    "a%2Fb",
]


# -- helpers ------------------------------------------------------------------------


def team_now(client: TestClient) -> Any:
    return assert_ok(client.get(TEAM, headers=SERVICE), 200)


def state(client: TestClient) -> tuple[Any, ...]:
    """What a refused request must not change: team t1, team t2, u1's lock, activity new-act."""
    return (
        team_now(client),
        client.get("/v1/activities/a/teams/t2", headers=SERVICE).status_code,
        client.get("/v1/activities/a/users/u1/lock", headers=SERVICE).status_code,
        client.get("/v1/activities/new-act", headers=SERVICE).status_code,
    )


def concrete(path: str) -> str:
    """A route path with every parameter filled in."""
    return re.sub(r"{\w+}", "x1", path)


# -- auth ---------------------------------------------------------------------------


def test_open_endpoints_need_no_key(client: TestClient) -> None:
    assert assert_ok(client.get("/healthz"), 200) == {"status": "ok"}
    ready = assert_ok(client.get("/readyz"), 200)
    assert ready["status"] == "ready"
    assert assert_ok(client.get("/openapi.json"), 200)["openapi"].startswith("3.1")
    # A wrong key on an open endpoint is not held against the caller either.
    assert client.get("/healthz", headers={"Authorization": "Bearer wrong"}).status_code == 200


def test_every_protected_endpoint_answers_401_without_a_valid_key(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team(team_size=3)
    bad_headers: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer wrong-key"},
        {"Authorization": f"Bearer {SERVICE_KEY}x"},
        {"Authorization": f"Bearer {SERVICE_KEY[:-1]}"},
        {"Authorization": f"Basic {SERVICE_KEY}"},
        {"Authorization": SERVICE_KEY},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": ""},
        {"Authorization": f"Bearer {ADMIN_KEY},{SERVICE_KEY}"},
        {"Authorization": f"Bearer{SERVICE_KEY}"},
        {"X-Api-Key": SERVICE_KEY},
    ]
    protected = [e for e in ENDPOINTS if e.role is not None]
    assert {e.path for e in protected} >= {"/v1/activities", "/v1/events"}
    before = state(client)
    for endpoint in protected:
        for headers in bad_headers:
            r = client.request(
                endpoint.method,
                concrete(endpoint.path),
                headers=headers,
                json={"activity_id": "new-act"},
            )
            assert_problem(r, 401, "unauthorized")
            assert r.headers.get("www-authenticate", "").lower().startswith("bearer"), r.headers
    # Non-ASCII bytes in the header are a wrong key, not a crash.
    r = client.get("/v1/events", headers=[(b"Authorization", b"Bearer \xe9t\xe9")])
    assert_problem(r, 401, "unauthorized")
    # A bad body is not even looked at without a key.
    assert_problem(client.post("/v1/activities", content=b"{", headers={}), 401, "unauthorized")
    assert state(client) == before


def test_service_key_on_admin_endpoint_403(client: TestClient) -> None:
    r = client.post("/v1/activities", json={"activity_id": "new-act"}, headers=SERVICE)
    assert_problem(r, 403, "forbidden")
    assert_problem(client.get("/v1/activities/new-act", headers=SERVICE), 404, "activity_not_found")
    # The admin key may: role, not the endpoint, decided.
    assert_ok(client.post("/v1/activities", json={"activity_id": "new-act"}, headers=ADMIN), 201)


def test_admin_key_works_on_service_endpoints(client: TestClient) -> None:
    assert_ok(
        client.post("/v1/activities", json={"activity_id": "a", "team_size": 2}, headers=ADMIN), 201
    )
    assert assert_ok(client.get("/v1/activities/a", headers=ADMIN), 200)["team_size"] == 2
    r = client.post(
        "/v1/activities/a/teams", json={"leader_id": "L", "team_id": "t1"}, headers=ADMIN
    )
    assert assert_ok(r, 201)["team_id"] == "t1"
    assert (
        assert_ok(client.post(f"{TEAM}/locks", json={"user_id": "u1"}, headers=ADMIN), 201)[
            "user_id"
        ]
        == "u1"
    )
    assert (
        assert_ok(client.get("/v1/activities/a/users/u1/lock", headers=ADMIN), 200)["team_id"]
        == "t1"
    )
    assert assert_ok(client.delete(f"{TEAM}/locks/u1", headers=ADMIN), 200) == {"released": True}
    assert_ok(client.post(f"{TEAM}/locks", json={"user_id": "u1"}, headers=ADMIN), 201)
    r = client.post(f"{TEAM}/members", json={"user_id": "u1", "order_id": "o1"}, headers=ADMIN)
    assert assert_ok(r, 201)["formed"] is True
    assert assert_ok(client.get(TEAM, headers=ADMIN), 200)["status"] == "formed"
    assert assert_ok(client.get("/v1/events", headers=ADMIN), 200)["events"]


# -- request bodies -----------------------------------------------------------------


def post_raw(client: TestClient, url: str, raw: bytes, headers: dict[str, str]) -> httpx.Response:
    return client.post(url, content=raw, headers={**headers, "Content-Type": "application/json"})


def test_malformed_bodies_422(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team(team_size=3)
    before = state(client)
    raws = [
        b"",
        b"   ",
        b"\n",
        b"{",
        b"}",
        b"{]",
        b'{"user_id": "u1",}',
        b"{'user_id': 'u1'}",
        b"[]",
        b'["u1"]',
        b'"u1"',
        b"1",
        b"null",
        b"true",
        b"NaN",
        b"Infinity",
        b"\xff\xfe\x00",
        b'{"user_id": "u1"} {"user_id": "u2"}',
        b'{"user_id": "u1"}]',
        b'\xef\xbb\xbf{"user_id": "u1"}',
    ]
    for name, (_path, url, _good, headers) in POSTS.items():
        for raw in raws:
            r = post_raw(client, url, raw, headers)
            assert_problem(r, 422, "invalid_request")
        # A form is not JSON: 415 (SPEC §3), never read as a form.
        r = client.post(url, data={"user_id": "u1"}, headers=headers)
        assert_problem(r, 415, "unsupported_media_type")
        assert state(client) == before, name


def test_unknown_missing_and_mistyped_fields_422(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team(team_size=3)
    before = state(client)
    for name, (_path, url, good, headers) in POSTS.items():
        cases: list[dict[str, Any]] = [
            {},
            {**good, "extra": 1},
            {**good, "User_Id": "x"},
            {**good, "": 1},
        ]
        for field in REQUIRED[name]:
            cases.append({k: v for k, v in good.items() if k != field})
            cases.append({**good, field: None})
        for field in ID_FIELDS[name]:
            for wrong in (1, 0, 1.5, True, False, ["u1"], {"id": "u1"}):
                cases.append({**good, field: wrong})
        for body in cases:
            r = client.post(url, json=body, headers=headers)
            assert_problem(r, 422, "invalid_request")
        assert state(client) == before, name

    # Optional ids may be null or left out: that is not an error.
    r = client.post(
        "/v1/activities/a/teams",
        json={"leader_id": "L3", "team_id": None, "order_id": None},
        headers=SERVICE,
    )
    assert assert_ok(r, 201)["members"][0]["order_id"] is None


def test_wrong_number_types_422(client: TestClient) -> None:
    before_missing = client.get("/v1/activities/n1", headers=SERVICE)
    assert_problem(before_missing, 404, "activity_not_found")
    raw_values = [
        b'"3"',
        b"true",
        b"false",
        b"3.0",
        b"3.5",
        b"2e0",
        b"[3]",
        b'{"n": 3}',
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"1e400",
        b"0x3",
        b"03",
        b"+3",
        b"3n",
    ]
    for field in ("team_size", "lock_ttl_s", "team_deadline_s"):
        for raw in raw_values:
            body = b'{"activity_id": "n1", "%s": %s}' % (field.encode(), raw)
            r = post_raw(client, "/v1/activities", body, ADMIN)
            assert r.status_code == 422, (body, r.text)
            assert_problem(r, 422, "invalid_request")
    for raw in (b"1", b"true", b"[]", b"{}", b"NaN"):
        r = post_raw(client, "/v1/activities", b'{"activity_id": "n1", "name": %s}' % raw, ADMIN)
        assert_problem(r, 422, "invalid_request")
    assert_problem(client.get("/v1/activities/n1", headers=SERVICE), 404, "activity_not_found")
    # null for an optional number means "the default", like leaving it out.
    r = client.post("/v1/activities", json={"activity_id": "n1", "team_size": None}, headers=ADMIN)
    assert assert_ok(r, 201)["team_size"] == 3


def test_out_of_range_numbers_422(client: TestClient) -> None:
    cases: dict[str, list[Any]] = {
        "team_size": [1, 0, -1, 51, 10**30, -(10**30), 2**63, 2**64],
        "lock_ttl_s": [0, -1, 86401, 10**30],
        "team_deadline_s": [0, -1, 2592001, 10**30],
        "name": ["x" * 201],
    }
    for field, values in cases.items():
        for value in values:
            r = client.post(
                "/v1/activities", json={"activity_id": "r1", field: value}, headers=ADMIN
            )
            assert_problem(r, 422, "invalid_request")
    assert_problem(client.get("/v1/activities/r1", headers=SERVICE), 404, "activity_not_found")
    # The bounds themselves are accepted.
    bounds: dict[str, dict[str, Any]] = {
        "lo": {"team_size": 2, "lock_ttl_s": 1, "team_deadline_s": 1},
        "hi": {"team_size": 50, "lock_ttl_s": 86400, "team_deadline_s": 2592000, "name": "x" * 200},
    }
    for aid, params in bounds.items():
        created = assert_ok(
            client.post("/v1/activities", json={"activity_id": aid, **params}, headers=ADMIN), 201
        )
        assert {k: created[k] for k in params} == params


def test_bad_ids_in_bodies_422(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team(team_size=3)
    before = state(client)
    for name, (_path, url, good, headers) in POSTS.items():
        for field in ID_FIELDS[name]:
            for bad in BAD_IDS:
                r = client.post(url, json={**good, field: bad}, headers=headers)
                assert_problem(r, 422, "invalid_request")
            # Escaped in the JSON text: the decoded value is what counts.
            r = post_raw(client, url, json.dumps({**good, field: "a\u2028b"}).encode(), headers)
            assert_problem(r, 422, "invalid_request")
        assert state(client) == before, name
    # 64 characters is still an id.
    longest = "A" * 32 + "z9_-" * 8
    assert len(longest) == 64
    created = assert_ok(
        client.post("/v1/activities", json={"activity_id": longest}, headers=ADMIN), 201
    )
    assert created["activity_id"] == longest
    assert assert_ok(client.get(f"/v1/activities/{longest}", headers=SERVICE), 200) == created


# -- ids in URL path segments ---------------------------------------------------------

# Percent-encoded bad ids for a path segment (the '/' and empty cases are tested apart).
BAD_SEGMENTS = [
    "x" * 65,
    "a%20b",
    "a%3Ab",
    "a:b",
    "a%7Bb",
    "%7Ba%7D",
    "a%7D",
    "%C3%A9",
    "%E6%97%A5",
    "a%0A",
    "%0Aa",
    "a%0Ab",
    "a%0D",
    "a%00b",
    "a.b",
    "a%2Eb",
    "a%25",
    "a%5Cb",
    "a%2A",
    "a%22",
    "a%27",
    "a+b",
    "~a",
]


def segment_urls(segment: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(method, url, json) for every route, with `segment` in each path parameter in turn."""
    urls = []
    for endpoint in ENDPOINTS:
        names = re.findall(r"{(\w+)}", endpoint.path)
        for name in names:
            path = endpoint.path.replace(f"{{{name}}}", segment)
            path = re.sub(
                r"{(\w+)}",
                lambda m: {"activity_id": "a", "team_id": "t1"}.get(m.group(1), "u1"),
                path,
            )
            body = None
            if endpoint.body is not None:
                body = (
                    {"leader_id": "L2", "team_id": "t2"}
                    if path.endswith("/teams")
                    else {"user_id": "u1", "order_id": "o1"}
                )
            urls.append((endpoint.method, path, body))
    return urls


def test_bad_ids_in_path_segments_422(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team(team_size=3)
    before = state(client)
    checked = 0
    for segment in BAD_SEGMENTS:
        for method, url, body in segment_urls(segment):
            r = client.request(method, url, json=body, headers=ADMIN)
            assert_problem(r, 422, "invalid_request")
            checked += 1
    assert checked >= len(BAD_SEGMENTS) * 10
    assert state(client) == before


@pytest.mark.parametrize(
    "url",
    ["/v1/activities/a%2Fteams%2Ft1", "/v1/activities/a%2Fb", "/v1/activities/a/teams/t1%2Flocks"],
)
def test_encoded_slash_in_path_id_422(client: TestClient, url: str, opened_team: OpenTeam) -> None:
    opened_team(team_size=3)
    r = client.get(url, headers=SERVICE)
    assert_problem(r, 422, "invalid_request")


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("GET", "/v1/activities//teams/t1"),
        ("POST", "/v1/activities//teams"),
        ("GET", "/v1/activities/a/users//lock"),
        ("DELETE", "/v1/activities/a/teams/t1/locks/"),
    ],
)
def test_empty_path_id_422(
    client: TestClient, method: str, url: str, opened_team: OpenTeam
) -> None:
    opened_team(team_size=3)
    before = state(client)
    r = client.request(
        method,
        url,
        json={"leader_id": "L2", "team_id": "t2"},
        headers=SERVICE,
        follow_redirects=False,
    )
    assert_problem(r, 422, "invalid_request")
    assert state(client) == before


def test_empty_path_id_is_refused_and_changes_nothing(
    client: TestClient, opened_team: OpenTeam
) -> None:
    """Whatever its status, a request with an empty path id fails and touches nothing."""
    opened_team(team_size=3)
    before = state(client)
    for method, url in [
        ("GET", "/v1/activities//teams/t1"),
        ("POST", "/v1/activities//teams"),
        ("GET", "/v1/activities/a/users//lock"),
        ("POST", "/v1/activities/a/teams//locks"),
        ("DELETE", "/v1/activities/a/teams//locks/u1"),
    ]:
        r = client.request(
            method,
            url,
            json={"leader_id": "L2", "team_id": "t2", "user_id": "u1"},
            headers=SERVICE,
            follow_redirects=False,
        )
        assert 400 <= r.status_code < 500, (url, r.status_code)
        assert_problem(r, r.status_code)
    assert state(client) == before


# -- size limit ---------------------------------------------------------------------


def test_body_over_64_kib_413_and_nothing_created(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team(team_size=3)
    before = state(client)
    # Exactly 64 KiB (padded with JSON whitespace) is still accepted.
    body = json.dumps({"activity_id": "new-act"}).encode()
    exact = body[:-1] + b" " * (MAX_BODY - len(body)) + b"}"
    assert len(exact) == MAX_BODY
    over = body[:-1] + b" " * (MAX_BODY + 1 - len(body)) + b"}"
    assert len(over) == MAX_BODY + 1

    r = post_raw(client, "/v1/activities", over, ADMIN)
    assert_problem(r, 413, "payload_too_large")
    big_name = json.dumps({"activity_id": "new-act", "name": "x" * (MAX_BODY + 10)}).encode()
    assert_problem(post_raw(client, "/v1/activities", big_name, ADMIN), 413, "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
        yield b'{"activity_id": "new-act", "name": "'
        for _ in range(70):
            yield b"x" * 1024
        yield b'"}'

    r = client.post("/v1/activities", content=chunks(), headers=ADMIN)
    assert "content-length" not in {k.lower() for k in r.request.headers}
    assert_problem(r, 413, "payload_too_large")
    for name, (_path, url, good, headers) in POSTS.items():
        padded = json.dumps(good).encode()[:-1] + b" " * MAX_BODY + b"}"
        assert_problem(post_raw(client, url, padded, headers), 413, "payload_too_large")
        assert state(client) == before, name

    assert_ok(post_raw(client, "/v1/activities", exact, ADMIN), 201)
    assert assert_ok(client.get("/v1/activities/new-act", headers=SERVICE), 200)["name"] is None


# -- routing ------------------------------------------------------------------------


def test_unknown_route_404_and_wrong_method_405(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team(team_size=3)
    for url in (
        "/nope",
        "/v1",
        "/v1/activity/a",
        "/v1/activities/a/teams/t1/unknown",
        "/v2/events",
    ):
        assert_problem(client.get(url, headers=SERVICE), 404, "not_found")
    assert_problem(client.get("/nope"), 404, "not_found")
    before = state(client)
    for method, url in [
        ("DELETE", "/v1/activities"),
        ("PUT", "/v1/activities/a"),
        ("DELETE", "/v1/activities/a"),
        ("POST", "/v1/activities/a"),
        ("DELETE", TEAM),
        ("PATCH", TEAM),
        ("GET", f"{TEAM}/locks"),
        ("GET", f"{TEAM}/members"),
        ("POST", "/v1/events"),
        ("POST", "/healthz"),
        ("PUT", f"{TEAM}/locks/u1"),
    ]:
        r = client.request(method, url, headers=ADMIN)
        assert_problem(r, 405, "method_not_allowed")
    assert state(client) == before


def test_405_names_the_allowed_methods(client: TestClient) -> None:
    r = client.delete("/v1/activities/a", headers=SERVICE)
    assert_problem(r, 405, "method_not_allowed")
    assert {"GET", "PATCH"} <= set(r.headers.get("allow", "").replace(" ", "").split(","))


def test_no_query_parameters_where_none_are_defined(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team(team_size=3)
    before = state(client)
    assert_problem(client.get(f"{TEAM}?x=1", headers=SERVICE), 422, "invalid_request")
    r = client.post("/v1/activities?dry_run=1", json={"activity_id": "new-act"}, headers=ADMIN)
    assert_problem(r, 422, "invalid_request")
    assert state(client) == before


def test_openapi_document_lists_every_route(client: TestClient) -> None:
    r = client.get("/openapi.json")
    doc = assert_ok(r, 200)
    assert doc["openapi"].startswith("3.1")
    assert doc["info"]["title"] and doc["info"]["version"]

    app_routes: dict[str, set[str]] = {}
    for route in app_of(client).routes:
        if getattr(route, "path", "") == "/console":
            continue  # the console's HTML pages (docs/console.md), not the JSON API
        assert isinstance(route, Route)
        if not route.include_in_schema:  # a page for browsers (groupbuy/api/pages.py)
            continue
        app_routes.setdefault(route.path, set()).update(
            m.lower() for m in (route.methods or ()) if m != "HEAD"
        )
    documented = {path: set(ops) for path, ops in doc["paths"].items()}
    assert documented == app_routes
    for path in (
        "/v1/activities",
        "/v1/activities/{activity_id}",
        "/v1/activities/{activity_id}/teams",
        "/v1/activities/{activity_id}/teams/{team_id}",
        "/v1/activities/{activity_id}/teams/{team_id}/locks",
        "/v1/activities/{activity_id}/teams/{team_id}/locks/{user_id}",
        "/v1/activities/{activity_id}/teams/{team_id}/members",
        "/v1/activities/{activity_id}/users/{user_id}/lock",
        "/v1/events",
        "/healthz",
        "/readyz",
        "/openapi.json",
    ):
        assert path in documented, path

    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (path, method)
            params = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert params == set(re.findall(r"{(\w+)}", path)), (path, method)
            # running a job, replaying a dead letter, rotating a webhook secret and sending
            # a webhook test message take no body
            if (
                method == "post"
                and not path.startswith(("/v1/admin/jobs/", "/v1/admin/dead-letters/"))
                and not path.endswith(("/secret/rotate", "/test"))
            ):
                assert "application/json" in op["requestBody"]["content"], path
                assert "422" in op["responses"] and "413" in op["responses"], path
    assert doc["paths"]["/v1/activities"]["post"]["security"] == [{"bearer": []}]
    assert doc["paths"]["/healthz"]["get"]["security"] == []
    assert set(
        doc["paths"]["/v1/activities/{activity_id}/teams/{team_id}/locks"]["post"]["responses"]
    ) >= {"200", "201", "404", "409", "422"}


# -- property: no input produces a 5xx ------------------------------------------------

FIELD_NAMES = [
    "activity_id",
    "name",
    "team_size",
    "lock_ttl_s",
    "team_deadline_s",
    "leader_id",
    "team_id",
    "order_id",
    "user_id",
]
ids = st.sampled_from(["a", "t1", "t2", "u1", "u2", "u3", "L", "o1"]) | st.from_regex(
    r"[A-Za-z0-9_-]{1,64}", fullmatch=True
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-100, max_value=100_000)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=70)
    | ids
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.text(max_size=12) | st.sampled_from(FIELD_NAMES)
    return st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)


json_values = st.recursive(leaves, _containers, max_leaves=12)
# Bodies shaped like each endpoint's: valid ones reach Redis (201/200/404/409), the rest 422.
near_valid = {
    "activities": st.fixed_dictionaries(
        {"activity_id": ids},
        optional={
            "name": st.none() | st.text(max_size=210),
            "team_size": st.integers(0, 60),
            "lock_ttl_s": st.integers(-2, 90_000),
            "team_deadline_s": st.integers(-2, 2_600_000),
            "extra": json_values,
        },
    ),
    "teams": st.fixed_dictionaries(
        {"leader_id": ids},
        optional={"team_id": st.none() | ids, "order_id": st.none() | ids | json_values},
    ),
    "locks": st.fixed_dictionaries({"user_id": ids | json_values}),
    "members": st.fixed_dictionaries({"user_id": ids}, optional={"order_id": ids | json_values}),
}


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()  # NaN and Infinity come out as their JS literals


def bodies(name: str) -> st.SearchStrategy[bytes]:
    """Arbitrary bodies for one POST endpoint: JSON-ish values, endpoint-shaped objects, bytes."""
    as_json = st.one_of(
        near_valid[name],
        json_values,
        st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=6),
    ).map(_json_bytes)
    return as_json | st.binary(max_size=300)


@pytest.fixture
def fuzz_client(client: TestClient, opened_team: OpenTeam) -> TestClient:
    opened_team(team_size=3)
    return client


@pytest.mark.parametrize("name", list(POSTS))
@settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_arbitrary_bodies_never_5xx(
    fuzz_client: TestClient, name: str, data: st.DataObject
) -> None:
    path, url, _good, headers = POSTS[name]
    raw = data.draw(bodies(name), label="body")
    openapi = app_of(fuzz_client).state.openapi
    documented = {int(code) for code in openapi["paths"][path]["post"]["responses"]}
    r = post_raw(fuzz_client, url, raw, headers)
    assert r.status_code < 500, (raw, r.status_code, r.text)
    assert r.status_code in documented, (raw, r.status_code, r.text)
    if r.status_code >= 400:
        assert_problem(r, r.status_code)
    else:
        assert r.headers["content-type"].startswith("application/json")
        assert isinstance(r.json(), dict)
