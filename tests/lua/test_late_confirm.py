"""Late confirm inside team_confirm (SPEC §3 Teams): on an activity with late_confirm, a
confirm without a live lock joins while the team has a free seat, the stock a unit and the
user room under the limits; else lock_required with nothing written. On fakeredis and a real
redis-server."""

from __future__ import annotations

from typing import Any

import pytest

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.unlock import team_unlock
from tests.support.team_scripts import AID, TTL_MS
from tests.support.team_scripts import Harness as TeamHarness


class Harness(TeamHarness):
    """The shared harness, with the activity's sale fields and a view of every key."""

    async def sale(self, **fields: int | str) -> None:
        await self.redis.hset(self.keys.activity(AID), mapping=fields)

    async def members(self) -> int:
        return int(await self.redis.hget(self.keys.activity_keys(AID).counts, "members") or 0)

    async def state(self) -> dict[str, Any]:
        """Every key Redis holds and its value: what a refusal must leave as it was."""
        out: dict[str, Any] = {}
        for key in await self.redis.keys("*"):
            kind = await self.redis.type(key)
            if kind == "hash":
                out[key] = await self.redis.hgetall(key)
            elif kind == "zset":
                out[key] = await self.redis.zrange(key, 0, -1, withscores=True)
            elif kind == "stream":
                out[key] = await self.redis.xrange(key)
            else:
                out[key] = await self.redis.get(key)
        return out


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    harness = Harness(redis_client)
    await harness.scripts.load()
    await harness.sale(team_size=3, lock_ttl_ms=TTL_MS, team_deadline_ms=60_000, late_confirm=1)
    return harness


async def refused_unchanged(h: Harness, tid: str, user: str) -> None:
    """A late confirm that must answer lock_required and write nothing."""
    before = await h.state()
    assert (await h.confirm(tid, user, "o-" + user)).code is TeamCode.LOCK_REQUIRED
    assert await h.state() == before


async def test_an_expired_lock_and_no_lock_join_late_until_the_team_forms(h: Harness) -> None:
    await h.open("t1", "L")
    assert (await h.lock("t1", "u1")).code is TeamCode.OK
    h.clock.shift_ms = TTL_MS + 1  # u1's lock has expired
    late = await h.confirm("t1", "u1", "o1")
    assert late.code is TeamCode.OK and late.late and not late.formed
    assert await h.members() == 2
    # One seat left: a confirm that never locked takes it and forms the team.
    last = await h.confirm("t1", "u2", "o2")
    assert last.code is TeamCode.OK and last.late and last.formed
    assert await h.members() == 3
    # A repeat answers as before; a live lock's confirm is not late.
    assert (await h.confirm("t1", "u1", "o1")).code is TeamCode.EXISTING
    await h.open("t2", "M")
    assert (await h.lock("t2", "u3")).code is TeamCode.OK
    on_time = await h.confirm("t2", "u3", "o3")
    assert on_time.code is TeamCode.OK and not on_time.late


async def test_without_late_confirm_no_lock_is_lock_required(h: Harness) -> None:
    await h.sale(late_confirm=0)
    await h.open("t1", "L")
    await refused_unchanged(h, "t1", "u1")
    await h.redis.hdel(h.keys.activity(AID), "late_confirm")
    await refused_unchanged(h, "t1", "u1")


async def test_a_team_without_a_free_seat_takes_no_late_confirm(h: Harness) -> None:
    await h.open("t1", "L")
    assert (await h.lock("t1", "u1")).code is TeamCode.OK
    assert (await h.lock("t1", "u2")).code is TeamCode.OK  # members + live locks == size
    await refused_unchanged(h, "t1", "u3")
    # A seat freed by an unlock is taken late.
    assert (await team_unlock(h.teams, AID, "t1", "u2")).code is TeamCode.OK
    assert (await h.confirm("t1", "u3", "o3")).late


async def test_no_unit_of_the_stock_left_takes_no_late_confirm(h: Harness) -> None:
    await h.sale(stock=3)
    await h.open("t1", "L")
    await h.open("t2", "M")
    assert (await h.lock("t2", "u1")).code is TeamCode.OK  # 2 members + 1 live lock
    await refused_unchanged(h, "t1", "u2")
    await h.sale(stock=4)
    assert (await h.confirm("t1", "u2", "o2")).late
    assert await h.members() == 3


async def test_a_user_at_the_limit_takes_no_late_confirm(h: Harness) -> None:
    await h.sale(teams_per_user=1)
    await h.open("t1", "L")
    await h.open("t2", "u1")  # u1 belongs to a team already
    await refused_unchanged(h, "t1", "u1")
    assert (await h.confirm("t1", "u2", "o2")).late


async def test_a_blocked_user_or_a_failed_team_is_refused_as_before(h: Harness) -> None:
    await h.open("t1", "L")
    await h.redis.hset(h.keys.activity_blocklist(AID), "u1", "1")
    assert (await h.confirm("t1", "u1", "o1")).code is TeamCode.USER_BLOCKED
    h.clock.shift_ms = 60_001  # past the team's deadline: it fails, nobody joins
    assert (await h.confirm("t1", "u2", "o2")).code is TeamCode.TEAM_FAILED
    assert await h.members() == 0
