"""HTTP tests of the waitlist (SPEC §3 "Waitlist"): a free seat is a lock at once, a full
team queues (202, the position), the offer reaches GET and the events feed, DELETE leaves,
and the refusals. On fakeredis and a real redis-server, SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
from starlette.testclient import TestClient

from tests.support.http import (
    ADMIN,
    SERVICE,
    assert_ok,
    assert_problem,
    lock,
    make_activity,
    open_team,
)


def queue(client: TestClient, aid: str, uid: str, tid: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"user_id": uid} | ({"team_id": tid} if tid else {})
    return client.post(f"/v1/activities/{aid}/waitlist", json=body, headers=SERVICE)


def entry(client: TestClient, aid: str, uid: str) -> httpx.Response:
    return client.get(f"/v1/activities/{aid}/waitlist/{uid}", headers=SERVICE)


def events(client: TestClient, kind: str) -> list[dict[str, Any]]:
    """The data of the feed's events of `kind`, after the write-behind ran."""
    assert_ok(client.post("/v1/admin/jobs/flush_records/run", headers=ADMIN), 200)
    feed = assert_ok(client.get("/v1/events?after=0&limit=1000", headers=SERVICE), 200)
    return [e["data"] for e in feed["events"] if e["type"] == kind]


def test_queue_then_an_unlock_offers_the_seat(client: TestClient) -> None:
    """A free seat: 201 the lock. A full team: 202 queued, in order; an unlock offers the
    seat to position 1 (GET: offered; the feed: lock.offered); the next moves up."""
    make_activity(client, "wl", team_size=2, waitlist={"offer_ttl_s": 120})
    open_team(client, "wl", "t1", "L")
    taken = assert_ok(queue(client, "wl", "u1", "t1"), 201)
    assert (taken["status"], taken["team_id"]) == ("locked", "t1")
    first = assert_ok(queue(client, "wl", "w1", "t1"), 202)
    second = assert_ok(queue(client, "wl", "w2", "t1"), 202)
    assert (first["status"], first["position"], second["position"]) == ("queued", 1, 2)
    assert assert_ok(queue(client, "wl", "w2", "t1"), 202) == second  # a repeat
    activity = assert_ok(client.get("/v1/activities/wl", headers=SERVICE), 200)
    assert (activity["waiting"], activity["waiting_any_team"]) == (2, 0)
    assert activity["oldest_waiting_since"] == first["queued_at"]
    assert activity["waitlist"] == {"max_len": 10000, "ttl_s": 600, "offer_ttl_s": 120}

    released = client.delete("/v1/activities/wl/teams/t1/locks/u1", headers=SERVICE)
    assert assert_ok(released, 200) == {"released": True}
    offer = assert_ok(entry(client, "wl", "w1"), 200)
    assert (offer["status"], offer["team_id"]) == ("offered", "t1")
    assert assert_ok(queue(client, "wl", "w1"), 200) == offer  # POST again: the offer
    assert assert_ok(entry(client, "wl", "w2"), 200)["position"] == 1
    (offered,) = events(client, "lock.offered")
    assert (offered["user_id"], offered["team_id"]) == ("w1", "t1")
    assert offered["expires_at"] == offer["expires_at"]


def test_leave_the_line_and_read_nothing(client: TestClient) -> None:
    """DELETE takes the entry out (idempotent); GET then answers 404 not_waiting."""
    make_activity(client, "bye", team_size=2)
    open_team(client, "bye", "t1", "L")
    assert_ok(lock(client, "bye", "t1", "u1"), 201)
    assert_ok(queue(client, "bye", "w1"), 202)
    gone = client.delete("/v1/activities/bye/waitlist/w1", headers=SERVICE)
    assert assert_ok(gone, 200) == {"removed": True}
    again = client.delete("/v1/activities/bye/waitlist/w1", headers=SERVICE)
    assert assert_ok(again, 200) == {"removed": False}
    assert_problem(entry(client, "bye", "w1"), 404, "not_waiting")
    assert_problem(entry(client, "nope", "w1"), 404, "activity_not_found")


def test_refusals(client: TestClient) -> None:
    """409 waitlist_full, already_locked; 404 team_not_found; 422 bad input, and a bad
    waitlist on create; none of them queues anyone."""
    make_activity(client, "tight", team_size=2, waitlist={"max_len": 1})
    open_team(client, "tight", "t1", "L")
    assert_ok(lock(client, "tight", "t1", "u1"), 201)
    assert_problem(queue(client, "tight", "u1", "t1"), 409, "already_locked")
    assert_ok(queue(client, "tight", "w1", "t1"), 202)
    full = assert_problem(queue(client, "tight", "w2", "t1"), 409, "waitlist_full")
    assert full["max_len"] == 1
    assert_problem(queue(client, "tight", "w3", "nope"), 404, "team_not_found")
    assert_problem(queue(client, "tight", "bad id!"), 422, "invalid_request")
    for waitlist in ({"max_len": 0}, {"ttl_s": 0}, {"offer_ttl_s": 86401}, {"extra": 1}):
        body = {"activity_id": "w-bad", "waitlist": waitlist}
        assert_problem(client.post("/v1/activities", json=body, headers=ADMIN), 422)
    activity = assert_ok(client.get("/v1/activities/tight", headers=SERVICE), 200)
    assert activity["waiting"] == 1
