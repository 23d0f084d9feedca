"""Per-user limits of an activity: teams a user may belong to, open teams a leader may
lead — counted in the scripts, given back when a team fails, kept under concurrency."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.testclient import TestClient

from groupbuy import errors
from groupbuy.services import Services
from tests.support.http import ADMIN, SERVICE, assert_problem

DEADLINE_S = 60


async def _join(services: Services, aid: str, tid: str, user: str) -> None:
    await services.teams.seats.lock(aid, tid, user)
    await services.teams.seats.confirm(aid, tid, user, f"o-{tid}-{user}")


async def test_a_user_belongs_to_at_most_teams_per_user(services: Services) -> None:
    teams, keys = services.teams, services.keys
    await teams.activities.create_activity("a", team_size=3, teams_per_user=2)
    await teams.activities.open_team("a", "u", team_id="t1")
    assert await services.redis.get(keys.user_counter("a", "u", "teams")) == "1"
    for tid in ("t2", "t3", "t4"):
        await teams.activities.open_team("a", f"L-{tid}", team_id=tid)
    await _join(services, "a", "t2", "u")
    with pytest.raises(errors.UserLimitReached) as refused:
        await teams.seats.lock("a", "t3", "u")  # not sent to pay for a seat they may not take
    assert refused.value.extra == {"limit": 2, "current": 2, "limit_name": "teams_per_user"}
    with pytest.raises(errors.UserLimitReached):
        await teams.activities.open_team("a", "u", team_id="t5")
    assert (await teams.activities.get_team("a", "t3"))["locks"] == []


async def test_a_failed_team_gives_its_members_their_count_back(services: Services) -> None:
    teams = services.teams
    await teams.activities.create_activity(
        "a", team_size=3, teams_per_user=1, team_deadline_s=DEADLINE_S
    )
    await teams.activities.open_team("a", "L", team_id="t1")
    await _join(services, "a", "t1", "m")
    services.clock.advance(DEADLINE_S)
    await teams.activities.open_team("a", "L2", team_id="t2")
    assert (await teams.activities.get_team("a", "t1"))["status"] == "failed"
    await _join(services, "a", "t2", "m")  # m's count came back with t1's failure
    await teams.activities.open_team("a", "L", team_id="t3")  # and the leader's
    with pytest.raises(errors.UserLimitReached):
        await teams.seats.lock("a", "t3", "m")


async def test_a_leader_leads_at_most_open_teams_per_leader(services: Services) -> None:
    teams = services.teams
    await teams.activities.create_activity("a", team_size=2, open_teams_per_leader=1)
    await teams.activities.open_team("a", "L", team_id="t1")
    with pytest.raises(errors.UserLimitReached) as refused:
        await teams.activities.open_team("a", "L", team_id="t2")
    assert refused.value.extra["limit_name"] == "open_teams_per_leader"
    repeat = await teams.activities.open_team("a", "L", team_id="t1")  # a repeat is not a new team
    assert not repeat.created
    await _join(services, "a", "t1", "m")  # t1 forms: it is no longer open
    assert (await teams.activities.open_team("a", "L", team_id="t2")).created


@pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])
async def test_concurrent_confirms_by_one_user_never_pass_the_limit(services: Services) -> None:
    """One shopper (3 teams at most, already in 2) locks and pays in 20 teams at once, five
    times over: they end in exactly 3 teams, and the counter says 3."""
    teams = services.teams
    await teams.activities.create_activity("r", team_size=3, teams_per_user=3)
    for t in range(2):
        await teams.activities.open_team("r", f"L{t}", team_id=f"had{t}")
        await _join(services, "r", f"had{t}", "u")
    for t in range(20):
        await teams.activities.open_team("r", f"L-t{t}", team_id=f"t{t}")

    async def lock_and_pay(tid: str) -> str:
        try:
            await _join(services, "r", tid, "u")
        except errors.GroupBuyError as refused:
            return refused.code
        return "joined"

    for _ in range(5):
        answers = await asyncio.gather(*(lock_and_pay(f"t{t}") for t in range(20)))
        assert answers.count("joined") <= 1
    member_of = [
        t
        for t in range(20)
        if "u" in [m["user_id"] for m in (await teams.activities.get_team("r", f"t{t}"))["members"]]
    ]
    assert len(member_of) == 1
    counter = await services.redis.get(services.keys.user_counter("r", "u", "teams"))
    assert counter == "3"


def test_limits_are_validated(client: TestClient) -> None:
    def create(aid: str, **body: Any) -> Any:
        return client.post("/v1/activities", json={"activity_id": aid, **body}, headers=ADMIN)

    for bad in (
        {"teams_per_user": 0},
        {"teams_per_user": 1001},
        {"open_teams_per_leader": "2"},
        {"teams_per_user": 2, "other": 1},
        [2],
    ):
        assert_problem(create("a", limits=bad), 422)
    ok = create("a", limits={"teams_per_user": 2})
    assert ok.status_code == 201
    assert ok.json()["limits"] == {"teams_per_user": 2, "open_teams_per_leader": None}
    assert create("a", limits={"teams_per_user": 2}).status_code == 200
    assert_problem(create("a", limits={"teams_per_user": 3}), 409)
    assert create("b").json()["limits"] is None
    # Over the limit over HTTP: 409 with the numbers.
    opened = client.post("/v1/activities/a/teams", json={"leader_id": "u"}, headers=SERVICE)
    assert opened.status_code == 201
    team = client.post("/v1/activities/a/teams", json={"leader_id": "x"}, headers=SERVICE).json()
    lock = f"/v1/activities/a/teams/{team['team_id']}/locks"
    assert client.post(lock, json={"user_id": "u"}, headers=SERVICE).status_code == 201
    paid = client.post(
        f"/v1/activities/a/teams/{team['team_id']}/members",
        json={"user_id": "u", "order_id": "o1"},
        headers=SERVICE,
    )
    assert paid.status_code == 201
    third = client.post("/v1/activities/a/teams", json={"leader_id": "y"}, headers=SERVICE).json()
    over = client.post(
        f"/v1/activities/a/teams/{third['team_id']}/locks", json={"user_id": "u"}, headers=SERVICE
    )
    body = assert_problem(over, 409, "user_limit_reached")
    assert (body["limit"], body["current"], body["limit_name"]) == (2, 2, "teams_per_user")
