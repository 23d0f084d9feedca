"""team_extend through its wrapper, on fakeredis and a real redis-server: the extended lock's
expiry in every index ("Extended locks" in lua/_team_lib.lua), and what leaves it as it is."""

from __future__ import annotations

from typing import Any

import pytest
from groupbuy_client.wire import iso_ms

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.extend import team_extend
from groupbuy.locks.scripts import TeamReply
from groupbuy.locks.view import TeamView
from groupbuy.storage.specs import Reply
from tests.support.team_scripts import AID, DEADLINE_MS, TTL_MS
from tests.support.team_scripts import Harness as TeamHarness

MAX_HOLD_MS = 3 * TTL_MS


class Harness(TeamHarness):
    """The shared harness; its activity may hold a lock MAX_HOLD_MS unless told otherwise."""

    async def activity(self, size: int = 3, **fields: int | str) -> None:
        await super().activity(size, **{"max_hold_ms": MAX_HOLD_MS, **fields})


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    harness = Harness(redis_client)
    await harness.scripts.load()
    await harness.activity()
    return harness


def shaped(reply: TeamReply, *codes: TeamCode) -> TeamReply:
    assert reply.code in codes, reply
    return reply


async def extend(h: Harness, tid: str, user: str, hold_ms: int) -> TeamReply:
    return await team_extend(h.teams, AID, tid, user, hold_ms)


async def locked(h: Harness, tid: str, user: str) -> TeamReply:
    return shaped(await h.lock(tid, user), TeamCode.OK)


def view(reply: TeamReply, tid: str = "t1") -> TeamView:
    return TeamView.from_snapshot(AID, tid, shaped(reply, TeamCode.OK).team)


async def test_an_extended_lock_expires_at_its_new_time_in_every_index(h: Harness) -> None:
    await h.open("t1")
    lock = await locked(h, "t1", "u1")
    at, new_expiry = lock.locked_at_ms, lock.locked_at_ms + 2 * TTL_MS
    done = await extend(h, "t1", "u1", 2 * TTL_MS)
    assert done == Reply(
        TeamCode.OK,
        team_id="t1",
        locked_at_ms=at,
        expires_at_ms=new_expiry,
        version=lock.version + 1,
        extended=True,
    )
    k = h.keys
    assert await h.redis.zscore(k.lock_expiries(AID), "t1|u1") == new_expiry
    assert await h.redis.zscore(k.lock_index(AID), "t1") == new_expiry
    # the due index may be early (a sweep then finds nothing and sets it right), never late
    assert await h.redis.zscore(k.due_locks(), AID) <= new_expiry
    assert await h.user_lock("u1") == Reply(
        TeamCode.OK, team_id="t1", locked_at_ms=at, expires_at_ms=new_expiry
    )
    assert await h.redis.pttl(k.user_lock(AID, "u1")) > TTL_MS
    body = view(await h.read("t1")).body()
    assert body["locks"] == [
        {"user_id": "u1", "locked_at": iso_ms(at), "expires_at": iso_ms(new_expiry)}
    ]
    assert body["next_unlock_at"] == iso_ms(new_expiry)
    # Its old expiry: no index lets it go, lazily or by a sweep.
    h.shift_ms += TTL_MS
    assert (await h.sweep("t1")).locks_expired == 0
    assert await h.user_lock("u1") == Reply(
        TeamCode.OK, team_id="t1", locked_at_ms=at, expires_at_ms=new_expiry
    )
    assert [u for u, *_ in view(await h.read("t1")).locks] == ["u1"]
    assert (await h.lock("t1", "u1")).code is TeamCode.EXISTING
    # Its new expiry: it goes, once, recorded with its true times.
    h.shift_ms += TTL_MS
    assert (await h.sweep("t1")).locks_expired == 1
    assert (await h.sweep("t1")).locks_expired == 0
    assert await h.user_lock("u1") == Reply(TeamCode.NO_LOCK)
    expired = [r for r in await h.records() if r["type"] == "lock.expired"]
    assert [(r["locked_at_ms"], r["at_ms"]) for r in expired] == [(str(at), str(new_expiry))]
    assert await h.redis.hget(k.team(AID, "t1"), "locked_at:u1") is None  # forgotten with it
    assert await h.redis.zcard(k.lock_expiries(AID)) == 0
    assert await h.redis.zscore(k.lock_index(AID), "t1") is None


async def test_a_shorter_hold_or_a_repeat_changes_nothing(h: Harness) -> None:
    await h.open("t1")
    lock = await locked(h, "t1", "u1")
    first = await extend(h, "t1", "u1", 2 * TTL_MS)
    again = await extend(h, "t1", "u1", 2 * TTL_MS)
    shorter = await extend(h, "t1", "u1", TTL_MS)
    assert again == shorter == Reply.of(TeamCode.OK, {**first.fields, "extended": False})
    assert first.version == lock.version + 1
    assert [r["type"] for r in await h.records()].count("lock.extended") == 1
    # The lock's first hold is lock_ttl: the smallest hold leaves a fresh lock as it is.
    await locked(h, "t1", "u2")
    same = await extend(h, "t1", "u2", TTL_MS)
    assert not same.extended and (await h.lock("t1", "u2")).expires_at_ms == same.expires_at_ms


async def test_holds_outside_the_bounds_and_missing_locks_are_refused_unchanged(
    h: Harness,
) -> None:
    await h.open("t1")
    lock = await locked(h, "t1", "u1")
    outside = Reply(TeamCode.INVALID_REQUEST, min_hold_ms=TTL_MS, max_hold_ms=MAX_HOLD_MS)
    assert await extend(h, "t1", "u1", TTL_MS - 1) == outside
    assert await extend(h, "t1", "u1", MAX_HOLD_MS + 1) == outside
    assert await extend(h, "t1", "u2", 2 * TTL_MS) == Reply(TeamCode.LOCK_REQUIRED)
    assert await extend(h, "nope", "u1", 2 * TTL_MS) == Reply(TeamCode.TEAM_NOT_FOUND)
    assert view(await h.read("t1")).version == lock.version
    assert [r["type"] for r in await h.records()] == ["team.opened"]
    # No max_hold_s on the activity: lock_ttl_s is the only hold.
    await h.redis.hdel(h.keys.activity(AID), "max_hold_ms")
    only = Reply(TeamCode.INVALID_REQUEST, min_hold_ms=TTL_MS, max_hold_ms=TTL_MS)
    assert await extend(h, "t1", "u1", TTL_MS + 1) == only
    assert (await extend(h, "t1", "u1", TTL_MS)).extended is False
    await h.redis.delete(h.keys.activity(AID))
    assert await extend(h, "t1", "u1", TTL_MS) == Reply(TeamCode.ACTIVITY_NOT_FOUND)
    # An expired lock is no lock.
    await h.activity()
    h.shift_ms += TTL_MS
    assert await extend(h, "t1", "u1", TTL_MS) == Reply(TeamCode.LOCK_REQUIRED)


async def test_an_extension_stops_at_the_teams_deadline(h: Harness) -> None:
    await h.activity(max_hold_ms=2 * DEADLINE_MS)
    await h.open("t1")
    deadline = int(await h.redis.hget(h.keys.team(AID, "t1"), "deadline_ms"))
    h.shift_ms += DEADLINE_MS - 2 * TTL_MS  # the lock expires a lock_ttl before the deadline
    lock = await locked(h, "t1", "u1")
    done = await extend(h, "t1", "u1", 2 * DEADLINE_MS)
    assert done.expires_at_ms == deadline and done.locked_at_ms == lock.locked_at_ms
    assert await h.redis.zscore(h.keys.lock_expiries(AID), "t1|u1") == deadline


async def test_team_full_and_a_join_see_the_new_expiry(h: Harness) -> None:
    await h.activity(size=2)
    await h.open("t1")
    lock = await locked(h, "t1", "u1")
    expiry = (await extend(h, "t1", "u1", 2 * TTL_MS)).expires_at_ms
    h.shift_ms += TTL_MS  # the old expiry: still held
    full = await h.lock("t1", "u2")
    assert full == Reply(
        TeamCode.TEAM_FULL, earliest_locked_at_ms=lock.locked_at_ms, next_unlock_ms=expiry
    )
    assert await h.join("u2") == Reply(TeamCode.NO_TEAM_AVAILABLE, next_unlock_ms=expiry)
    assert view(await h.read("t1")).body()["free_seats"] == 0
    h.shift_ms += TTL_MS  # the new expiry: the seat is free, to a lock or a join
    joined = shaped(await h.join("u2"), TeamCode.OK)
    assert joined.team_id == "t1"


async def test_a_lock_taken_after_an_extended_one_is_the_first_to_expire(h: Harness) -> None:
    await h.open("t1")
    first = await locked(h, "t1", "u1")
    await extend(h, "t1", "u1", MAX_HOLD_MS)
    h.shift_ms += 5
    second = await locked(h, "t1", "u2")
    assert await h.redis.zscore(h.keys.lock_index(AID), "t1") == second.expires_at_ms
    team = view(await h.read("t1"))
    assert [user for user, *_ in team.locks] == ["u2", "u1"]  # the first to expire first
    assert team.body()["next_unlock_at"] == iso_ms(second.expires_at_ms)
    h.shift_ms += TTL_MS
    assert (await h.sweep("t1")).locks_expired == 1  # u2's only
    extended_expiry = first.locked_at_ms + MAX_HOLD_MS
    assert await h.redis.zscore(h.keys.lock_index(AID), "t1") == extended_expiry


async def test_an_extended_lock_that_ends_leaves_nothing_behind(h: Harness) -> None:
    team_hash = h.keys.team(AID, "t1")
    await h.open("t1")
    await h.open("t2")
    await locked(h, "t1", "u1")
    await extend(h, "t1", "u1", 2 * TTL_MS)
    await h.unlock("t1", "u1")
    assert await h.redis.hget(team_hash, "locked_at:u1") is None
    again = await locked(h, "t1", "u1")  # a new lock: its own time, the lock_ttl
    assert again.expires_at_ms == again.locked_at_ms + TTL_MS
    await extend(h, "t1", "u1", 2 * TTL_MS)
    assert shaped(await h.confirm("t1", "u1", "o1"), TeamCode.OK)
    assert await h.redis.hget(team_hash, "locked_at:u1") is None
    # A switch to another team releases the extended lock there, whole.
    held = await locked(h, "t1", "u2")
    await extend(h, "t1", "u2", 2 * TTL_MS)
    h.shift_ms += TTL_MS  # past the old expiry: still live, so the switch releases it
    assert (await h.lock("t2", "u2")).code is TeamCode.SWITCH_NEEDED
    switched = shaped(await h.lock("t2", "u2", other="t1"), TeamCode.OK)
    assert switched.released_team_id == "t1"
    assert await h.redis.hget(team_hash, "locked_at:u2") is None
    assert await h.redis.zscore(h.keys.lock_expiries(AID), "t1|u2") is None
    assert held.locked_at_ms < switched.locked_at_ms


async def test_the_extension_record(h: Harness) -> None:
    await h.open("t1")
    lock = await locked(h, "t1", "u1")
    done = await extend(h, "t1", "u1", 2 * TTL_MS)
    fields = (await h.records())[-1]
    assert fields == {
        "type": "lock.extended",
        "at_ms": fields["at_ms"],
        "activity_id": AID,
        "team_id": "t1",
        "user_id": "u1",
        "locked_at_ms": str(lock.locked_at_ms),
        "expires_at_ms": str(done.expires_at_ms),
        "version": str(done.version),
    }
    assert lock.locked_at_ms <= int(fields["at_ms"]) < lock.expires_at_ms


async def test_an_extension_runs_after_script_flush(h: Harness) -> None:
    await h.open("t1")
    await locked(h, "t1", "u1")
    await h.redis.script_flush()
    assert (await extend(h, "t1", "u1", 2 * TTL_MS)).extended
