"""Virtual completion (模拟成团): at the deadline a team with at least min_members real
members is formed, its missing seats counted as virtual seats — by whichever path notices
first (a team script's lazy check, the expire_teams job), exactly once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from groupbuy import errors
from groupbuy.services import Services
from groupbuy.storage.events import EventRow
from tests.support.http import ADMIN, assert_problem

DEADLINE_S = 60


async def _formed_events(services: Services) -> list[dict[str, Any]]:
    await services.team_writer.drain_all()
    async with services.database.sessions() as session:
        rows = await session.scalars(select(EventRow).where(EventRow.type == "team.formed"))
        return [json.loads(row.data) for row in rows]


async def _activity_with_teams(services: Services) -> None:
    """Teams of 4 that form virtually with 2 members: t2 has 2, t3 has 3, t1 only its leader."""
    teams = services.teams
    created = await teams.activities.create_activity(
        "v", team_size=4, team_deadline_s=DEADLINE_S, virtual_min_members=2
    )
    assert created.body["virtual_completion"] == {"min_members": 2}
    for tid, joiners in (("t1", 0), ("t2", 1), ("t3", 2)):
        await teams.activities.open_team("v", f"L-{tid}", team_id=tid)
        for i in range(joiners):
            await teams.seats.lock("v", tid, f"{tid}-m{i}")
            await teams.seats.confirm("v", tid, f"{tid}-m{i}", f"o-{tid}-{i}")
    await teams.seats.lock("v", "t2", "holder")  # a live lock at the deadline ends with the team


async def test_a_lazy_check_forms_a_team_with_enough_members(services: Services) -> None:
    teams = services.teams
    await _activity_with_teams(services)
    opened = await teams.activities.get_team("v", "t2")
    services.clock.advance(DEADLINE_S)

    t2 = await teams.activities.get_team("v", "t2")
    assert (t2["status"], t2["virtual_seats"], t2["locks"]) == ("formed", 2, [])
    assert t2["formed_at"] == opened["deadline_at"] and t2["free_seats"] == 0
    assert (await teams.activities.get_team("v", "t3"))["virtual_seats"] == 1
    assert (await teams.activities.get_team("v", "t1"))["status"] == "failed"  # below min_members
    with pytest.raises(errors.TeamFormed):
        await teams.seats.lock("v", "t2", "late")
    formed = {e["team_id"]: e for e in await _formed_events(services)}
    assert {t: e["virtual_seats"] for t, e in formed.items()} == {"t2": 2, "t3": 1}
    assert [m["user_id"] for m in formed["t2"]["members"]] == ["L-t2", "t2-m0"]
    report = await services.reconciler.run()
    assert report["mismatch_count"] == 0, report["mismatches"]
    # Redis lets the ended teams go: SQL answers the same virtual seats.
    await services.jobs.run("repair")
    assert (await teams.activities.get_team("v", "t2"))["virtual_seats"] == 2


async def test_the_job_forms_them_and_two_schedulers_do_it_once(services: Services) -> None:
    await _activity_with_teams(services)
    services.clock.advance(DEADLINE_S)
    reports = await asyncio.gather(*(services.teams.sweeps.expire_due(50) for _ in range(2)))
    assert sum(r["teams_formed_virtually"] for r in reports) == 2
    assert sum(r["teams_failed"] for r in reports) == 1
    events = await _formed_events(services)
    assert sorted((e["team_id"], e["virtual_seats"]) for e in events) == [("t2", 2), ("t3", 1)]
    again = await services.teams.sweeps.expire_due(50)
    assert again["teams_formed_virtually"] == 0 and again["teams_failed"] == 0


def test_virtual_completion_is_validated(client: TestClient) -> None:
    def create(aid: str, **body: Any) -> Any:
        return client.post("/v1/activities", json={"activity_id": aid, **body}, headers=ADMIN)

    for bad in ({"min_members": 1}, {"min_members": 4}, {"min_members": "2"}, {}, 2):
        assert_problem(create("a", team_size=3, virtual_completion=bad), 422)
    assert_problem(create("d", virtual_completion={"min_members": 9}), 422)  # default size 3
    ok = client.post(
        "/v1/activities",
        json={"activity_id": "ok", "team_size": 3, "virtual_completion": {"min_members": 3}},
        headers=ADMIN,
    )
    assert ok.status_code == 201 and ok.json()["virtual_completion"] == {"min_members": 3}
    assert create("ok", team_size=3, virtual_completion={"min_members": 3}).status_code == 200
    assert_problem(create("ok", team_size=3, virtual_completion={"min_members": 2}), 409)
    assert_problem(create("ok", team_size=3), 409)
    plain = create("plain", team_size=3)
    assert plain.status_code == 201 and plain.json()["virtual_completion"] is None
