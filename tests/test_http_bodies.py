"""Request bodies: declared as JSON (415 otherwise), and no key twice in one object (422)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from starlette.testclient import TestClient

from groupbuy import errors
from groupbuy.api.endpoints import (
    duplicate_key,
    is_json_media_type,
    may_have_duplicate_keys,
    parse_body,
)
from groupbuy.api.redpackets import Grab, PacketSend
from groupbuy.api.teams import ActivityCreate
from tests.support.http import ADMIN, assert_ok, assert_problem

JSON = {"Content-Type": "application/json"}


def post(client: TestClient, url: str, raw: bytes, content_type: str | None = "application/json"):  # type: ignore[no-untyped-def]
    headers = dict(ADMIN) if content_type is None else {**ADMIN, "Content-Type": content_type}
    return client.post(url, content=raw, headers=headers)


def balance(client: TestClient, user_id: str) -> int:
    body = assert_ok(client.get(f"/v1/accounts/{user_id}", headers=ADMIN), 200)
    return int(body["balance_cents"])


def test_a_repeated_key_is_refused_not_read_as_the_last(client: TestClient) -> None:
    raw = b'{"amount_cents": 1, "reference": "r1", "amount_cents": 700}'
    problem = assert_problem(post(client, "/v1/accounts/u1/deposits", raw), 422, "invalid_request")
    assert "'amount_cents'" in problem["detail"]
    assert problem["errors"] == [{"field": "amount_cents", "message": "duplicate key"}]
    assert balance(client, "u1") == 0
    # the same body with the key once is fine
    ok = post(client, "/v1/accounts/u1/deposits", b'{"amount_cents": 700, "reference": "r1"}')
    assert_ok(ok, 201)
    assert balance(client, "u1") == 700


@pytest.mark.parametrize(
    "raw",
    [
        b'{"activity_id":"a1","virtual_completion":{"min_members":2,"min_members":3}}',
        b'{"activity_id":"a1","limits":{"teams_per_user":2,"teams_per_user":2}}',
        b'{"activity_id":"a1","activity_id":"a1"}',
        b'{"activity_id" : "a1", "activity_id" : "a2"}',
        b'{"activity_id":"a\\u0031","activity_id":"a2"}',
        b'{"name":"12:00","activity_id":"a1","name":"13:00"}',
        # invalid otherwise too: the duplicate is what the answer names
        b'{"activity_id":"a1","team_size":1,"team_size":1}',
    ],
)
def test_repeated_keys_at_any_depth_are_named(client: TestClient, raw: bytes) -> None:
    problem = assert_problem(post(client, "/v1/activities", raw), 422, "invalid_request")
    assert problem["errors"][0]["message"] == "duplicate key", problem
    assert problem["errors"][0]["field"] in raw.decode(), problem
    assert_problem(client.get("/v1/activities/a1", headers=ADMIN), 404)


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/merge-patch+json",
        "application/json; charset=latin-1",
        "application/jsonx",
        "",
        None,
    ],
)
def test_a_body_not_declared_json_is_415(client: TestClient, content_type: str | None) -> None:
    raw = b'{"amount_cents": 700, "reference": "r1"}'
    response = post(client, "/v1/accounts/u1/deposits", raw, content_type)
    problem = assert_problem(response, 415, "unsupported_media_type")
    assert problem["content_type"] == content_type
    assert balance(client, "u1") == 0


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        'application/json;charset="UTF-8"',
        "application/json ; charset=utf8",
    ],
)
def test_json_with_or_without_a_utf8_charset_is_accepted(
    client: TestClient, content_type: str
) -> None:
    raw = b'{"amount_cents": 700, "reference": "r1"}'
    assert_ok(post(client, "/v1/accounts/u1/deposits", raw, content_type), 201)


def test_no_body_and_no_type_is_still_a_missing_body(client: TestClient) -> None:
    problem = assert_problem(post(client, "/v1/activities", b"", None), 422, "invalid_request")
    assert "needs a JSON object body" in problem["detail"]


def test_calls_that_take_no_body_need_no_content_type(client: TestClient) -> None:
    assert_ok(post(client, "/v1/activities", b'{"activity_id": "a"}'), 201)
    assert_ok(
        post(
            client, "/v1/activities/a/teams", b'{"leader_id": "l", "team_id": "t", "order_id": "o"}'
        ),
        201,
    )
    assert_ok(post(client, "/v1/activities/a/teams/t/locks", b'{"user_id": "u"}'), 201)
    released = client.delete("/v1/activities/a/teams/t/locks/u", headers=ADMIN)
    assert assert_ok(released, 200) == {"released": True}
    ran = client.post("/v1/admin/jobs/sweep_locks/run", headers=ADMIN)
    assert assert_ok(ran, 200)["job"] == "sweep_locks"
    ran = post(client, "/v1/admin/jobs/sweep_locks/run", b"", "text/plain")
    assert assert_ok(ran, 200)["job"] == "sweep_locks"


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("application/json", True),
        ("application/json;charset=utf-8", True),
        ("application/json; version=2", False),
        ("application/problem+json", False),
        ("json", False),
    ],
)
def test_the_media_type_rule(content_type: str, expected: bool) -> None:
    assert is_json_media_type(content_type) is expected


@pytest.mark.parametrize(
    ("raw", "fast"),
    [
        (b'{"user_id":"u1"}', True),
        (b'{"user_id": "u1"}', True),
        (b'{"user_id" : "u1"}', False),  # a space before the colon: the full check
        (b'{"user_id":"u\\u0031"}', False),  # an escape: the full check
        (b'{"user_id":"u1","user_id":"u2"}', False),
    ],
)
def test_the_cheap_certificate_only_vouches_for_plain_bodies(raw: bytes, fast: bool) -> None:
    parsed = Grab.model_validate_json(raw)
    assert may_have_duplicate_keys(raw, parsed) is not fast


_KEYS = st.sampled_from(["sender_id", "amount_cents", "count", "packet_id", "strategy", "x:y"])
_VALUES = st.one_of(st.integers(1, 100), st.sampled_from(["s", "a:b", 'q"', "equal"]))


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(_KEYS, _VALUES), max_size=6), spaced=st.booleans())
def test_parse_body_refuses_exactly_the_bodies_with_a_repeated_key(
    pairs: list[tuple[str, object]], spaced: bool
) -> None:
    separator = " : " if spaced else ":"
    raw = (
        "{" + ",".join(f"{json.dumps(k)}{separator}{json.dumps(v)}" for k, v in pairs) + "}"
    ).encode()
    keys = [k for k, _ in pairs]
    repeated = len(set(keys)) != len(keys)
    assert (duplicate_key(raw) is not None) is repeated
    try:
        parse_body(PacketSend, raw)
    except errors.InvalidRequest as exc:
        is_duplicate = exc.extra["errors"][0]["message"] == "duplicate key"
        assert is_duplicate is repeated
    else:
        assert not repeated


def test_nested_models_count_their_keys() -> None:
    raw = (
        b'{"activity_id":"a","virtual_completion":{"min_members":2},"limits":{"teams_per_user":2}}'
    )
    assert not may_have_duplicate_keys(raw, ActivityCreate.model_validate_json(raw))
    with pytest.raises(ValidationError):
        ActivityCreate.model_validate_json(b'{"activity_id":"a","nope":1}')


@pytest.mark.parametrize(
    ("raw", "detail", "field"),
    [
        (b'{"activity_id": ', "invalid body: Invalid JSON: EOF while parsing", "body"),
        (b"[1]", "invalid body: Input should be an object", "body"),
        (b'{"activity_id": "a1", "team_size": 1}', "invalid body: team_size: ", "team_size"),
    ],
)
def test_a_bad_body_is_named_once(client: TestClient, raw: bytes, detail: str, field: str) -> None:
    """`invalid body: body: Invalid JSON` said "body" twice: a fault of the whole body is
    said once, a field's fault names the field."""
    problem = assert_problem(post(client, "/v1/activities", raw), 422, "invalid_request")
    assert problem["detail"].startswith(detail), problem
    assert "body: body" not in problem["detail"]
    assert problem["errors"][0]["field"] == field, problem


def test_a_validator_message_shows_without_pydantics_prefix(client: TestClient) -> None:
    teams = "/v1/activities/a1/teams"
    rule = client.get(f"{teams}?status=formed&has_free_seats=false", headers=ADMIN)
    problem = assert_problem(rule, 422, "invalid_request")
    assert problem["detail"] == "invalid query: has_free_seats applies to status=open only"
    assert problem["errors"] == [
        {"field": "query", "message": "has_free_seats applies to status=open only"}
    ]
    cursor = assert_problem(client.get(f"{teams}?cursor=zzz", headers=ADMIN), 422)
    assert cursor["detail"] == "invalid query: cursor: not a cursor this list answered"
    assert "Value error" not in json.dumps([problem, cursor])
