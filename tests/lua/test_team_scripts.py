"""Each team script called through its wrapper (no service), on fakeredis and on a real
redis-server; a few calls read the raw reply, the wire shape the parsers rely on."""

from __future__ import annotations

import re
from typing import Any

import pytest

from groupbuy.locks import records as team_records
from groupbuy.locks import scripts as contracts
from groupbuy.locks.codec import SEAT_WEIGHT, PageCursor, seat_score
from groupbuy.locks.codes import TeamCode
from groupbuy.locks.extend import team_extend
from groupbuy.locks.scripts import TeamReply
from groupbuy.locks.view import TeamView
from groupbuy.storage.specs import Reply, script_names, script_source
from groupbuy.storage.typedrecords import record_keys
from tests.support.seats import indexed_open_seats
from tests.support.team_scripts import AID, DEADLINE_MS, RETENTION_MS, TTL_MS, Harness

LOCKED = (TeamCode.OK, TeamCode.EXISTING)  # a new lock (or confirm), or the same again


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    harness = Harness(redis_client)
    await harness.scripts.load()
    await harness.activity()
    return harness


def shaped(reply: TeamReply, *codes: TeamCode) -> TeamReply:
    """The reply, checked to carry one of these codes (and so the fields read after)."""
    assert reply.code in codes, reply
    return reply


def team_of(reply: TeamReply, tid: str) -> TeamView:
    """The team a reply carries."""
    return TeamView.from_snapshot(AID, tid, shaped(reply, *LOCKED).team)


def cursor_of(reply: TeamReply) -> tuple[str, str]:
    """A LOOK_FURTHER's cursor, to hand the next call."""
    further = shaped(reply, TeamCode.LOOK_FURTHER)
    return further.score, further.team_id


def teams_of(reply: TeamReply) -> list[TeamView]:
    """A team_list page's teams."""
    return [TeamView.from_snapshot(AID, *listed) for listed in shaped(reply, TeamCode.OK).page]


def next_of(reply: TeamReply) -> PageCursor | None:
    """Where the page after a team_list page starts (None after the last one)."""
    page = shaped(reply, TeamCode.OK)
    return PageCursor(int(page.cursor_score), page.cursor_team_id) if page.cursor_team_id else None


def formed(reply: TeamReply) -> tuple[TeamCode, bool]:
    """A confirm's code and whether it formed the team."""
    confirmed = shaped(reply, *LOCKED)
    return confirmed.code, confirmed.formed


def placed(reply: TeamReply) -> tuple[TeamCode, str]:
    """A lock's or join's code and the team it holds a seat in."""
    locked = shaped(reply, *LOCKED)
    return locked.code, locked.team_id


def test_every_script_has_a_contract_header() -> None:
    for name in script_names():
        source = script_source(name)
        body = source[source.index(f"-- {name}:") :]
        assert body.startswith(f"-- {name}: "), name
        # Key and argument order: the contract (docs/scripts.md), named in `local` lines.
        assert "-- KEYS and ARGV: docs/scripts.md" in body, name
        assert "-- Returns" in body, name


async def test_open_outcomes(h: Harness) -> None:
    opened = await h.open("t1", "L", "o1")
    assert opened.code is TeamCode.OK
    # the team as team_read answers it
    assert shaped(opened, *LOCKED).team == shaped(await h.read("t1"), TeamCode.OK).team
    assert (await h.open("t1", "L", "o1")).code is TeamCode.EXISTING
    assert (await h.open("t1", "L", "other")).code is TeamCode.CONFLICT
    assert (await h.open("t1", "M", "o1")).code is TeamCode.CONFLICT
    await h.redis.delete(h.keys.activity(AID))
    assert (await h.open("t2")).code is TeamCode.ACTIVITY_NOT_FOUND
    assert not await h.redis.exists(h.keys.team(AID, "t2"))
    assert await h.record_types() == ["team.opened"]
    # Every team key expires after deadline + retention.
    ttl = await h.redis.pttl(h.keys.team(AID, "t1"))
    assert DEADLINE_MS < ttl <= DEADLINE_MS + RETENTION_MS


async def test_lock_outcomes(h: Harness) -> None:
    await h.open("t1")
    assert (await h.lock("missing", "u1")).code is TeamCode.TEAM_NOT_FOUND
    first = shaped(await h.lock("t1", "u1"), *LOCKED)
    assert first.code is TeamCode.OK
    locked_at, expires_at, released = (
        first.locked_at_ms,
        first.expires_at_ms,
        first.released_team_id,
    )
    assert expires_at - locked_at == TTL_MS and released == ""
    again = shaped(await h.lock("t1", "u1"), *LOCKED)
    assert again.code is TeamCode.EXISTING and [again.locked_at_ms, again.expires_at_ms] == [
        locked_at,
        expires_at,
    ]
    assert (await h.lock("t1", "u2")).code is TeamCode.OK
    full = shaped(await h.lock("t1", "u3"), TeamCode.TEAM_FULL)
    assert full.code is TeamCode.TEAM_FULL
    assert [full.earliest_locked_at_ms, full.next_unlock_ms] == [locked_at, expires_at]
    assert (await h.lock("t1", "L")).code is TeamCode.ALREADY_MEMBER
    # The lock's seat is held only for the TTL.
    h.shift_ms += TTL_MS
    assert (await h.lock("t1", "u3")).code is TeamCode.OK
    assert await h.record_types() == ["team.opened", "lock.expired", "lock.expired"]


async def test_full_of_members_has_no_next_unlock(h: Harness) -> None:
    await h.activity(size=2)
    await h.open("t1")
    await h.lock("t1", "u1")
    assert (await h.confirm("t1", "u1", "o1")).code is TeamCode.OK
    assert (await h.lock("t1", "u2")).code is TeamCode.TEAM_FORMED
    assert (await h.lock("t1", "u1")).code is TeamCode.ALREADY_MEMBER


async def test_team_full_with_members_only(h: Harness) -> None:
    await h.open("t1")
    await h.lock("t1", "u1")
    await h.confirm("t1", "u1", "o1")
    await h.lock("t1", "u2")
    full = shaped(await h.lock("t1", "u3"), TeamCode.TEAM_FULL)
    assert full.code is TeamCode.TEAM_FULL and (full.earliest_locked_at_ms or 0) > 0
    await h.unlock("t1", "u2")
    await h.lock("t1", "u3")
    # Now one member seat + one locked seat: a full team again, earliest = u3's lock.
    assert (await h.lock("t1", "u4")).code is TeamCode.TEAM_FULL


async def test_switching_teams_needs_the_old_team_keys(h: Harness) -> None:
    await h.open("t1")
    await h.open("t2")
    await h.lock("t1", "u1")
    switch = shaped(await h.lock("t2", "u1"), TeamCode.SWITCH_NEEDED)
    assert switch.code is TeamCode.SWITCH_NEEDED and switch.team_id == "t1"
    # Nothing was written: u1 still holds t1 and t2 has no lock.
    assert await h.redis.zscore(h.keys.team_locks(AID, "t1"), "u1") is not None
    assert await h.redis.zcard(h.keys.team_locks(AID, "t2")) == 0
    moved = shaped(await h.lock("t2", "u1", other="t1"), *LOCKED)
    assert moved.code is TeamCode.OK and moved.released_team_id == "t1"
    assert await h.redis.zscore(h.keys.team_locks(AID, "t1"), "u1") is None
    assert (await h.redis.get(h.keys.user_lock(AID, "u1"))).startswith("t2|")


async def test_switch_refused_when_target_full_keeps_old_lock(h: Harness) -> None:
    await h.open("t1")
    await h.open("t2")
    await h.lock("t2", "a")
    await h.lock("t2", "b")
    await h.lock("t1", "u1")
    assert (await h.lock("t2", "u1", other="t1")).code is TeamCode.TEAM_FULL
    assert await h.redis.zscore(h.keys.team_locks(AID, "t1"), "u1") is not None


async def test_switch_from_expired_lock_records_its_expiry(h: Harness) -> None:
    await h.open("t1")
    await h.lock("t1", "u1")
    await h.open("t2")
    # The user key still says t1 (its PX has not run out in real time) but the lock expired.
    h.shift_ms += TTL_MS + 1
    reply = shaped(await h.lock("t2", "u1"), *LOCKED)
    assert reply.code is TeamCode.OK and reply.released_team_id == ""


async def test_unlock_outcomes(h: Harness) -> None:
    await h.open("t1")
    assert (await h.unlock("missing", "u1")).code is TeamCode.TEAM_NOT_FOUND
    await h.lock("t1", "u1")
    assert await h.unlock("t1", "u1") == Reply(TeamCode.OK, released=True)
    assert await h.unlock("t1", "u1") == Reply(TeamCode.OK, released=False)
    assert not await h.redis.exists(h.keys.user_lock(AID, "u1"))


async def test_confirm_outcomes(h: Harness) -> None:
    await h.open("t1", "L", "oL")
    assert (await h.confirm("missing", "u1", "o1")).code is TeamCode.TEAM_NOT_FOUND
    assert (await h.confirm("t1", "u1", "o1")).code is TeamCode.LOCK_REQUIRED
    await h.lock("t1", "u1")
    await h.lock("t1", "u2")
    assert formed(await h.confirm("t1", "u1", "o1")) == (TeamCode.OK, False)
    assert formed(await h.confirm("t1", "u1", "o1")) == (TeamCode.EXISTING, False)
    assert (await h.confirm("t1", "u1", "o9")).code is TeamCode.ALREADY_MEMBER
    assert formed(await h.confirm("t1", "L", "oL")) == (TeamCode.EXISTING, False)
    joined = await h.confirm("t1", "u2", "o2")
    assert formed(joined) == (TeamCode.OK, True)
    # The reply carries the team after the call, as team_read would answer it.
    assert shaped(joined, *LOCKED).team == shaped(await h.read("t1"), TeamCode.OK).team
    # A repeat says "formed" only for the confirm that formed the team (u2), not u1.
    assert formed(await h.confirm("t1", "u1", "o1")) == (TeamCode.EXISTING, False)
    assert formed(await h.confirm("t1", "u2", "o2")) == (TeamCode.EXISTING, True)
    assert (await h.confirm("t1", "u3", "o3")).code is TeamCode.TEAM_FORMED
    records = await h.records()
    assert [r["type"] for r in records] == [
        "team.opened",
        "team.member_joined",
        "team.member_joined",
        "team.formed",
    ]
    assert records[-1]["members"] == "L|oL,u1|o1,u2|o2"
    assert not await h.redis.exists(h.keys.team_locks(AID, "t1"))


async def test_a_blocked_user_is_refused_before_any_write(h: Harness) -> None:
    await h.open("t1")
    assert (await h.lock("t1", "payer")).code is TeamCode.OK
    await h.redis.hset(h.keys.blocked_users(), mapping={"bad": "1|", "payer": "1|why"})
    team = h.keys.team_keys(AID, "t1")
    team_keys = [team.hash, team.members, team.locks]
    before = [await h.redis.dump(key) for key in team_keys]
    records = await h.record_types()

    assert (await h.lock("t1", "bad")).code is TeamCode.USER_BLOCKED
    assert (await h.join("bad")).code is TeamCode.USER_BLOCKED
    assert (await h.open("t2", leader="bad")).code is TeamCode.USER_BLOCKED
    assert (await h.confirm("t1", "payer", "o1")).code is TeamCode.USER_BLOCKED
    # A lock held from before the block is still answered, unchanged.
    assert (await h.lock("t1", "payer")).code is TeamCode.EXISTING
    assert [await h.redis.dump(key) for key in team_keys] == before
    assert await h.record_types() == records
    assert not await h.redis.exists(h.keys.team(AID, "t2"))
    assert not await h.redis.exists(h.keys.user_lock(AID, "bad"))

    await h.redis.hdel(h.keys.blocked_users(), "bad", "payer")
    assert (await h.lock("t1", "bad")).code is TeamCode.OK
    assert (await h.confirm("t1", "payer", "o1")).code is TeamCode.OK


async def test_confirm_after_lock_expired_is_refused(h: Harness) -> None:
    await h.open("t1")
    await h.lock("t1", "u1")
    h.shift_ms += TTL_MS
    assert (await h.confirm("t1", "u1", "o1")).code is TeamCode.LOCK_REQUIRED


async def test_deadline_fails_the_team_once(h: Harness) -> None:
    await h.open("t1", "L", "oL")
    await h.lock("t1", "u1")
    await h.confirm("t1", "u1", "o1")
    await h.lock("t1", "u2")  # expires 50 s before the deadline
    h.shift_ms += DEADLINE_MS - 5_000
    await h.lock("t1", "u4")  # still live at the deadline
    h.shift_ms += 5_000
    assert (await h.lock("t1", "u3")).code is TeamCode.TEAM_FAILED
    assert (await h.confirm("t1", "u2", "o2")).code is TeamCode.TEAM_FAILED
    assert (await h.read("t1")).code is TeamCode.OK
    failed = [r for r in await h.records() if r["type"] == "team.failed"]
    assert len(failed) == 1 and failed[0]["members"] == "L|oL,u1|o1"
    # u2's lock expired before the deadline; u4's was live and ends with the team.
    expired = [r["user_id"] for r in await h.records() if r["type"] == "lock.expired"]
    assert expired == ["u2"]
    team = team_of(await h.read("t1"), "t1")
    assert team.status == "failed" and team.failed_ms == team.deadline_ms


async def test_read_reports_state(h: Harness) -> None:
    assert (await h.read("t1")).code is TeamCode.TEAM_NOT_FOUND
    await h.open("t1")
    await h.lock("t1", "u1")
    reply = await h.read_raw("t1")  # the wire shape the parser reads
    assert TeamCode(int(reply[0])) is TeamCode.OK
    _code, now, team, members, locks = reply
    team = dict(zip(team[0::2], team[1::2], strict=True))
    assert team["status"] == "open" and team["member_count"] == "1"
    assert members[0] == "L" and members[1].startswith("1|")
    assert locks[0] == "u1" and int(now) >= int(float(locks[1]))


async def test_user_lock_read(h: Harness) -> None:
    await h.open("t1")
    locked = shaped(await h.lock("t1", "u1"), *LOCKED)
    held = Reply(
        TeamCode.OK,
        team_id="t1",
        locked_at_ms=locked.locked_at_ms,
        expires_at_ms=locked.expires_at_ms,
    )
    assert await h.user_lock("u1") == held
    h.shift_ms += TTL_MS
    assert (await h.user_lock("u1")).code is TeamCode.NO_LOCK
    # The read writes nothing: the stale key goes by the PX its lock set.
    assert 0 < await h.redis.pttl(h.keys.user_lock(AID, "u1")) <= TTL_MS


async def test_user_lock_read_ends_with_the_team_at_its_deadline(h: Harness) -> None:
    await h.open("t1")
    h.shift_ms += DEADLINE_MS - 1_000  # the lock would outlive the deadline by far
    await h.lock("t1", "u1")
    assert (await h.user_lock("u1")).code is TeamCode.OK
    h.shift_ms += 1_000
    assert (await h.user_lock("u1")).code is TeamCode.NO_LOCK
    assert (await h.lock("t1", "u2")).code is TeamCode.TEAM_FAILED


async def test_user_lock_read_follows_unlock_confirm_and_switch(h: Harness) -> None:
    await h.open("t1")
    await h.open("t2")
    await h.lock("t1", "u1")
    await h.unlock("t1", "u1")
    assert (await h.user_lock("u1")).code is TeamCode.NO_LOCK
    await h.lock("t1", "u2")
    await h.confirm("t1", "u2", "o2")
    assert (await h.user_lock("u2")).code is TeamCode.NO_LOCK
    await h.lock("t1", "u3")
    await h.lock("t2", "u3", other="t1")
    assert shaped(await h.user_lock("u3"), TeamCode.OK).team_id == "t2"


async def test_open_seat_index_follows_every_change_of_seats(h: Harness) -> None:
    await h.open("t1")
    h.shift_ms += 1
    await h.open("t2")
    t1, t2 = await h.created_ms("t1"), await h.created_ms("t2")
    assert await h.open_seats() == {"t1": seat_score(1, t1), "t2": seat_score(1, t2)}
    await h.lock("t2", "u1")  # t2 is now closer to forming: it comes first
    assert await h.open_seats() == {"t1": seat_score(1, t1), "t2": seat_score(2, t2)}
    assert await h.redis.zrange(h.keys.open_seats(AID), 0, -1) == ["t2", "t1"]
    await h.lock("t2", "u2")  # full: no longer listed
    assert await h.open_seats() == {"t1": seat_score(1, t1)}
    await h.unlock("t2", "u2")
    assert await h.open_seats() == {"t1": seat_score(1, t1), "t2": seat_score(2, t2)}
    await h.lock("t1", "u1", other="t2")  # a switch frees a seat in the team left
    assert await h.open_seats() == {"t1": seat_score(2, t1), "t2": seat_score(1, t2)}
    await h.confirm("t1", "u1", "o1")  # a lock becomes a member: as many seats taken
    assert await h.open_seats() == {"t1": seat_score(2, t1), "t2": seat_score(1, t2)}
    await h.lock("t1", "u3")
    await h.confirm("t1", "u3", "o3")  # formed
    assert await h.open_seats() == {"t2": seat_score(1, t2)}
    await h.lock("t2", "u4")
    await h.lock("t2", "u5")
    assert await h.open_seats() == {}
    h.shift_ms += TTL_MS  # both locks expire; the stored seats count them until one is dropped
    assert await h.open_seats() == {}
    await h.read("t2")
    assert await h.open_seats() == {"t2": seat_score(1, t2)}
    h.shift_ms += DEADLINE_MS
    assert shaped(await h.sweep("t2"), TeamCode.OK).status == "failed"
    assert await h.open_seats() == {}


async def test_a_lost_team_leaves_the_open_seat_index(h: Harness) -> None:
    await h.open("t1")
    await h.redis.delete(h.keys.team(AID, "t1"), h.keys.team_members(AID, "t1"))
    assert list(await indexed_open_seats(h.redis, h.keys, AID)) == ["t1"]  # until noticed
    assert (await h.sweep("t1")).code is TeamCode.TEAM_NOT_FOUND
    assert await h.open_seats() == {}


async def test_outbox_ack_drops_the_empty_stream(h: Harness) -> None:
    await h.open("t1")
    await h.open("t2")
    stream, pending = h.keys.outbox(AID), h.keys.pending_activities()
    ids = [entry_id for entry_id, _ in await h.redis.xrange(stream)]
    keys = [stream, pending]
    assert await h.scripts.call("outbox_ack", keys, ["", "1", AID, *ids[:1]]) == [1, 1]
    assert await h.redis.zscore(pending, AID) == int(ids[1].split("-")[0])  # the oldest left
    assert await h.scripts.call("outbox_ack", keys, ["", "1", AID, *ids[1:]]) == [1, 0]
    assert not await h.redis.exists(stream)
    assert await h.redis.zscore(pending, AID) is None


async def test_restore_rebuilds_an_open_team_once(h: Harness) -> None:
    now = int((await h.redis.time())[0]) * 1000
    members = ["L", "1|1000|o-L", "m1", "2|1001|o-1"]
    args = {
        "leader_id": "L",
        "leader_order_id": "o-L",
        "size": 3,
        "lock_ttl_ms": TTL_MS,
        "created_ms": now - 5_000,
        "deadline_ms": now + DEADLINE_MS,
        "retention_ms": RETENTION_MS,
        "virtual_min": 0,
        "teams_limit": 0,
        "led_limit": 0,
    }
    # 6 changes recorded before the loss
    assert await h.restore("t1", members, version=7, **args) == Reply(TeamCode.OK)
    again = await h.restore("t1", ["x", "1|1|"], version=1, **args)
    assert again == Reply(TeamCode.EXISTING)
    assert await h.redis.hget(h.keys.team(AID, "t1"), "member_count") == "2"
    assert await h.redis.hget(h.keys.team(AID, "t1"), "version") == "7"
    assert await h.record_types() == []  # nothing new happened: nothing to record
    assert await h.redis.zscore(h.keys.deadline_index(AID), "t1") == now + DEADLINE_MS
    assert await h.open_seats() == {"t1": seat_score(2, now - 5_000)}
    assert (await h.lock("t1", "m2")).code == TeamCode.OK
    assert (await h.lock("t1", "m3")).code == TeamCode.TEAM_FULL
    assert formed(await h.confirm("t1", "m2", "o-2")) == (TeamCode.OK, True)  # the third seat
    joined = [r for r in await h.records() if r["type"] == "team.member_joined"]
    assert joined[0]["seq"] == "3"


async def test_scripts_survive_script_flush(h: Harness) -> None:
    await h.open("t1")
    await h.redis.script_flush()
    assert not any(await h.redis.script_exists(*[s.sha for s in h.scripts._scripts.values()]))
    assert (await h.lock("t1", "u1")).code is TeamCode.OK
    assert (await h.read("t1")).code is TeamCode.OK
    assert (await h.join("u2")).code is TeamCode.OK
    assert (await h.page(10)).code is TeamCode.OK


async def test_every_key_but_the_global_indexes_shares_the_activity_slot(h: Harness) -> None:
    await h.open("t1")
    await h.lock("t1", "u1")
    keys = set(await h.redis.keys("*"))
    indexes = {h.keys.pending_activities(), h.keys.due_locks(), h.keys.due_deadlines()}
    assert indexes <= keys  # the documented exception (docs/architecture.md, for Cluster)
    tags = {key[key.index("{") + 1 : key.index("}")] for key in keys - indexes}
    assert tags == {f"a:{AID}"}


def test_lua_codes_mirror_the_python_enum() -> None:

    source = script_source("team_read")
    lua_codes: dict[str, int] = {}
    for names, values in re.findall(r"^local ([A-Z_, ]+) = ([\d, ]+)$", source, re.MULTILINE):
        for name, value in zip(names.split(","), values.split(","), strict=True):
            lua_codes[name.strip()] = int(value)
    assert lua_codes.pop("SEAT_WEIGHT") == SEAT_WEIGHT  # the seat score's, as the codec's
    assert lua_codes == {code.name: code.value for code in TeamCode}


async def test_indexes_follow_every_change(h: Harness) -> None:
    lock_index, deadlines = h.keys.lock_index(AID), h.keys.deadline_index(AID)
    await h.open("t1")
    await h.open("t2")
    assert [m for m, _ in await h.redis.zrange(deadlines, 0, -1, withscores=True)] == ["t1", "t2"]
    first = shaped(await h.lock("t1", "u1"), *LOCKED)
    assert await h.redis.zscore(lock_index, "t1") == first.expires_at_ms  # its lock's expiry
    h.shift_ms += 5
    second = shaped(await h.lock("t1", "u2"), *LOCKED)
    assert await h.redis.zscore(lock_index, "t1") == first.expires_at_ms  # still the earliest
    await h.unlock("t1", "u1")
    assert await h.redis.zscore(lock_index, "t1") == second.expires_at_ms  # now u2's
    await h.lock("t2", "u2", other="t1")  # the switch leaves t1 with no lock
    assert await h.redis.zscore(lock_index, "t1") is None
    assert await h.redis.zscore(lock_index, "t2") is not None
    await h.confirm("t2", "u2", "o2")
    await h.lock("t2", "u3")
    await h.confirm("t2", "u3", "o3")  # formed: out of both indexes
    assert await h.redis.zscore(lock_index, "t2") is None
    assert await h.redis.zscore(deadlines, "t2") is None
    assert await h.redis.zscore(deadlines, "t1") is not None


async def test_sweep_expires_locks_and_fails_teams(h: Harness) -> None:
    await h.open("t1")
    await h.lock("t1", "u1")

    async def sweep() -> TeamReply:
        return await h.sweep("t1")

    assert await sweep() == Reply(TeamCode.OK, locks_expired=0, status="open", ended_now=False)
    h.shift_ms += TTL_MS
    assert await sweep() == Reply(TeamCode.OK, locks_expired=1, status="open", ended_now=False)
    assert await h.redis.zscore(h.keys.lock_index(AID), "t1") is None
    assert await sweep() == Reply(TeamCode.OK, locks_expired=0, status="open", ended_now=False)
    h.shift_ms += DEADLINE_MS
    assert await sweep() == Reply(
        TeamCode.OK, locks_expired=0, status="failed", ended_now=True
    )  # this call failed it
    assert await sweep() == Reply(TeamCode.OK, locks_expired=0, status="failed", ended_now=False)
    assert await h.redis.zscore(h.keys.deadline_index(AID), "t1") is None
    assert await h.record_types() == ["team.opened", "lock.expired", "team.failed"]
    # a team Redis no longer has leaves the indexes too
    await h.redis.zadd(h.keys.deadline_index(AID), {"ghost": 1})
    h.shift_ms = 0
    assert await h.sweep("ghost") == Reply(TeamCode.TEAM_NOT_FOUND)
    assert await h.redis.zscore(h.keys.deadline_index(AID), "ghost") is None


async def test_every_record_lists_the_activity_in_the_pending_index(h: Harness) -> None:
    pending = h.keys.pending_activities()
    await h.open("t1")
    await h.lock("t1", "u1")
    h.shift_ms += TTL_MS
    await h.read("t1")  # the lazy check records the lock's expiry
    records = await h.redis.xrange(h.keys.outbox(AID))
    assert len(records) == 2
    listed = await h.redis.zrange(pending, 0, -1, withscores=True)
    assert [(member, int(score)) for member, score in listed] == [
        (AID, int(records[0][0].split("-")[0]))  # scored by the oldest record
    ]


async def test_the_due_indexes_never_list_an_activity_later_than_its_earliest_team(
    h: Harness,
) -> None:
    due_locks, due_deadlines = h.keys.due_locks(), h.keys.due_deadlines()
    await h.open("t1")
    deadline = await h.redis.zscore(h.keys.deadline_index(AID), "t1")
    assert await h.redis.zscore(due_deadlines, AID) == deadline
    assert await h.redis.zscore(due_locks, AID) is None
    first = shaped(await h.lock("t1", "u1"), *LOCKED)
    assert await h.redis.zscore(due_locks, AID) == first.expires_at_ms
    h.shift_ms += 5
    await h.open("t2")
    second = shaped(await h.lock("t2", "u2"), *LOCKED)
    assert await h.redis.zscore(due_locks, AID) == first.expires_at_ms  # the earlier one stays
    await h.unlock("t1", "u1")
    # a lower bound until a sweep sets it right: then the earliest lock left, or nothing
    assert await h.redis.zscore(due_locks, AID) == first.expires_at_ms
    lock_index = h.keys.lock_index(AID)
    assert await h.reindex(lock_index, due_locks) == [1, second.expires_at_ms]
    assert await h.redis.zscore(due_locks, AID) == second.expires_at_ms
    await h.unlock("t2", "u2")
    assert await h.reindex(lock_index, due_locks) == [0]
    assert await h.redis.zscore(due_locks, AID) is None
    await h.redis.zrem(due_deadlines, AID)  # lost: the repair's re-index puts it back
    assert await h.reindex(h.keys.deadline_index(AID), due_deadlines) == [1, deadline]
    assert await h.redis.zscore(due_deadlines, AID) == deadline


async def test_release_takes_the_activity_out_of_the_due_indexes(h: Harness) -> None:
    await h.open("t1")
    assert await h.teams.release(AID) is False  # a team is open
    await h.redis.delete(h.keys.deadline_index(AID))  # as if its last team had ended
    assert await h.teams.release(AID) is False  # its team.opened record waits for SQL
    await h.redis.delete(h.keys.outbox(AID))  # as if SQL had every record
    assert await h.redis.exists(h.keys.activity_counts(AID))
    assert await h.teams.release(AID) is True
    gone = (h.keys.activity(AID), h.keys.due_deadlines(), h.keys.activity_counts(AID))
    assert not await h.redis.exists(*gone)


async def put_counts(h: Harness, ttl_ms: int, **counts: int) -> TeamReply:
    """activity_counts_put with SQL's counts (0 unless given), as the activity's copy puts
    them when Redis has none."""
    put = contracts.ACTIVITY_COUNTS_PUT
    args = {name: ttl_ms if name == "ttl_ms" else counts.get(name, 0) for name in put.arg_names}
    keys = put.key_list(activity_counts=h.keys.activity_counts(AID))
    return await put.run(h.scripts, keys, args)


async def test_counts_put_back_after_the_release_expire_until_a_team_lives(h: Harness) -> None:
    """SPEC §4.9. The activity's last team ended, SQL has every record, the repair released
    it; then a call arrives late (a lock of that team) and puts its copy back from SQL, and
    its counts with it. Nothing would release it again: those counts expire as the copy
    does, until a team opens (or is rebuilt); then they stay until the next release."""
    counts = h.keys.activity_counts(AID)
    await h.open("t1")
    h.shift_ms += DEADLINE_MS
    assert (await h.sweep("t1")).status == "failed"
    await h.redis.delete(h.keys.outbox(AID))  # SQL has every record
    assert await h.teams.release(AID) is True
    assert not await h.redis.exists(counts)
    put = await put_counts(h, 60_000, teams_failed=1)
    assert put == Reply(TeamCode.OK)
    assert 0 < await h.redis.pttl(counts) <= 60_000
    assert await put_counts(h, 60_000) == Reply(TeamCode.EXISTING)
    await h.activity()
    assert (await h.open("t2")).code is TeamCode.OK
    assert await h.redis.pttl(counts) == -1
    assert await h.redis.hgetall(counts) == {
        "counted": "1",
        "teams_open": "1",
        "teams_formed": "0",
        "teams_failed": "1",
        "members": "1",
        "virtual_completions": "0",
    }
    # A team rebuilt from SQL lives as well.
    await h.redis.pexpire(counts, 60_000)
    await restore(h, "t3", int((await h.redis.time())[0]) * 1000, "L3")
    assert await h.redis.pttl(counts) == -1


async def test_counts_a_team_script_made_first_do_not_expire(h: Harness) -> None:
    """Counts SQL's put finds half made (a team opened before the copy's put ended: its
    counts came first) belong to a live team: they get no expiry."""
    await h.open("t1")
    assert await put_counts(h, 60_000, teams_open=1, members=1) == Reply(TeamCode.OK)
    assert await h.redis.pttl(h.keys.activity_counts(AID)) == -1


# -- team_join and team_list: scripts that pick a team -------------------------------


async def restore(
    h: Harness, tid: str, created_ms: int, *members: str, teams_limit: int = 0
) -> None:
    """A team with these members (the first leads) and this created_ms, as team_restore
    rebuilds one: the way to give several teams one created_ms."""
    recorded: list[Any] = []
    for seq, user in enumerate(members, start=1):
        recorded += [user, f"{seq}|{created_ms}|"]
    restored = await h.restore(
        tid,
        recorded,
        leader_id=members[0],
        leader_order_id="",
        size=3,
        lock_ttl_ms=TTL_MS,
        created_ms=created_ms,
        deadline_ms=created_ms + DEADLINE_MS,
        retention_ms=RETENTION_MS,
        version=len(members),
        virtual_min=0,
        teams_limit=teams_limit,
        led_limit=0,
    )
    assert restored == Reply(TeamCode.OK)


async def join_until_answered(h: Harness, user: str, candidates: int) -> list[TeamReply]:
    """Every reply of one join, following LOOK_FURTHER as the service does."""
    replies = [await h.join(user, candidates=candidates)]
    while replies[-1].code is TeamCode.LOOK_FURTHER:
        cursor = cursor_of(replies[-1])
        replies.append(await h.join(user, cursor, candidates))
    return replies


async def test_join_takes_the_team_closest_to_forming_then_the_oldest(h: Harness) -> None:
    for tid in ("t1", "t2", "t3"):
        await h.open(tid, f"L{tid}")
        h.shift_ms += 1
    await h.lock("t2", "u1")
    joined = shaped(await h.join("a"), *LOCKED)  # t2 has the most seats taken
    assert placed(joined) == (TeamCode.OK, "t2")
    assert joined.expires_at_ms - joined.locked_at_ms == TTL_MS
    assert joined.version == 3  # t2's version: opened, u1's lock, this one (as team_lock's)
    assert await h.redis.zscore(h.keys.team_locks(AID, "t2"), "a") == joined.locked_at_ms
    assert (await h.redis.get(h.keys.user_lock(AID, "a"))).startswith("t2|")
    assert placed(await h.join("b")) == (TeamCode.OK, "t1")  # t2 is full; t1 is the oldest
    assert placed(await h.join("c")) == (TeamCode.OK, "t1")
    assert placed(await h.join("d")) == (TeamCode.OK, "t3")
    # One lock per user and activity: a live lock anywhere is the answer, unchanged.
    existing = Reply(
        TeamCode.EXISTING,
        team_id="t2",
        locked_at_ms=joined.locked_at_ms,
        expires_at_ms=joined.expires_at_ms,
        version=3,
    )
    assert await h.join("a") == existing
    await h.lock("t3", "b", other="t1")
    assert placed(await h.join("b")) == (TeamCode.EXISTING, "t3")
    assert await h.record_types() == ["team.opened"] * 3  # locks live only in Redis


async def test_join_never_places_a_member_in_their_team_again(h: Harness) -> None:
    await h.open("t1", "L1")
    h.shift_ms += 1
    await h.open("t2", "L2")
    await h.lock("t1", "u1")
    await h.confirm("t1", "u1", "o1")
    assert placed(await h.join("u1")) == (TeamCode.OK, "t2")
    await h.unlock("t2", "u1")
    x = shaped(await h.lock("t2", "x"), *LOCKED)
    await h.lock("t2", "y")
    # t1 has a seat, but u1 is a member there; t2 is full until x's lock expires.
    assert await h.join("u1") == Reply(TeamCode.NO_TEAM_AVAILABLE, next_unlock_ms=x.expires_at_ms)
    assert placed(await h.join("L2")) == (TeamCode.OK, "t1")


async def test_no_team_available_says_when_the_earliest_lock_expires(h: Harness) -> None:
    no_team = Reply(TeamCode.NO_TEAM_AVAILABLE, next_unlock_ms=None)
    assert await h.join("u1") == no_team  # no team at all
    await h.open("t1", "L1")
    first = shaped(await h.lock("t1", "a"), *LOCKED)
    h.shift_ms += 1_000
    await h.lock("t1", "b")
    assert await h.join("u1") == Reply(
        TeamCode.NO_TEAM_AVAILABLE, next_unlock_ms=first.expires_at_ms
    )
    await h.redis.delete(h.keys.activity(AID))
    assert await h.join("u1") == Reply(TeamCode.ACTIVITY_NOT_FOUND)


async def test_join_takes_a_seat_freed_by_a_lock_that_expired_unswept(h: Harness) -> None:
    await h.open("t1", "L1")
    h.shift_ms += 1
    await h.open("t2", "L2")
    for user in ("a", "b"):
        await h.lock("t1", user)
    h.shift_ms += 1_000
    for user in ("c", "d"):
        await h.lock("t2", user)
    assert (await h.join("u1")).code is TeamCode.NO_TEAM_AVAILABLE
    h.shift_ms += TTL_MS - 1_000  # t1's locks expired; nobody swept them; t2's still hold
    assert await h.open_seats() == {}  # the stored seats still count them
    assert placed(await h.join("u1")) == (TeamCode.OK, "t1")
    assert placed(await h.join("u2")) == (TeamCode.OK, "t1")
    assert (await h.join("u3")).code is TeamCode.NO_TEAM_AVAILABLE
    expired = [
        (r["team_id"], r["user_id"]) for r in await h.records() if r["type"] == "lock.expired"
    ]
    assert expired == [("t1", "a"), ("t1", "b")]


async def test_join_fails_a_team_past_its_deadline_and_never_locks_there(h: Harness) -> None:
    await h.open("t1", "L1", "o1")
    h.shift_ms += DEADLINE_MS - 1
    await h.open("t2", "L2")  # younger: t1 stays first in the index
    h.shift_ms += 1
    assert placed(await h.join("u1")) == (TeamCode.OK, "t2")
    failed = [r for r in await h.records() if r["type"] == "team.failed"]
    assert [(r["team_id"], r["members"]) for r in failed] == [("t1", "L1|o1")]
    assert await h.redis.hget(h.keys.team(AID, "t1"), "status") == "failed"


async def test_join_looks_further_in_bounded_steps(h: Harness) -> None:
    now = int((await h.redis.time())[0]) * 1000
    for tid in ("t1", "t2", "t3"):
        await restore(h, tid, now, f"L{tid}", "u")  # u is a member of the first three
    await restore(h, "t4", now + 1, "L4")
    replies = await join_until_answered(h, "u", candidates=2)
    assert [r.code for r in replies] == [TeamCode.LOOK_FURTHER, TeamCode.OK]
    further = shaped(replies[0], TeamCode.LOOK_FURTHER)
    assert cursor_of(further) == (str(seat_score(2, now)), "t2") and placed(replies[1])[1] == "t4"
    assert (await h.join("u", (further.score, "t2"), candidates=2)).code is TeamCode.EXISTING


async def test_join_applies_time_in_bounded_steps_then_looks_again(h: Harness) -> None:
    now = int((await h.redis.time())[0]) * 1000
    for tid in ("t1", "t2"):
        await restore(h, tid, now, f"L{tid}", "u")  # u is a member of both
        await h.lock(tid, f"x{tid}")
    await restore(h, "t3", now + 1, "L3")
    await h.lock("t3", "y1")
    await h.lock("t3", "y2")
    h.shift_ms += TTL_MS  # every seat lock expired: three teams to sweep, two per call
    replies = await join_until_answered(h, "u", candidates=2)
    assert replies[:2] == [
        Reply(
            TeamCode.LOOK_FURTHER, score="", team_id=""
        ),  # time applied to two of three teams: again
        Reply(TeamCode.LOOK_FURTHER, score=str(seat_score(2, now)), team_id="t2"),
    ]
    assert placed(replies[2]) == (TeamCode.OK, "t3") and len(replies) == 3


async def test_join_keeps_the_activity_limit_on_teams_per_user(h: Harness) -> None:
    now = int((await h.redis.time())[0]) * 1000
    await restore(h, "t1", now, "L1", teams_limit=1)
    await h.redis.set(h.keys.user_counter(AID, "u", "teams"), 1)  # u belongs to a team
    assert await h.join("u") == Reply(
        TeamCode.USER_LIMIT_REACHED, limit=1, current=1, limit_name="teams_per_user"
    )
    assert await h.redis.zcard(h.keys.team_locks(AID, "t1")) == 0
    assert placed(await h.join("v")) == (TeamCode.OK, "t1")


async def test_the_keys_join_builds_are_the_keys_keys_builds(h: Harness) -> None:
    await h.open("t-1", "L1")
    await h.open("t_2", "L2")
    await h.lock("t-1", "a")
    h.shift_ms += TTL_MS  # a's lock expires unswept: join drops it through built keys
    for user in ("b", "c", "d", "e"):
        assert (await h.join(user)).code is TeamCode.OK
    assert (await h.page(10)).code is TeamCode.OK
    expected = {h.keys.activity(AID), *h.keys.activity_keys(AID).named().values()}
    for tid in ("t-1", "t_2"):
        expected.update(h.keys.team_keys(AID, tid).named().values())
    expected.update(h.keys.user_lock(AID, user) for user in ("a", "b", "c", "d", "e"))
    present = set(await h.redis.keys("*"))
    assert present <= expected, present - expected
    for tid in ("t-1", "t_2"):
        locked = await h.redis.zrange(h.keys.team_locks(AID, tid), 0, -1)
        assert len(locked) == 2 and all(u in "bcde" for u in locked), (tid, locked)
    assert await h.redis.zcard(h.keys.open_seats(AID)) == 0
    assert await h.open_seats() == {}


def page_ids(reply: TeamReply) -> list[str]:
    assert reply.code is TeamCode.OK, reply
    return [team.team_id for team in teams_of(reply)]


async def test_team_list_pages_in_join_order_and_resumes_after_a_team_left(h: Harness) -> None:
    now = int((await h.redis.time())[0]) * 1000
    # One score for all (same members, same created_ms): Redis orders them by id, byte by
    # byte, whatever the server's locale: a-1 < a1 < aZ < a_1.
    for tid in ("a_1", "aZ", "a1", "a-1"):
        await restore(h, tid, now, f"L{tid}")
    await restore(h, "b", now + 5, "Lb", "m")  # two seats taken: first
    first = shaped(await h.page(3), TeamCode.OK)
    assert page_ids(first) == ["b", "a-1", "a1"]
    assert next_of(first) == PageCursor(seat_score(1, now), "a1")
    team = teams_of(first)[0]
    assert len(team.members) == 2
    assert [user for user, _order, _at in team.members] == ["Lb", "m"] and team.locks == []
    await h.lock("a1", "x")
    await h.lock("a1", "y")  # full: a1 leaves the index; the page after it still follows
    after = next_of(first)
    assert after is not None
    second = shaped(await h.page(3, (after.score, after.team_id)), TeamCode.OK)
    assert page_ids(second) == ["aZ", "a_1"] and next_of(second) is None
    # A cursor between ids: a-1 < a0 < a1, and a1 has left.
    assert page_ids(await h.page(1, (str(seat_score(1, now)), "a0"))) == ["aZ"]


async def test_every_record_the_scripts_emit_has_exactly_its_typed_fields(h: Harness) -> None:
    """Each emit({...}) site against the codec's TypedDict of its record type: a field
    renamed, added or dropped in Lua fails here rather than in the write-behind."""
    await h.activity(3)
    seen = 0

    async def emitted() -> list[str]:
        nonlocal seen
        records = await h.records()
        new, seen = records[seen:], len(records)
        return [r["type"] + (" virtual" if "virtual_seats" in r else "") for r in new]

    await h.open("t1", "L", "oL")
    assert await emitted() == ["team.opened"]  # team_open
    await h.lock("t1", "u1")
    await h.redis.hset(h.keys.activity(AID), "max_hold_ms", 2 * TTL_MS)
    await team_extend(h.teams, AID, "t1", "u1", 2 * TTL_MS)
    assert await emitted() == ["lock.extended"]  # team_extend
    await h.lock("t1", "u2")
    await h.confirm("t1", "u1", "o1")
    await h.confirm("t1", "u2", "o2")  # the last seat
    assert await emitted() == ["team.member_joined", "team.member_joined", "team.formed"]
    await h.open("t2")
    await h.lock("t2", "u3")
    await h.open("t3")
    await h.open("t5")
    await h.lock("t5", "u5")
    # The team's own TTL is over before the one the user's key holds: a switch records it.
    await h.redis.hset(h.keys.team(AID, "t5"), "lock_ttl_ms", 1)
    await h.redis.hset(h.keys.activity(AID), "virtual_min", 1)
    await h.open("t4")  # one real member is enough: formed virtually at its deadline
    assert await emitted() == ["team.opened"] * 4
    h.shift_ms += 5
    await h.lock("t3", "u5", other="t5")  # team_lock: the lock u5 leaves had expired
    assert await emitted() == ["lock.expired"]
    h.shift_ms += TTL_MS
    await h.sweep("t2")  # _team_lib's lazy checks: u3's lock
    assert await emitted() == ["lock.expired"]
    h.shift_ms += DEADLINE_MS
    await h.sweep("t2")
    await h.sweep("t4")
    assert await emitted() == ["team.failed", "team.formed virtual"]
    await h.open("t6", "L6", "o6")
    await h.lock("t6", "u6")
    await h.confirm("t6", "u6", "o6b")
    await h.leave("t6", "L6", "o6")  # team_leave: the leader leaves an open team
    await h.leave("t1", "u1", "o1")  # a member of a formed team is refunded
    await h.dissolve("t6")  # team_dissolve
    assert await emitted() == [
        "team.opened",
        "team.member_joined",
        "team.member_left",
        "team.leader_changed",
        "team.member_refunded",
        "team.failed",
    ]
    await h.open("t7", "L7")
    await h.lock("t7", "u7")
    await h.lock("t7", "u8")
    assert (await h.queue("w1", "t7")).code is TeamCode.QUEUED
    assert (await h.queue("w2", "t7")).code is TeamCode.QUEUED
    await h.redis.hset(h.keys.activity_blocklist(AID), "w1", "1")
    await h.unlock("t7", "u7")  # w1 is blocked now: dropped; w2 takes the seat
    await h.queue("w3", "t7")
    h.shift_ms += 700_000  # past every entry's lifetime (600 s by default)
    await h.expire_entries()
    assert await emitted() == [
        "team.opened",
        "waitlist.dropped",
        "lock.offered",
        "waitlist.expired",
    ]

    for fields in await h.records():
        record = team_records.parse_team_record(fields)
        required, optional = record_keys(team_records.TEAM_RECORDS[fields["type"]])
        assert set(fields) == set(record), fields  # no field the type does not have
        # Every field of the type, but a confirm's team.formed has no virtual seats.
        unused = {"virtual_seats"} if fields["type"] == "team.formed" else set()
        assert (required | optional) - set(fields) <= unused, fields
    types = {fields["type"] for fields in await h.records()}
    assert types == set(team_records.TEAM_RECORDS)
