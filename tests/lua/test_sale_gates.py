"""The sale's gates inside team_open, team_lock and team_join (SPEC §3 Activities): the
schedule on Redis's clock and the stock, each refused before any write, on fakeredis and a
real redis-server."""

from __future__ import annotations

from typing import Any

import pytest

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.scripts import TeamReply
from tests.support.team_scripts import AID, TTL_MS, Harness


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    harness = Harness(redis_client)
    await harness.scripts.load()
    await harness.redis.hset(
        harness.keys.activity(AID),
        mapping={"team_size": 3, "lock_ttl_ms": TTL_MS, "team_deadline_ms": 60_000},
    )
    return harness


def shaped(reply: TeamReply, code: TeamCode) -> TeamReply:
    """The reply, checked to carry this code (and so the fields read after)."""
    assert reply.code is code, reply
    return reply


async def state(harness: Harness) -> dict[str, Any]:
    """Every key Redis holds and its value: what a refusal must leave as it was."""
    redis = harness.redis
    out: dict[str, Any] = {}
    for key in await redis.keys("*"):
        kind = await redis.type(key)
        if kind == "hash":
            out[key] = await redis.hgetall(key)
        elif kind == "zset":
            out[key] = await redis.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            out[key] = await redis.xrange(key)
        else:
            out[key] = await redis.get(key)
    return out


async def sale(harness: Harness, **fields: int | str) -> None:
    await harness.redis.hset(harness.keys.activity(AID), mapping=fields)


async def now_ms(harness: Harness) -> int:
    return await harness.clock.now_ms(harness.redis)


async def test_before_the_start_and_from_the_end_nothing_is_taken(h: Harness) -> None:
    await h.open("t1", "L")
    assert (await h.lock("t1", "u1")).code is TeamCode.OK  # a lock taken before the schedule
    now = await now_ms(h)
    await sale(h, starts_ms=now + 20_000, ends_ms=now + 40_000)
    before = await state(h)
    for refused in (await h.open("t2", "M"), await h.lock("t1", "u2"), await h.join("u3")):
        assert shaped(refused, TeamCode.ACTIVITY_NOT_STARTED).starts_ms == now + 20_000
    # The close comes first; the schedule before any other refusal (a repeat open too).
    assert (await h.open("t1", "L")).code is TeamCode.ACTIVITY_NOT_STARTED
    assert await state(h) == before
    # A live lock is still confirmed: the schedule does not stop a payment.
    assert (await h.confirm("t1", "u1", "o1")).code is TeamCode.OK

    h.shift_ms = 20_000
    assert (await h.lock("t1", "u2")).code is TeamCode.OK
    assert (await h.open("t2", "M")).code is TeamCode.OK
    h.shift_ms = 40_000
    before = await state(h)
    for refused in (await h.open("t3", "N"), await h.lock("t2", "u4"), await h.join("u5")):
        assert refused.code is TeamCode.ACTIVITY_ENDED, refused
    assert await state(h) == before
    await sale(h, status="closed")
    assert (await h.lock("t2", "u4")).code is TeamCode.ACTIVITY_CLOSED  # closed wins


async def test_stock_counts_members_and_live_locks_and_comes_back(h: Harness) -> None:
    await h.redis.hset(h.keys.activity(AID), "team_size", 5)
    await sale(h, stock=3)
    await h.open("t1", "L1")
    await h.open("t2", "L2")
    first = shaped(await h.lock("t1", "u1"), TeamCode.OK)  # 3 units held: 2 members, 1 lock
    before = await state(h)
    expiry = first.expires_at_ms
    for refused in (await h.lock("t1", "u2"), await h.join("u2"), await h.open("t3", "L3")):
        assert shaped(refused, TeamCode.ACTIVITY_SOLD_OUT).next_unlock_ms == expiry
    assert await state(h) == before
    # The user's own live lock is not counted: a re-lock answers it, a join too, and a switch
    # moves it (released in t1, taken in t2).
    assert (await h.lock("t1", "u1")).code is TeamCode.EXISTING
    assert (await h.join("u1")).code is TeamCode.EXISTING
    assert (await h.lock("t2", "u1")).code is TeamCode.SWITCH_NEEDED
    switched = shaped(await h.lock("t2", "u1", other="t1"), TeamCode.OK)
    assert switched.released_team_id == "t1"
    assert (await h.lock("t1", "u2")).code is TeamCode.ACTIVITY_SOLD_OUT
    # A repeat open answers its team: its leader holds a unit already.
    assert (await h.open("t1", "L1")).code is TeamCode.EXISTING
    # A confirm of a live lock takes no new unit: it is never refused for stock.
    assert (await h.confirm("t2", "u1", "o1")).code is TeamCode.OK
    assert (await h.lock("t1", "u2")).code is TeamCode.ACTIVITY_SOLD_OUT
    full = shaped(await h.join("u2"), TeamCode.ACTIVITY_SOLD_OUT)
    assert full.next_unlock_ms is None  # every unit is a member's

    # Raising the stock frees a unit; an unlock or an expiry gives a unit back.
    await sale(h, stock=4)
    assert (await h.lock("t1", "u2")).code is TeamCode.OK
    assert (await h.lock("t1", "u3")).code is TeamCode.ACTIVITY_SOLD_OUT
    assert (await h.unlock("t1", "u2")).code is TeamCode.OK
    assert (await h.lock("t1", "u3")).code is TeamCode.OK
    assert (await h.join("u4")).code is TeamCode.ACTIVITY_SOLD_OUT
    h.shift_ms = TTL_MS  # u3's lock expired (not swept yet): its unit is free
    assert shaped(await h.join("u4"), TeamCode.OK).team_id in ("t1", "t2")


async def test_no_stock_and_a_zero_stock_cap_nothing(h: Harness) -> None:
    await h.open("t1", "L1")
    await sale(h, stock=0)
    assert (await h.lock("t1", "u1")).code is TeamCode.OK
    assert (await h.open("t2", "L2")).code is TeamCode.OK
