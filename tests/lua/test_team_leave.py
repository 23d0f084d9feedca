"""team_leave and team_dissolve through their wrappers, on fakeredis and a real
redis-server: each branch, what it frees (seat, stock unit, per-user counts), what it
records, and the refusals, which change nothing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.scripts import TeamReply
from groupbuy.locks.view import TeamView
from groupbuy.storage.specs import Reply
from tests.support.team_scripts import AID, DEADLINE_MS, TTL_MS, Harness


def shaped(reply: TeamReply, *codes: TeamCode) -> TeamReply:
    assert reply.code in codes, reply
    return reply


def team_of(reply: TeamReply, tid: str) -> TeamView:
    return TeamView.from_snapshot(AID, tid, shaped(reply, *DONE).team)


DONE = (TeamCode.OK, TeamCode.EXISTING)


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    harness = Harness(redis_client)
    await harness.scripts.load()
    await harness.activity()
    return harness


async def counts(h: Harness) -> Counter[str]:
    raw = await h.redis.hgetall(h.keys.activity_counts(AID))
    return Counter({name: int(value) for name, value in raw.items()})


async def counter(h: Harness, user: str, what: str) -> int:
    return int(await h.redis.get(h.keys.user_counter(AID, user, what)) or 0)


async def limited(h: Harness) -> None:
    """The activity limits teams per user and open teams per leader (so both count)."""
    await h.redis.hset(h.keys.activity(AID), mapping={"teams_per_user": 5, "open_per_leader": 5})


async def member_of(h: Harness, tid: str, user: str, order: str) -> None:
    assert (await h.lock(tid, user)).code is TeamCode.OK
    assert (await h.confirm(tid, user, order)).code is TeamCode.OK


def left(reply: Any) -> tuple[TeamCode, str]:
    return reply.code, shaped(reply, *DONE).kind


async def test_a_member_leaves_an_open_team_and_frees_the_seat_at_once(h: Harness) -> None:
    await limited(h)
    await h.open("t1", "L", "oL")
    await member_of(h, "t1", "u1", "o1")
    before = await counts(h)
    assert await counter(h, "u1", "teams") == 1

    reply = await h.leave("t1", "u1", "o1", "refund")
    assert left(reply) == (TeamCode.OK, "left")
    team = team_of(reply, "t1")
    assert [user for user, _order, _at in team.members] == ["L"] and team.status == "open"
    assert (await counts(h))["members"] == before["members"] - 1  # the stock unit is back
    assert await counter(h, "u1", "teams") == 0  # the per-user limit gives the count back
    record = (await h.records())[-1]
    assert record == {
        "type": "team.member_left",
        "at_ms": record["at_ms"],
        "activity_id": AID,
        "team_id": "t1",
        "user_id": "u1",
        "order_id": "o1",
        "reason": "refund",
        "version": str(team.version),
    }
    # The seat is free at once: two others lock it and the one after them finds it full.
    assert (await h.lock("t1", "u2")).code is TeamCode.OK
    assert (await h.lock("t1", "u3")).code is TeamCode.OK
    assert (await h.lock("t1", "u4")).code is TeamCode.TEAM_FULL
    # A new member's seq follows the leaver's (SQL keeps the leaver's row and its seq).
    assert (await h.confirm("t1", "u2", "o2")).code is TeamCode.OK
    assert (await h.records())[-1]["seq"] == "3"


async def test_a_repeat_answers_the_same_and_a_refused_leave_changes_nothing(
    h: Harness,
) -> None:
    await h.open("t1", "L", "oL")
    await member_of(h, "t1", "u1", "o1")
    assert (await h.leave("t1", "u1", "o9")).code is TeamCode.ORDER_MISMATCH
    assert (await h.leave("t1", "u1")).code is TeamCode.ORDER_MISMATCH  # joined with one
    assert (await h.leave("t1", "x")).code is TeamCode.NOT_A_MEMBER
    assert (await h.leave("gone", "u1", "o1")).code is TeamCode.TEAM_NOT_FOUND
    assert await h.record_types() == ["team.opened", "team.member_joined"]  # nothing changed

    first = await h.leave("t1", "u1", "o1")
    version = team_of(first, "t1").version
    again = await h.leave("t1", "u1", "o1")
    assert left(again) == (TeamCode.EXISTING, "left")
    assert team_of(again, "t1").version == version  # nothing applied twice
    assert (await h.leave("t1", "u1", "o2")).code is TeamCode.ORDER_MISMATCH
    assert (await h.record_types()).count("team.member_left") == 1


async def test_the_leader_leaves_and_the_earliest_remaining_member_leads(h: Harness) -> None:
    await limited(h)
    await h.activity(4)
    await h.open("t1", "L")  # a leader without an order leaves without one
    await member_of(h, "t1", "u1", "o1")
    await member_of(h, "t1", "u2", "o2")
    assert await counter(h, "L", "led") == 1

    reply = await h.leave("t1", "L")
    assert left(reply) == (TeamCode.OK, "left")
    team = team_of(reply, "t1")
    assert team.leader_id == "u1" and [u for u, _o, _a in team.members] == ["u1", "u2"]
    assert await counter(h, "L", "led") == 0 and await counter(h, "u1", "led") == 1
    changed = (await h.records())[-1]
    assert changed["type"] == "team.leader_changed"
    assert (changed["leader_id"], changed["previous_leader_id"]) == ("u1", "L")
    assert changed["version"] == str(team.version)
    assert await h.redis.hget(h.keys.team(AID, "t1"), "leader_order_id") == "o1"


async def test_the_last_member_leaving_fails_the_team_abandoned(h: Harness) -> None:
    await limited(h)
    await h.open("t1", "L", "oL")
    await h.lock("t1", "u1")  # a live lock: dropped with the team, its user key too
    before = await counts(h)

    reply = await h.leave("t1", "L", "oL")
    assert left(reply) == (TeamCode.OK, "left")
    team = team_of(reply, "t1")
    assert team.status == "failed" and team.members == [] and team.locks == []
    failed = (await h.records())[-1]
    assert (failed["type"], failed["reason"], failed["members"]) == ("team.failed", "abandoned", "")
    after = await counts(h)
    assert after["teams_open"] == before["teams_open"] - 1
    assert after["teams_failed"] == before["teams_failed"] + 1
    assert after["members"] == before["members"] - 1
    assert await counter(h, "L", "led") == 0 and await counter(h, "L", "teams") == 0
    assert not await h.redis.exists(h.keys.user_lock(AID, "u1"))
    assert (await h.user_lock("u1")).code is TeamCode.NO_LOCK
    assert not await h.redis.zcard(h.keys.lock_expiries(AID))
    # The leaver's repeat still answers the same; another member's leave: the team failed.
    assert left(await h.leave("t1", "L", "oL")) == (TeamCode.EXISTING, "left")
    assert (await h.confirm("t1", "u1", "o1")).code is TeamCode.TEAM_FAILED


async def test_a_member_of_a_formed_team_is_refunded_and_stays_listed(h: Harness) -> None:
    await limited(h)
    await h.open("t1", "L", "oL")
    await member_of(h, "t1", "u1", "o1")
    await member_of(h, "t1", "u2", "o2")  # formed
    before = await counts(h)

    reply = await h.leave("t1", "u1", "o1", "cancel")
    assert left(reply) == (TeamCode.OK, "refunded")
    team = team_of(reply, "t1")
    assert team.status == "formed" and [u for u, _o, _a in team.members] == ["L", "u1", "u2"]
    assert set(team.refunded) == {"u1"}
    assert team.body()["members"][1]["refunded_at"]
    assert "refunded_at" not in team.body()["members"][0]
    assert (await counts(h))["members"] == before["members"] - 1
    assert (await counts(h))["teams_formed"] == before["teams_formed"]
    assert await counter(h, "u1", "teams") == 0
    record = (await h.records())[-1]
    assert (record["type"], record["reason"]) == ("team.member_refunded", "cancel")
    assert left(await h.leave("t1", "u1", "o1")) == (TeamCode.EXISTING, "refunded")
    assert (await h.record_types()).count("team.member_refunded") == 1
    assert (await counts(h))["members"] == before["members"] - 1  # not given back twice


async def test_a_failed_team_refuses_a_leave(h: Harness) -> None:
    await h.open("t1", "L", "oL")
    h.shift_ms += DEADLINE_MS
    assert (await h.leave("t1", "L", "oL")).code is TeamCode.TEAM_FAILED
    failed = [r for r in await h.records() if r["type"] == "team.failed"]
    assert [r["reason"] for r in failed] == ["deadline"]
    assert await h.redis.hget(h.keys.team(AID, "t1"), "failed_reason") == "deadline"


async def test_who_left_takes_no_seat_in_that_team_again(h: Harness) -> None:
    await h.open("t1", "L", "oL")
    await member_of(h, "t1", "u1", "o1")
    await h.leave("t1", "u1", "o1")
    assert (await h.lock("t1", "u1")).code is TeamCode.LEFT_TEAM
    # A join passes over that team: it has no other open team with a seat for the user.
    assert (await h.join("u1")).code is TeamCode.NO_TEAM_AVAILABLE
    await h.open("t2", "L2")
    assert shaped(await h.join("u1"), TeamCode.OK).team_id == "t2"
    # A confirm refuses too (a lock put there by hand: the path a late confirm takes).
    await h.redis.zadd(h.keys.team_locks(AID, "t1"), {"u1": (await h.redis.time())[0] * 1000})
    assert (await h.confirm("t1", "u1", "o1b")).code is TeamCode.LEFT_TEAM
    # Anyone else still takes the seat.
    assert (await h.lock("t1", "u5")).code is TeamCode.OK


async def test_dissolve_fails_an_open_team_now_once(h: Harness) -> None:
    await limited(h)
    await h.open("t1", "L", "oL")
    await member_of(h, "t1", "u1", "o1")
    await h.lock("t1", "u2")
    before = await counts(h)

    reply = await h.dissolve("t1")
    assert reply.code is TeamCode.OK
    team = team_of(reply, "t1")
    assert team.status == "failed" and team.locks == [] and team.failed_ms is not None
    failed = (await h.records())[-1]
    assert (failed["type"], failed["reason"]) == ("team.failed", "dissolved")
    assert failed["members"] == "L|oL,u1|o1"  # the refund list
    after = await counts(h)
    assert after["members"] == before["members"] - 2
    assert after["teams_failed"] == before["teams_failed"] + 1
    assert await counter(h, "u1", "teams") == 0 and await counter(h, "L", "led") == 0
    assert (await h.user_lock("u2")).code is TeamCode.NO_LOCK

    again = await h.dissolve("t1")
    assert again.code is TeamCode.EXISTING
    assert team_of(again, "t1").version == team.version
    assert (await h.record_types()).count("team.failed") == 1
    assert await counts(h) == after


async def test_dissolve_refuses_a_formed_team_and_one_failed_otherwise(h: Harness) -> None:
    await h.activity(2)
    await h.open("t1", "L", "oL")
    await member_of(h, "t1", "u1", "o1")  # formed
    assert (await h.dissolve("t1")).code is TeamCode.TEAM_FORMED
    await h.open("t2", "L2")
    h.shift_ms += DEADLINE_MS
    assert (await h.dissolve("t2")).code is TeamCode.TEAM_FAILED  # its deadline passed
    assert (await h.dissolve("gone")).code is TeamCode.TEAM_NOT_FOUND


async def test_restore_brings_back_who_left_as_left(h: Harness) -> None:
    now = int((await h.redis.time())[0]) * 1000
    restored = await h.restore(
        "t1",
        ["u1", f"2|{now}|o1"],  # the leader (seq 1) left; u1 leads now
        leader_id="u1",
        leader_order_id="o1",
        size=3,
        lock_ttl_ms=TTL_MS,
        created_ms=now,
        deadline_ms=now + DEADLINE_MS,
        retention_ms=3_600_000,
        version=5,
        virtual_min=0,
        teams_limit=0,
        led_limit=0,
        departed=1,
        left_members=f"L|{now}|oL",
    )
    assert restored == Reply(TeamCode.OK)
    assert left(await h.leave("t1", "L", "oL")) == (TeamCode.EXISTING, "left")
    assert (await h.lock("t1", "L")).code is TeamCode.LEFT_TEAM
    await member_of(h, "t1", "u2", "o2")
    assert (await h.records())[-1]["seq"] == "3"  # after every recorded seq
