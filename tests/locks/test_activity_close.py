"""Closing an activity: decided inside the scripts, atomic with the locks (a real race on a
real redis-server), and kept through a loss of Redis data and a stale copy."""

from __future__ import annotations

import asyncio
import random

import pytest

from groupbuy import errors
from groupbuy.locks.activity_copy import ActivityCopy
from groupbuy.services import Services
from groupbuy.storage.backends import Backends
from tests.support.backends import REAL
from tests.support.http import ms

TEAMS = 20
WORKERS = 120


async def _closed_everywhere(services: Services, aid: str) -> None:
    """Opening, locking and joining are all refused as closed."""
    activities, seats = services.teams.activities, services.teams.seats
    with pytest.raises(errors.ActivityClosed):
        await activities.open_team(aid, "L9")
    with pytest.raises(errors.ActivityClosed):
        await seats.lock(aid, "t1", "u9")
    with pytest.raises(errors.ActivityClosed):
        await seats.join(aid, "u9")


@pytest.mark.parametrize("backend", [REAL])
async def test_no_lock_is_taken_after_the_close_answered(services: Services) -> None:
    activities, seats = services.teams.activities, services.teams.seats
    await activities.create_activity("race", team_size=50)
    for t in range(TEAMS):
        await activities.open_team("race", f"L{t}", team_id=f"t{t}")
    locked: list[tuple[str, int]] = []  # (team, locked_at_ms) of every new lock
    after_close: list[str] = []  # what the calls begun after the close answered got
    closed_answered = asyncio.Event()
    enough = asyncio.Event()
    rng = random.Random(7)

    async def worker(w: int) -> None:
        for n in range(10_000):
            began_after = closed_answered.is_set()
            user = f"w{w}n{n}"
            try:
                if rng.random() < 0.5:
                    outcome = await seats.join("race", user)
                else:
                    outcome = await seats.lock("race", f"t{rng.randrange(TEAMS)}", user)
            except errors.ActivityClosed:
                # Refused while the close was on its way: call once more after it answered.
                if began_after:
                    after_close.append("activity_closed")
                    return
                await closed_answered.wait()
                continue
            except (errors.TeamFull, errors.NoTeamAvailable):
                continue
            body = outcome.body
            locked.append((body["team_id"], ms(body["locked_at"])))
            if began_after:
                after_close.append("locked")
            if len(locked) >= 100:
                enough.set()

    tasks = [asyncio.create_task(worker(w)) for w in range(WORKERS)]
    await enough.wait()
    closed = await activities.update_activity("race", close=True)
    closed_answered.set()
    answered_ms = await services.clock.now_ms(services.redis)
    await asyncio.gather(*tasks)

    assert closed.created and closed.body["status"] == "closed"
    assert locked and after_close and set(after_close) == {"activity_closed"}
    late = [(team, at) for team, at in locked if at > answered_ms]
    assert late == [], f"locks taken after the close answered at {answered_ms}"
    # What Redis holds agrees: no seat lock newer than the close.
    for t in range(TEAMS):
        team = await activities.get_team("race", f"t{t}")
        assert all(ms(held["locked_at"]) <= answered_ms for held in team["locks"])
    await _closed_everywhere(services, "race")


async def test_a_closed_activity_stays_closed_after_redis_loses_everything(
    services: Services,
) -> None:
    activities = services.teams.activities
    await activities.create_activity("lost", team_size=3)
    await activities.open_team("lost", "L1", team_id="t1")
    await services.teams.seats.lock("lost", "t1", "u1")
    await activities.update_activity("lost", close=True)
    await services.redis.flushall()

    await _closed_everywhere(services, "lost")
    assert (await activities.get_activity("lost"))["status"] == "closed"
    # The copy put back from SQL carries the status; the team is rebuilt, locks are not.
    assert await services.redis.hget(services.keys.activity("lost"), "status") == "closed"


async def test_a_stale_copy_put_after_the_close_does_not_reopen(services: Services) -> None:
    activities = services.teams.activities
    await activities.create_activity("stale", team_size=3)
    await activities.open_team("stale", "L1", team_id="t1")
    copies = ActivityCopy(
        Backends(
            services.redis, services.scripts, services.database, services.keys, services.clock
        ),
        services.teams.counts,
    )
    before_close = await copies.row("stale")  # a recovery read SQL while still open ...
    await activities.update_activity("stale", close=True)
    await copies.put(before_close)  # ... and puts its copy after the close answered
    await _closed_everywhere(services, "stale")


async def test_close_is_idempotent_and_unknown_is_not_found(services: Services) -> None:
    activities = services.teams.activities
    await activities.create_activity("idem")
    first = await activities.update_activity("idem", close=True)
    again = await activities.update_activity("idem", close=True)
    assert first.created and not again.created and first.body == again.body
    with pytest.raises(errors.ActivityNotFound):
        await activities.update_activity("nope", close=True)
