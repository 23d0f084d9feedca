"""How the sale is going (issue 40): an activity's seats against its stock, the funnel of its
seat locks over the last minutes (counted outside the scripts, groupbuy/locks/funnel.py),
its teams full of locks, and the overview's outcomes by code apart from real errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.testclient import TestClient

from groupbuy.console.overview import by_code
from groupbuy.console.sale import SALE_FIELDS
from groupbuy.console.sampler import rates_between, read_sample
from groupbuy.locks import funnel
from groupbuy.locks.funnel import FunnelStore, Tally
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.events import Event
from groupbuy.storage.keys import Keys
from tests.support.backends import ALL
from tests.support.console import assert_no_inline_script, sign_in
from tests.support.http import (
    ADMIN,
    ADMIN_KEY,
    SERVICE,
    app_services,
    assert_ok,
    assert_problem,
    lock,
    make_activity,
    open_team,
    portal,
)

LOCK_TTL_S = 60  # the activity's locks: the clock moves past one to expire it


def _run(client: TestClient, job: str) -> Any:
    return assert_ok(client.post(f"/v1/admin/jobs/{job}/run", headers=ADMIN), 200)


def _flushed(client: TestClient) -> None:
    """The app's funnel counts in Redis now (waiting for a flush under way, if any)."""
    portal(client).call(app_services(client).funnel.flush)


def _activity_update(client: TestClient, aid: str) -> dict[str, Any]:
    update: dict[str, Any] = assert_ok(
        client.get(f"/console/live.json?page=activity&id={aid}"), 200
    )
    return update


@pytest.fixture
def sale(client: TestClient) -> Iterator[TestClient]:
    """An activity of 10 units with a team of three seats, through a sale's moments: locks
    taken (one moved from another team, one repeated), one refused team_full, one unlocked,
    one confirmed, one expired by the sweep; the records written to SQL; an admin signed in."""
    make_activity(client, "a1", team_size=3, lock_ttl_s=LOCK_TTL_S, team_deadline_s=3600, stock=10)
    open_team(client, "a1", "t1", "lead")
    open_team(client, "a1", "t2", "lead2")
    assert_ok(lock(client, "a1", "t2", "u1"), 201)
    moved = assert_ok(lock(client, "a1", "t1", "u1"), 201)  # moved: t2's lock released
    assert moved["released_team_id"] == "t2"
    assert_ok(lock(client, "a1", "t1", "u1"), 200)  # the same lock again: not counted
    assert_ok(lock(client, "a1", "t1", "u2"), 201)  # t1: the leader and two locks, full
    assert_problem(lock(client, "a1", "t1", "u3"), 409, "team_full")
    unlocked = client.delete("/v1/activities/a1/teams/t1/locks/u2", headers=SERVICE)
    assert assert_ok(unlocked, 200) == {"released": True}
    assert_ok(lock(client, "a1", "t1", "u3"), 201)
    confirm = {"user_id": "u1", "order_id": "o1"}
    assert_ok(client.post("/v1/activities/a1/teams/t1/members", json=confirm, headers=SERVICE), 201)
    app_services(client).clock.advance(LOCK_TTL_S + 1)  # u3's lock is past its time
    assert _run(client, "sweep_locks")
    _run(client, "flush_records")
    assert sign_in(client, ADMIN_KEY).status_code == 303
    _flushed(client)
    yield client


@pytest.mark.parametrize("backend", ALL)
def test_the_activity_page_shows_the_sale_and_its_funnel(sale: TestClient) -> None:
    """The page and its live update carry the same figures: units held against the stock,
    and over the window each outcome once (taken 4: u1 twice, u2, u3; released 2: the move
    and the unlock; confirmed 1; expired 1; refused team_full 1), with their shares."""
    update = _activity_update(sale, "a1")
    body = assert_ok(sale.get("/v1/activities/a1", headers=SERVICE), 200)
    fields = update["fields"]
    assert fields["seats_held"] == 10 - body["stock_left"] == 3  # lead, lead2, member u1
    assert (fields["stock"], fields["stock_left"], fields["stock_held_by_locks"]) == (10, 7, 0)
    window = {name: fields[name] for name in SALE_FIELDS if name.endswith("_window")}
    assert window == {
        "locks_taken_window": 4,
        "offered_window": 0,
        "confirmed_window": 1,
        "expired_window": 1,
        "released_window": 2,
        "refused_window": 1,
    }
    assert (fields["conversion"], fields["expired_rate"]) == (25.0, 25.0)
    assert update["tables"] == {"refused_by_code": {"team_full": 1}}
    assert fields["waiting"] == 0 and fields["oldest_waiting_since"] is None
    answer = sale.get("/console/activities/a1")
    assert answer.status_code == 200
    panel = assert_no_inline_script(answer.text).panels[("data-activity", "a1")]
    shown = {name: "–" if value is None else str(value) for name, value in fields.items()}
    assert {name: panel[name] for name in SALE_FIELDS} == {n: shown[n] for n in SALE_FIELDS}
    assert panel["refused_by_code.team_full"] == "1"
    # Nothing more happened: the page's figures hold still (a read counts nothing).
    _flushed(sale)
    assert _activity_update(sale, "a1") == update


def test_a_lines_offer_counts_as_a_lock_begun(client: TestClient) -> None:
    """The waitlist's offer (the `lock.offered` record, written by the unlock's script) is
    a lock begun in the window, counted once when the write-behind applies it."""
    make_activity(client, "wl", team_size=2)
    open_team(client, "wl", "t1", "lead")
    assert_ok(lock(client, "wl", "t1", "u1"), 201)
    line = {"user_id": "w1", "team_id": "t1"}
    assert_ok(client.post("/v1/activities/wl/waitlist", json=line, headers=SERVICE), 202)
    client.delete("/v1/activities/wl/teams/t1/locks/u1", headers=SERVICE)
    for _ in range(2):  # a second run finds the record applied: it counts once
        _run(client, "flush_records")
    assert sign_in(client, ADMIN_KEY).status_code == 303
    _flushed(client)
    fields = _activity_update(client, "wl")["fields"]
    assert (fields["locks_taken_window"], fields["offered_window"]) == (2, 1)
    assert (fields["released_window"], fields["waiting"]) == (1, 0)


def test_the_funnel_keeps_to_its_window_and_its_keys_expire(sale: TestClient) -> None:
    """Past the window the counts are gone from the figures, and every minute's hash has
    a TTL (SPEC §4.9: memory returns to its baseline after a sale)."""
    services = app_services(sale)
    keys = [services.keys.funnel("a1", minute) for minute in _minutes(sale)]

    async def ttls() -> list[int]:
        return [int(await services.redis.ttl(key)) for key in keys]

    found = [ttl for ttl in portal(sale).call(ttls) if ttl != -2]
    assert found and all(0 < ttl <= funnel.KEEP_S for ttl in found), found
    services.clock.advance(funnel.WINDOW_MINUTES * 60)
    fields = _activity_update(sale, "a1")["fields"]
    assert (fields["locks_taken_window"], fields["conversion"]) == (0, None)
    assert _activity_update(sale, "a1")["tables"] == {"refused_by_code": {}}


def _minutes(client: TestClient) -> range:
    """The minutes of the window now, on the app's Redis clock."""
    services = app_services(client)
    now_ms = portal(client).call(services.clock.now_ms, services.redis)
    now = now_ms // funnel.MINUTE_MS
    return range(now - funnel.WINDOW_MINUTES, now + 1)


def test_the_full_teams_are_listed_apart_from_those_with_a_free_seat(sale: TestClient) -> None:
    """`?teams=full` lists the open teams with no free seat (one page, Redis's index of open
    teams); `?teams=open` the others. t1 holds its leader, the member u1 and u3's expired
    lock (a free seat); a lock by u4 and u5 fills t2."""
    for user in ("u4", "u5"):
        assert_ok(lock(sale, "a1", "t2", user), 201)
    full = sale.get("/console/activities/a1?teams=full")
    assert full.status_code == 200
    assert 'data-teams="full"' in full.text and 'data-team="t2"' in full.text
    assert 'data-team="t1"' not in full.text
    opened = sale.get("/console/activities/a1?teams=open").text
    assert 'data-team="t1"' in opened and 'data-team="t2"' not in opened
    listed = assert_ok(
        sale.get("/v1/activities/a1/teams?has_free_seats=false", headers=SERVICE), 200
    )
    assert [team["team_id"] for team in listed["teams"]] == ["t2"]
    sale.delete("/v1/activities/a1/teams/t2/locks/u5", headers=SERVICE)
    assert (
        "No open team full of members and locks."
        in sale.get("/console/activities/a1?teams=full").text
    )


async def test_workers_counts_add_up_in_redis(redis_client: Any) -> None:
    """Two processes' tallies (each a worker of `serve --workers 2`) flushed to one Redis:
    the window is their sum, counts of one minute and of the flush's minute together, an
    event both applied (they drained one stream at once) counts once, and a count of a
    minute the window no longer shows is left out."""
    keys, clock = Keys("gbtest"), RedisClock()
    store = FunnelStore(redis_client, keys, clock)
    now_ms = await clock.now_ms(redis_client)
    gone_ms = now_ms - funnel.WINDOW_MINUTES * funnel.MINUTE_MS
    first, second = Tally(), Tally()
    for number, tally in enumerate((first, second)):
        tally.add("a1", funnel.TAKEN)
        tally.add("a1", funnel.REFUSED + "activity_sold_out")
        tally.add("a1", funnel.RELEASED, now_ms)
        tally.add("a1", funnel.EXPIRED, gone_ms)
        tally.add("a2", funnel.TAKEN)
        joined = Event("team.member_joined", now_ms, "team.member_joined:a1:t1:u1", {})
        tally.add_event("a1", funnel.CONFIRMED, joined)  # the same record, applied twice
        expired = Event("lock.expired", now_ms, f"lock.expired:a1:t1:u{number}:1", {})
        tally.add_event("a1", funnel.EXPIRED, expired)
        old = Event("lock.expired", gone_ms, f"lock.expired:a1:t1:v{number}:1", {})
        tally.add_event("a1", funnel.EXPIRED, old)
    assert await store.flush(first) == 6 and await store.flush(second) == 6
    assert await store.flush(first) == 0  # taken: nothing is written twice
    window = await store.window("a1")
    assert window.counts == {
        funnel.TAKEN: 2,
        funnel.OFFERED: 0,
        funnel.CONFIRMED: 1,
        funnel.EXPIRED: 2,
        funnel.RELEASED: 2,
    }
    assert window.refused == {"activity_sold_out": 2}
    shares = (window.share(funnel.CONFIRMED), window.share(funnel.EXPIRED))
    assert (window.locks, shares) == (2, (50, 100))
    assert (await store.window("a2")).count(funnel.TAKEN) == 2


async def test_a_failed_flush_keeps_its_counts_for_the_next() -> None:
    """Redis away: the counts go back to the tally, none is lost or doubled."""

    class Away:
        async def time(self) -> Any:
            raise ConnectionError("redis is away")

    tally = Tally()
    tally.add("a1", funnel.TAKEN)
    with pytest.raises(ConnectionError):
        await FunnelStore(Away(), Keys("gbtest"), RedisClock()).flush(tally)
    assert tally.take().plain == {("a1", None, funnel.TAKEN): 1}


def test_the_overview_tells_expected_outcomes_from_errors() -> None:
    """Answers 409 and 410 are the sale's outcomes, by code; other 4xx and 5xx are errors,
    by code beside them; a code idle since the last sample shows 0."""
    registry = CollectorRegistry()
    requests = Histogram(
        "groupbuy_http_request_duration_seconds", "", ["status"], registry=registry
    )
    problems = Counter("groupbuy_http_problems_total", "", ["status", "code"], registry=registry)
    problems.labels("409", "team_full").inc(0)
    before = read_sample(registry.collect(), at=0.0)
    for status, code, times in [
        ("409", "team_full", 6),
        ("409", "activity_sold_out", 2),
        ("410", "expired", 1),
        ("422", "invalid_request", 3),
        ("503", "redis_unavailable", 1),
    ]:
        for _ in range(times):
            requests.labels(status).observe(0.01)
            problems.labels(status, code).inc()
    requests.labels("200").observe(0.01)
    after = read_sample(registry.collect(), at=2.0)
    rates = rates_between(before, after)
    assert (rates.outcomes, rates.client_errors, rates.server_errors) == (4.5, 1.5, 0.5)
    assert by_code(after, rates) == {
        "outcomes_by_code": {"activity_sold_out": 1.0, "expired": 0.5, "team_full": 3.0},
        "errors_by_code": {"invalid_request": 1.5, "redis_unavailable": 0.5},
    }
    assert by_code(after, None)["outcomes_by_code"]["team_full"] == 0.0


def test_the_overview_page_lists_outcomes_by_code_live(sale: TestClient) -> None:
    """The process's problems counted by code reach the overview: its tables and its live
    update (team_full was answered while the sale was set up)."""
    assert_problem(lock(sale, "a1", "t1", "nobody!"), 422)
    page = sale.get("/console").text
    assert 'data-table="outcomes_by_code"' in page
    assert 'data-field="outcomes_by_code.team_full"' in page
    assert 'data-field="errors_by_code.invalid_request"' in page
    assert 'data-field="outcomes_per_s"' in page
    update = assert_ok(sale.get("/console/live.json?page=overview"), 200)
    assert {"team_full"} <= set(update["tables"]["outcomes_by_code"])
    assert "team_full" not in update["tables"]["errors_by_code"]
    assert "outcomes_per_s" in update["fields"] and "outcomes_by_code" not in update["fields"]
