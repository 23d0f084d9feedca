"""An activity's live counts (SPEC §3 Activities): kept by the scripts, put back from SQL
after Redis lost everything, and exact after many lockers and confirmers at once."""

from __future__ import annotations

import asyncio

import pytest

from groupbuy import errors
from groupbuy.services import Services
from tests.support.backends import REAL
from tests.support.counts import check_counts, counts_of


async def _member(services: Services, aid: str, tid: str, user: str) -> None:
    await services.teams.seats.lock(aid, tid, user)
    await services.teams.seats.confirm(aid, tid, user, f"o-{user}")


async def test_counts_follow_every_kind_of_change(services: Services) -> None:
    """Open, lock, confirm, form, fail and virtual completion each move the counts."""
    activities, clock = services.teams.activities, services.clock
    await activities.create_activity("c", team_size=3, team_deadline_s=60, virtual_min_members=2)
    zero = dict.fromkeys(counts_of(await activities.get_activity("c")), 0)
    assert counts_of(await activities.get_activity("c")) == zero
    await activities.open_team("c", "L1", team_id="fails")  # leader alone: fails
    await activities.open_team("c", "L2", team_id="virtual")
    await _member(services, "c", "virtual", "v1")  # 2 of 3 at the deadline: virtual
    await services.teams.seats.lock("c", "virtual", "v2")  # ends with the team
    await check_counts(services, "c", ["fails", "virtual"])
    clock.advance(61)
    # Nothing read the teams since their deadline: the counts read applies it first.
    body = await activities.get_activity("c")
    assert counts_of(body) == {
        **zero,
        "teams_formed": 1,
        "teams_failed": 1,
        "members": 2,
        "virtual_completions": 1,
    }
    await check_counts(services, "c", ["fails", "virtual"])
    await activities.open_team("c", "L3", team_id="formed")
    await _member(services, "c", "formed", "f1")
    await _member(services, "c", "formed", "f2")
    await activities.open_team("c", "L4", team_id="open")
    await services.teams.seats.lock("c", "open", "w1")
    await services.teams.seats.lock("c", "open", "w2")
    await services.teams.seats.unlock("c", "open", "w2")
    assert counts_of(await activities.get_activity("c")) == {
        "teams_open": 1,
        "teams_formed": 2,
        "teams_failed": 1,
        "members": 6,
        "live_locks": 1,
        "virtual_completions": 1,
    }
    clock.advance(301)  # w1's lock (300 s) expired, unswept: not live
    assert counts_of(await activities.get_activity("c"))["live_locks"] == 0
    await check_counts(services, "c", ["fails", "virtual", "formed", "open"])


async def test_counts_come_back_from_sql_after_redis_lost_everything(services: Services) -> None:
    """FLUSHALL: the counts are SQL's (teams by status, members); no lock outlives Redis.
    The teams put back later count on from there."""
    activities, seats, clock = services.teams.activities, services.teams.seats, services.clock
    await activities.create_activity("lost", team_size=3, team_deadline_s=60, virtual_min_members=2)
    await activities.open_team("lost", "L1", team_id="fails")
    await activities.open_team("lost", "L2", team_id="virtual")
    await _member(services, "lost", "virtual", "v1")
    clock.advance(61)
    await activities.open_team("lost", "L3", team_id="formed")
    await _member(services, "lost", "formed", "f1")
    await _member(services, "lost", "formed", "f2")
    await activities.open_team("lost", "L4", team_id="open")
    await _member(services, "lost", "open", "m1")
    await seats.lock("lost", "open", "w1")
    before = counts_of(await activities.get_activity("lost"))
    assert before == {
        "teams_open": 1,
        "teams_formed": 2,
        "teams_failed": 1,
        "members": 7,
        "live_locks": 1,
        "virtual_completions": 1,
    }
    await services.team_writer.drain_all()
    await services.redis.flushall()

    after = counts_of(await activities.get_activity("lost"))
    assert after == {**before, "live_locks": 0}
    teams = ["fails", "virtual", "formed", "open"]
    await check_counts(services, "lost", teams)
    # The open team is put back on its next call and forms: counted once, not twice.
    await _member(services, "lost", "open", "w1")
    assert counts_of(await activities.get_activity("lost")) == {
        **after,
        "teams_open": 0,
        "teams_formed": 3,
        "members": 8,
    }
    await check_counts(services, "lost", teams)


async def test_counts_put_back_after_the_release_leave_with_the_copy(services: Services) -> None:
    """SPEC §4.9. The repair releases an activity once its last team ended and SQL has every
    record; a lock of that team arriving late puts the copy back from SQL, and the counts
    with it. Those expire with the copy (a copy put again keeps them as long), until a team
    opens: then they stay until the next release, and count on exactly."""
    activities, seats, clock = services.teams.activities, services.teams.seats, services.clock
    await activities.create_activity("late", team_size=3, team_deadline_s=60)
    await activities.open_team("late", "L1", team_id="t1")
    clock.advance(61)
    assert (await services.teams.sweeps.expire_due(100))["teams_failed"] == 1
    await services.team_writer.drain_all()
    released = await services.teams.sweeps.release_ended()
    assert released == {"teams_released": 1, "activities_released": 1}
    copy, counts = services.keys.activity("late"), services.keys.activity_counts("late")
    assert not await services.redis.exists(copy, counts)

    with pytest.raises(errors.TeamFailed):
        await seats.lock("late", "t1", "u1")
    expiry = services.redis.pexpiretime  # ms since the epoch; -1: none
    assert 0 < await expiry(copy) <= await expiry(counts)
    await services.redis.pexpire(counts, 1000)  # put long ago: about to expire
    await activities.create_activity("late", team_size=3, team_deadline_s=60)  # put again
    assert await services.redis.pttl(counts) > 1000
    assert await expiry(counts) >= await expiry(copy)

    await activities.open_team("late", "L2", team_id="t2")
    assert await services.redis.pttl(counts) == -1
    assert counts_of(await activities.get_activity("late")) == {
        "teams_open": 1,
        "teams_formed": 0,
        "teams_failed": 1,
        "members": 1,
        "live_locks": 0,
        "virtual_completions": 0,
    }
    await check_counts(services, "late", ["t1", "t2"])


async def _locker(services: Services, aid: str, user: str, pay: bool) -> None:
    """Lock a seat somewhere (join any team), then pay for it or give it back."""
    seats = services.teams.seats
    try:
        locked = await seats.join(aid, user)
    except errors.GroupBuyError:
        return
    team_id = locked.body["team_id"]
    try:
        if pay:
            await seats.confirm(aid, team_id, user, f"o-{user}")
        else:
            await seats.unlock(aid, team_id, user)
    except errors.GroupBuyError:
        return


@pytest.mark.parametrize("backend", [REAL])
async def test_counts_are_exact_after_many_lockers_and_confirmers_at_once(
    services: Services, backend: str
) -> None:
    """400 users join at once, some pay and some give back, while more teams open; then 400
    more join and all pay: every seat ends paid, each team formed, counted once."""
    activities = services.teams.activities
    await activities.create_activity("storm", team_size=4)
    tids = [f"t{i}" for i in range(20)]
    for tid in tids[:10]:
        await activities.open_team("storm", f"lead-{tid}", team_id=tid)
    first = [_locker(services, "storm", f"a{i}", pay=i % 3 != 0) for i in range(400)]
    opens = [activities.open_team("storm", f"lead-{tid}", team_id=tid) for tid in tids[10:]]
    await asyncio.gather(*first, *opens)
    await check_counts(services, "storm", tids)
    await asyncio.gather(*(_locker(services, "storm", f"b{i}", pay=True) for i in range(400)))
    body = await activities.get_activity("storm")
    assert (body["teams_open"], body["teams_formed"], body["members"]) == (0, 20, 80)
    await check_counts(services, "storm", tids)
