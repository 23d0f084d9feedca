"""Each team script called directly (no service), on fakeredis and on a real redis-server."""

from __future__ import annotations

import re
from typing import Any

import pytest

from groupbuy.locks.codec import SEAT_WEIGHT, seat_score
from groupbuy.locks.codes import TeamCode
from groupbuy.storage.keys import Keys
from groupbuy.storage.scripts import Scripts, script_names, script_source
from tests.support.seats import indexed_open_seats, recomputed_open_seats

AID = "act1"
TTL_MS = 10_000
DEADLINE_MS = 60_000
RETENTION_MS = 3_600_000


class Harness:
    """Calls the scripts with the key layout the service uses, at a controllable time shift."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.scripts = Scripts(redis)
        self.keys = Keys("t")
        self.shift_ms = 0

    async def activity(self, size: int = 3) -> None:
        await self.redis.hset(
            self.keys.activity(AID),
            mapping={"team_size": size, "lock_ttl_ms": TTL_MS, "team_deadline_ms": DEADLINE_MS},
        )

    async def _call(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        reply = await self.scripts.call(name, keys, args)
        assert isinstance(reply, list), reply
        return reply

    def _keys(self, tid: str, user: str | None = None) -> list[str]:
        keys = self.keys.team_keys(AID, tid)
        return keys if user is None else [*keys, self.keys.user_lock(AID, user)]

    async def open(self, tid: str, leader: str = "L", order: str = "") -> list[Any]:
        keys = [*self._keys(tid), self.keys.activity(AID)]
        return await self._call(
            "team_open", keys, [AID, tid, self.shift_ms, leader, order, RETENTION_MS]
        )

    async def lock(self, tid: str, user: str, other: str = "") -> list[Any]:
        keys = self._keys(tid, user)
        if other:
            keys += [self.keys.team(AID, other), self.keys.team_locks(AID, other)]
        return await self._call("team_lock", keys, [AID, tid, self.shift_ms, user, other])

    async def unlock(self, tid: str, user: str) -> list[Any]:
        return await self._call(
            "team_unlock", self._keys(tid, user), [AID, tid, self.shift_ms, user]
        )

    async def confirm(self, tid: str, user: str, order: str) -> list[Any]:
        return await self._call(
            "team_confirm", self._keys(tid, user), [AID, tid, self.shift_ms, user, order]
        )

    async def sweep(self, tid: str) -> list[Any]:
        return await self._call("team_sweep", self._keys(tid), [AID, tid, self.shift_ms])

    async def created_ms(self, tid: str) -> int:
        return int(await self.redis.hget(self.keys.team(AID, tid), "created_ms"))

    async def open_seats(self) -> dict[str, int]:
        """The open-seat index, checked against the teams' own keys first."""
        indexed = await indexed_open_seats(self.redis, self.keys, AID)
        assert indexed == await recomputed_open_seats(self.redis, self.keys, AID)
        return indexed

    async def read(self, tid: str) -> list[Any]:
        return await self._call("team_read", self._keys(tid), [AID, tid, self.shift_ms])

    async def user_lock(self, user: str) -> list[Any]:
        return await self._call("user_lock_read", [self.keys.user_lock(AID, user)], [self.shift_ms])

    async def records(self) -> list[dict[str, str]]:
        return [fields for _id, fields in await self.redis.xrange(self.keys.outbox(AID))]

    async def record_types(self) -> list[str]:
        return [r["type"] for r in await self.records()]


@pytest.fixture
async def h(redis_client: Any) -> Harness:
    harness = Harness(redis_client)
    await harness.scripts.load()
    await harness.activity()
    return harness


def code(reply: list[Any]) -> TeamCode:
    return TeamCode(int(reply[0]))


def test_every_script_has_a_contract_header() -> None:
    for name in script_names():
        source = script_source(name)
        body = source[source.index(f"-- {name}:") :]
        assert body.startswith(f"-- {name}: "), name
        assert re.search(r"-- KEYS\[1(\.\.\d+)?\]", body), name
        assert "-- Returns" in body, name


async def test_open_outcomes(h: Harness) -> None:
    opened = await h.open("t1", "L", "o1")
    assert code(opened) is TeamCode.OK
    assert opened[1:] == (await h.read("t1"))[2:]  # the team as team_read answers it
    assert code(await h.open("t1", "L", "o1")) is TeamCode.EXISTING
    assert code(await h.open("t1", "L", "other")) is TeamCode.CONFLICT
    assert code(await h.open("t1", "M", "o1")) is TeamCode.CONFLICT
    await h.redis.delete(h.keys.activity(AID))
    assert code(await h.open("t2")) is TeamCode.ACTIVITY_NOT_FOUND
    assert not await h.redis.exists(h.keys.team(AID, "t2"))
    assert await h.record_types() == ["team.opened"]
    # Every team key expires after deadline + retention.
    ttl = await h.redis.pttl(h.keys.team(AID, "t1"))
    assert DEADLINE_MS < ttl <= DEADLINE_MS + RETENTION_MS


async def test_lock_outcomes(h: Harness) -> None:
    await h.open("t1")
    assert code(await h.lock("missing", "u1")) is TeamCode.TEAM_NOT_FOUND
    first = await h.lock("t1", "u1")
    assert code(first) is TeamCode.OK
    locked_at, expires_at, released = int(first[1]), int(first[2]), first[3]
    assert expires_at - locked_at == TTL_MS and released == ""
    again = await h.lock("t1", "u1")
    assert code(again) is TeamCode.EXISTING and [int(again[1]), int(again[2])] == [
        locked_at,
        expires_at,
    ]
    assert code(await h.lock("t1", "u2")) is TeamCode.OK
    full = await h.lock("t1", "u3")
    assert code(full) is TeamCode.TEAM_FULL
    assert [int(full[1]), int(full[2])] == [locked_at, expires_at]
    assert code(await h.lock("t1", "L")) is TeamCode.ALREADY_MEMBER
    # The lock's seat is held only for the TTL.
    h.shift_ms += TTL_MS
    assert code(await h.lock("t1", "u3")) is TeamCode.OK
    assert await h.record_types() == ["team.opened", "lock.expired", "lock.expired"]


async def test_full_of_members_has_no_next_unlock(h: Harness) -> None:
    await h.activity(size=2)
    await h.open("t1")
    await h.lock("t1", "u1")
    assert code(await h.confirm("t1", "u1", "o1")) is TeamCode.OK
    assert code(await h.lock("t1", "u2")) is TeamCode.TEAM_FORMED
    assert code(await h.lock("t1", "u1")) is TeamCode.ALREADY_MEMBER


async def test_team_full_with_members_only(h: Harness) -> None:
    await h.open("t1")
    await h.lock("t1", "u1")
    await h.confirm("t1", "u1", "o1")
    await h.lock("t1", "u2")
    full = await h.lock("t1", "u3")
    assert code(full) is TeamCode.TEAM_FULL and int(full[1]) > 0
    await h.unlock("t1", "u2")
    await h.lock("t1", "u3")
    # Now one member seat + one locked seat: a full team again, earliest = u3's lock.
    assert code(await h.lock("t1", "u4")) is TeamCode.TEAM_FULL


async def test_switching_teams_needs_the_old_team_keys(h: Harness) -> None:
    await h.open("t1")
    await h.open("t2")
    await h.lock("t1", "u1")
    switch = await h.lock("t2", "u1")
    assert code(switch) is TeamCode.SWITCH_NEEDED and switch[1] == "t1"
    # Nothing was written: u1 still holds t1 and t2 has no lock.
    assert await h.redis.zscore(h.keys.team_locks(AID, "t1"), "u1") is not None
    assert await h.redis.zcard(h.keys.team_locks(AID, "t2")) == 0
    moved = await h.lock("t2", "u1", other="t1")
    assert code(moved) is TeamCode.OK and moved[3] == "t1"
    assert await h.redis.zscore(h.keys.team_locks(AID, "t1"), "u1") is None
    assert (await h.redis.get(h.keys.user_lock(AID, "u1"))).startswith("t2|")


async def test_switch_refused_when_target_full_keeps_old_lock(h: Harness) -> None:
    await h.open("t1")
    await h.open("t2")
    await h.lock("t2", "a")
    await h.lock("t2", "b")
    await h.lock("t1", "u1")
    assert code(await h.lock("t2", "u1", other="t1")) is TeamCode.TEAM_FULL
    assert await h.redis.zscore(h.keys.team_locks(AID, "t1"), "u1") is not None


async def test_switch_from_expired_lock_records_its_expiry(h: Harness) -> None:
    await h.open("t1")
    await h.lock("t1", "u1")
    await h.open("t2")
    # The user key still says t1 (its PX has not run out in real time) but the lock expired.
    h.shift_ms += TTL_MS + 1
    reply = await h.lock("t2", "u1")
    assert code(reply) is TeamCode.OK and reply[3] == ""


async def test_unlock_outcomes(h: Harness) -> None:
    await h.open("t1")
    assert code(await h.unlock("missing", "u1")) is TeamCode.TEAM_NOT_FOUND
    await h.lock("t1", "u1")
    assert await h.unlock("t1", "u1") == [TeamCode.OK, 1]
    assert await h.unlock("t1", "u1") == [TeamCode.OK, 0]
    assert not await h.redis.exists(h.keys.user_lock(AID, "u1"))


async def test_confirm_outcomes(h: Harness) -> None:
    await h.open("t1", "L", "oL")
    assert code(await h.confirm("missing", "u1", "o1")) is TeamCode.TEAM_NOT_FOUND
    assert code(await h.confirm("t1", "u1", "o1")) is TeamCode.LOCK_REQUIRED
    await h.lock("t1", "u1")
    await h.lock("t1", "u2")
    assert (await h.confirm("t1", "u1", "o1"))[:2] == [TeamCode.OK, 0]
    assert (await h.confirm("t1", "u1", "o1"))[:2] == [TeamCode.EXISTING, 0]
    assert code(await h.confirm("t1", "u1", "o9")) is TeamCode.ALREADY_MEMBER
    assert (await h.confirm("t1", "L", "oL"))[:2] == [TeamCode.EXISTING, 0]
    joined = await h.confirm("t1", "u2", "o2")
    assert joined[:2] == [TeamCode.OK, 1]
    # The reply carries the team after the call, as team_read would answer it.
    assert joined[2:] == (await h.read("t1"))[2:]
    # A repeat says "formed" only for the confirm that formed the team (u2), not u1.
    assert (await h.confirm("t1", "u1", "o1"))[:2] == [TeamCode.EXISTING, 0]
    assert (await h.confirm("t1", "u2", "o2"))[:2] == [TeamCode.EXISTING, 1]
    assert code(await h.confirm("t1", "u3", "o3")) is TeamCode.TEAM_FORMED
    records = await h.records()
    assert [r["type"] for r in records] == [
        "team.opened",
        "team.member_joined",
        "team.member_joined",
        "team.formed",
    ]
    assert records[-1]["members"] == "L|oL,u1|o1,u2|o2"
    assert not await h.redis.exists(h.keys.team_locks(AID, "t1"))


async def test_confirm_after_lock_expired_is_refused(h: Harness) -> None:
    await h.open("t1")
    await h.lock("t1", "u1")
    h.shift_ms += TTL_MS
    assert code(await h.confirm("t1", "u1", "o1")) is TeamCode.LOCK_REQUIRED


async def test_deadline_fails_the_team_once(h: Harness) -> None:
    await h.open("t1", "L", "oL")
    await h.lock("t1", "u1")
    await h.confirm("t1", "u1", "o1")
    await h.lock("t1", "u2")  # expires 50 s before the deadline
    h.shift_ms += DEADLINE_MS - 5_000
    await h.lock("t1", "u4")  # still live at the deadline
    h.shift_ms += 5_000
    assert code(await h.lock("t1", "u3")) is TeamCode.TEAM_FAILED
    assert code(await h.confirm("t1", "u2", "o2")) is TeamCode.TEAM_FAILED
    assert code(await h.read("t1")) is TeamCode.OK
    failed = [r for r in await h.records() if r["type"] == "team.failed"]
    assert len(failed) == 1 and failed[0]["members"] == "L|oL,u1|o1"
    # u2's lock expired before the deadline; u4's was live and ends with the team.
    expired = [r["user_id"] for r in await h.records() if r["type"] == "lock.expired"]
    assert expired == ["u2"]
    flat = (await h.read("t1"))[2]
    team = dict(zip(flat[0::2], flat[1::2], strict=True))
    assert team["status"] == "failed" and int(team["failed_ms"]) == int(team["deadline_ms"])


async def test_read_reports_state(h: Harness) -> None:
    assert code(await h.read("t1")) is TeamCode.TEAM_NOT_FOUND
    await h.open("t1")
    await h.lock("t1", "u1")
    reply = await h.read("t1")
    assert code(reply) is TeamCode.OK
    _code, now, team, members, locks = reply
    team = dict(zip(team[0::2], team[1::2], strict=True))
    assert team["status"] == "open" and team["member_count"] == "1"
    assert members[0] == "L" and members[1].startswith("1|")
    assert locks[0] == "u1" and int(now) >= int(float(locks[1]))


async def test_user_lock_read(h: Harness) -> None:
    await h.open("t1")
    _code, locked_at, expires_at, _released, _version = await h.lock("t1", "u1")
    assert await h.user_lock("u1") == [TeamCode.OK, "t1", str(locked_at), str(expires_at)]
    h.shift_ms += TTL_MS
    assert code(await h.user_lock("u1")) is TeamCode.NO_LOCK
    assert not await h.redis.exists(h.keys.user_lock(AID, "u1"))


async def test_user_lock_read_ends_with_the_team_at_its_deadline(h: Harness) -> None:
    await h.open("t1")
    h.shift_ms += DEADLINE_MS - 1_000  # the lock would outlive the deadline by far
    await h.lock("t1", "u1")
    assert code(await h.user_lock("u1")) is TeamCode.OK
    h.shift_ms += 1_000
    assert code(await h.user_lock("u1")) is TeamCode.NO_LOCK
    assert code(await h.lock("t1", "u2")) is TeamCode.TEAM_FAILED


async def test_user_lock_read_follows_unlock_confirm_and_switch(h: Harness) -> None:
    await h.open("t1")
    await h.open("t2")
    await h.lock("t1", "u1")
    await h.unlock("t1", "u1")
    assert code(await h.user_lock("u1")) is TeamCode.NO_LOCK
    await h.lock("t1", "u2")
    await h.confirm("t1", "u2", "o2")
    assert code(await h.user_lock("u2")) is TeamCode.NO_LOCK
    await h.lock("t1", "u3")
    await h.lock("t2", "u3", other="t1")
    assert (await h.user_lock("u3"))[1] == "t2"


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
    assert (await h.sweep("t2"))[2] == "failed"
    assert await h.open_seats() == {}


async def test_a_lost_team_leaves_the_open_seat_index(h: Harness) -> None:
    await h.open("t1")
    await h.redis.delete(h.keys.team(AID, "t1"), h.keys.team_members(AID, "t1"))
    assert list(await indexed_open_seats(h.redis, h.keys, AID)) == ["t1"]  # until noticed
    assert code(await h.sweep("t1")) is TeamCode.TEAM_NOT_FOUND
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
    args = [AID, "t1", h.shift_ms, "L", "o-L", 3, TTL_MS, now - 5_000, now + DEADLINE_MS]
    keys = h._keys("t1")
    restore = [*args, RETENTION_MS, 7, 0, 0, 0, *members]  # 6 changes recorded before the loss
    assert await h._call("team_restore", keys, restore) == [TeamCode.OK]
    again = [*args, RETENTION_MS, 1, 0, 0, 0, "x", "1|1|"]
    assert await h._call("team_restore", keys, again) == [TeamCode.EXISTING]
    assert await h.redis.hget(h.keys.team(AID, "t1"), "member_count") == "2"
    assert await h.redis.hget(h.keys.team(AID, "t1"), "version") == "7"
    assert await h.record_types() == []  # nothing new happened: nothing to record
    assert await h.redis.zscore(h.keys.deadline_index(AID), "t1") == now + DEADLINE_MS
    assert await h.open_seats() == {"t1": seat_score(2, now - 5_000)}
    assert (await h.lock("t1", "m2"))[0] == TeamCode.OK
    assert (await h.lock("t1", "m3"))[0] == TeamCode.TEAM_FULL
    assert (await h.confirm("t1", "m2", "o-2"))[:2] == [TeamCode.OK, 1]  # the third seat
    joined = [r for r in await h.records() if r["type"] == "team.member_joined"]
    assert joined[0]["seq"] == "3"


async def test_scripts_survive_script_flush(h: Harness) -> None:
    await h.open("t1")
    await h.redis.script_flush()
    assert not any(await h.redis.script_exists(*[s.sha for s in h.scripts._scripts.values()]))
    assert code(await h.lock("t1", "u1")) is TeamCode.OK
    assert code(await h.read("t1")) is TeamCode.OK


async def test_every_key_but_the_global_indexes_shares_the_activity_slot(h: Harness) -> None:
    await h.open("t1")
    await h.lock("t1", "u1")
    keys = set(await h.redis.keys("*"))
    indexes = {h.keys.pending_activities(), h.keys.due_locks(), h.keys.due_deadlines()}
    assert indexes <= keys  # the documented exception (docs/architecture.md, for Cluster)
    tags = {key[key.index("{") + 1 : key.index("}")] for key in keys - indexes}
    assert tags == {f"a:{AID}"}


def test_lua_codes_mirror_the_python_enum() -> None:
    import re

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
    first = await h.lock("t1", "u1")
    assert await h.redis.zscore(lock_index, "t1") == int(first[2])  # its lock's expiry
    h.shift_ms += 5
    second = await h.lock("t1", "u2")
    assert await h.redis.zscore(lock_index, "t1") == int(first[2])  # still the earliest
    await h.unlock("t1", "u1")
    assert await h.redis.zscore(lock_index, "t1") == int(second[2])  # now u2's
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
    keys = h._keys("t1")
    await h.open("t1")
    await h.lock("t1", "u1")
    args = [AID, "t1"]

    async def sweep() -> list[Any]:
        return list(await h.scripts.call("team_sweep", keys, [*args, h.shift_ms]))

    assert await sweep() == [TeamCode.OK, 0, "open", 0]
    h.shift_ms += TTL_MS
    assert await sweep() == [TeamCode.OK, 1, "open", 0]
    assert await h.redis.zscore(h.keys.lock_index(AID), "t1") is None
    assert await sweep() == [TeamCode.OK, 0, "open", 0]
    h.shift_ms += DEADLINE_MS
    assert await sweep() == [TeamCode.OK, 0, "failed", 1]  # this call failed it
    assert await sweep() == [TeamCode.OK, 0, "failed", 0]
    assert await h.redis.zscore(h.keys.deadline_index(AID), "t1") is None
    assert await h.record_types() == ["team.opened", "lock.expired", "team.failed"]
    # a team Redis no longer has leaves the indexes too
    await h.redis.zadd(h.keys.deadline_index(AID), {"ghost": 1})
    ghost = h._keys("ghost")
    assert await h.scripts.call("team_sweep", ghost, [AID, "ghost", 0]) == [TeamCode.TEAM_NOT_FOUND]
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
    first = await h.lock("t1", "u1")
    assert await h.redis.zscore(due_locks, AID) == int(first[2])
    h.shift_ms += 5
    await h.open("t2")
    second = await h.lock("t2", "u2")
    assert await h.redis.zscore(due_locks, AID) == int(first[2])  # the earlier one stays
    await h.unlock("t1", "u1")
    # a lower bound until a sweep sets it right: then the earliest lock left, or nothing
    assert await h.redis.zscore(due_locks, AID) == int(first[2])
    reindex = [h.keys.lock_index(AID), due_locks]
    assert await h.scripts.call("activity_reindex", reindex, [AID]) == [1, int(second[2])]
    assert await h.redis.zscore(due_locks, AID) == int(second[2])
    await h.unlock("t2", "u2")
    assert await h.scripts.call("activity_reindex", reindex, [AID]) == [0]
    assert await h.redis.zscore(due_locks, AID) is None
    await h.redis.zrem(due_deadlines, AID)  # lost: the repair's re-index puts it back
    reindex = [h.keys.deadline_index(AID), due_deadlines]
    assert await h.scripts.call("activity_reindex", reindex, [AID]) == [1, deadline]
    assert await h.redis.zscore(due_deadlines, AID) == deadline


async def test_release_takes_the_activity_out_of_the_due_indexes(h: Harness) -> None:
    release = h.keys.activity_release_keys(AID)
    await h.open("t1")
    assert await h.scripts.call("activity_release", release, [AID]) == [0]  # a team is open
    await h.redis.delete(h.keys.deadline_index(AID))  # as if its last team had ended
    assert await h.scripts.call("activity_release", release, [AID]) == [1]
    assert not await h.redis.exists(h.keys.activity(AID), h.keys.due_deadlines())
