"""Each team script called directly (no service), on fakeredis and on a real redis-server."""

from __future__ import annotations

import re
from typing import Any

import pytest

from groupbuy.locks import codec as team_codec
from groupbuy.locks import scripts as contracts
from groupbuy.locks.codec import SEAT_WEIGHT, seat_score
from groupbuy.locks.codes import TeamCode
from groupbuy.storage.keys import Keys
from groupbuy.storage.scripts import Scripts, script_names, script_source
from groupbuy.storage.typedrecords import record_keys
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

    async def team(
        self, contract: Any, tid: str, more: list[Any] | None = None, **named: Any
    ) -> list[Any]:
        """A script naming a team: its keys and arguments by name, in the contract's order."""
        keys = {k: v for k, v in named.items() if k in contract.key_names}
        args = {
            "activity_id": AID,
            "team_id": tid,
            "shift_ms": self.shift_ms,
            "user_key_prefix": self.keys.user_key_prefix(AID),
            **{k: v for k, v in named.items() if k not in keys},
        }
        key_list = contract.key_list(
            self.keys.team_keys(AID, tid), self.keys.activity_keys(AID), **keys
        )
        return await self._call(contract.name, key_list, contract.arg_list(args, more or []))

    async def open(self, tid: str, leader: str = "L", order: str = "") -> list[Any]:
        return await self.team(
            contracts.TEAM_OPEN,
            tid,
            activity_hash=self.keys.activity(AID),
            blocklist=self.keys.blocked_users(),
            leader_id=leader,
            leader_order_id=order,
            retention_ms=RETENTION_MS,
        )

    async def lock(self, tid: str, user: str, other: str = "") -> list[Any]:
        others: dict[str, Any] = {}
        if other:
            others = {
                "other_hash": self.keys.team(AID, other),
                "other_locks": self.keys.team_locks(AID, other),
            }
        return await self.team(
            contracts.TEAM_LOCK,
            tid,
            user_lock=self.keys.user_lock(AID, user),
            blocklist=self.keys.blocked_users(),
            user_id=user,
            other_team_id=other,
            **others,
        )

    async def unlock(self, tid: str, user: str) -> list[Any]:
        return await self.team(
            contracts.TEAM_UNLOCK, tid, user_lock=self.keys.user_lock(AID, user), user_id=user
        )

    async def confirm(self, tid: str, user: str, order: str) -> list[Any]:
        return await self.team(
            contracts.TEAM_CONFIRM,
            tid,
            user_lock=self.keys.user_lock(AID, user),
            blocklist=self.keys.blocked_users(),
            user_id=user,
            order_id=order,
        )

    def _pick_args(self, cursor: tuple[Any, str], candidates: int, **rest: Any) -> dict[str, Any]:
        return {
            "activity_id": AID,
            "shift_ms": self.shift_ms,
            "team_key_prefix": self.keys.team_key_prefix(AID),
            "members_suffix": self.keys.members_suffix,
            "locks_suffix": self.keys.locks_suffix,
            "user_key_prefix": self.keys.user_key_prefix(AID),
            "candidates": candidates,
            "cursor_score": cursor[0],
            "cursor_team_id": cursor[1],
            **rest,
        }

    async def join(
        self, user: str, cursor: tuple[Any, str] = ("", ""), candidates: int = 20
    ) -> list[Any]:
        join = contracts.TEAM_JOIN
        keys = join.key_list(
            self.keys.activity_keys(AID),
            activity_hash=self.keys.activity(AID),
            user_lock=self.keys.user_lock(AID, user),
            blocklist=self.keys.blocked_users(),
        )
        args = join.arg_list(self._pick_args(cursor, candidates, user_id=user))
        return await self._call(join.name, keys, args)

    async def page(
        self, limit: int, cursor: tuple[Any, str] = ("", ""), candidates: int = 20
    ) -> list[Any]:
        page = contracts.TEAM_LIST
        keys = page.key_list(self.keys.activity_keys(AID), activity_hash=self.keys.activity(AID))
        args = page.arg_list(self._pick_args(cursor, candidates, page_size=limit))
        return await self._call(page.name, keys, args)

    async def sweep(self, tid: str) -> list[Any]:
        return await self.team(contracts.TEAM_SWEEP, tid)

    async def created_ms(self, tid: str) -> int:
        return int(await self.redis.hget(self.keys.team(AID, tid), "created_ms"))

    async def open_seats(self) -> dict[str, int]:
        """The open-seat index, checked against the teams' own keys first."""
        indexed = await indexed_open_seats(self.redis, self.keys, AID)
        assert indexed == await recomputed_open_seats(self.redis, self.keys, AID)
        return indexed

    async def read(self, tid: str) -> list[Any]:
        return await self.team(contracts.TEAM_READ, tid)

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
        # Key and argument order: the contract (docs/scripts.md), named in `local` lines.
        assert "-- KEYS and ARGV: docs/scripts.md" in body, name
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


async def test_a_blocked_user_is_refused_before_any_write(h: Harness) -> None:
    await h.open("t1")
    assert code(await h.lock("t1", "payer")) is TeamCode.OK
    await h.redis.hset(h.keys.blocked_users(), mapping={"bad": "1|", "payer": "1|why"})
    team = h.keys.team_keys(AID, "t1")
    team_keys = [team.hash, team.members, team.locks]
    before = [await h.redis.dump(key) for key in team_keys]
    records = await h.record_types()

    assert code(await h.lock("t1", "bad")) is TeamCode.USER_BLOCKED
    assert code(await h.join("bad")) is TeamCode.USER_BLOCKED
    assert code(await h.open("t2", leader="bad")) is TeamCode.USER_BLOCKED
    assert code(await h.confirm("t1", "payer", "o1")) is TeamCode.USER_BLOCKED
    # A lock held from before the block is still answered, unchanged.
    assert code(await h.lock("t1", "payer")) is TeamCode.EXISTING
    assert [await h.redis.dump(key) for key in team_keys] == before
    assert await h.record_types() == records
    assert not await h.redis.exists(h.keys.team(AID, "t2"))
    assert not await h.redis.exists(h.keys.user_lock(AID, "bad"))

    await h.redis.hdel(h.keys.blocked_users(), "bad", "payer")
    assert code(await h.lock("t1", "bad")) is TeamCode.OK
    assert code(await h.confirm("t1", "payer", "o1")) is TeamCode.OK


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
    # The read writes nothing: the stale key goes by the PX its lock set.
    assert 0 < await h.redis.pttl(h.keys.user_lock(AID, "u1")) <= TTL_MS


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
    restore = contracts.TEAM_RESTORE
    # 6 changes recorded before the loss
    assert await h.team(restore, "t1", members, version=7, **args) == [TeamCode.OK]
    again = await h.team(restore, "t1", ["x", "1|1|"], version=1, **args)
    assert again == [TeamCode.EXISTING]
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
    assert code(await h.join("u2")) is TeamCode.OK
    assert code(await h.page(10)) is TeamCode.OK


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
    await h.open("t1")
    await h.lock("t1", "u1")

    async def sweep() -> list[Any]:
        return list(await h.sweep("t1"))

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
    h.shift_ms = 0
    assert await h.sweep("ghost") == [TeamCode.TEAM_NOT_FOUND]
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
    release = contracts.ACTIVITY_RELEASE.key_list(
        h.keys.activity_keys(AID), activity_hash=h.keys.activity(AID)
    )
    await h.open("t1")
    assert await h.scripts.call("activity_release", release, [AID]) == [0]  # a team is open
    await h.redis.delete(h.keys.deadline_index(AID))  # as if its last team had ended
    assert await h.scripts.call("activity_release", release, [AID]) == [1]
    assert not await h.redis.exists(h.keys.activity(AID), h.keys.due_deadlines())


# -- team_join and team_list: scripts that pick a team -------------------------------


async def restore(
    h: Harness, tid: str, created_ms: int, *members: str, teams_limit: int = 0
) -> None:
    """A team with these members (the first leads) and this created_ms, as team_restore
    rebuilds one: the way to give several teams one created_ms."""
    recorded: list[Any] = []
    for seq, user in enumerate(members, start=1):
        recorded += [user, f"{seq}|{created_ms}|"]
    restored = await h.team(
        contracts.TEAM_RESTORE,
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
    assert restored == [TeamCode.OK]


async def join_until_answered(h: Harness, user: str, candidates: int) -> list[list[Any]]:
    """Every reply of one join, following LOOK_FURTHER as the service does."""
    replies = [await h.join(user, candidates=candidates)]
    while code(replies[-1]) is TeamCode.LOOK_FURTHER:
        cursor = (replies[-1][1], replies[-1][2])
        replies.append(await h.join(user, cursor, candidates))
    return replies


async def test_join_takes_the_team_closest_to_forming_then_the_oldest(h: Harness) -> None:
    for tid in ("t1", "t2", "t3"):
        await h.open(tid, f"L{tid}")
        h.shift_ms += 1
    await h.lock("t2", "u1")
    joined = await h.join("a")  # t2 has the most seats taken
    assert joined[:2] == [TeamCode.OK, "t2"] and int(joined[3]) - int(joined[2]) == TTL_MS
    assert joined[4] == 3  # t2's version: opened, u1's lock, this one (as team_lock's)
    assert await h.redis.zscore(h.keys.team_locks(AID, "t2"), "a") == int(joined[2])
    assert (await h.redis.get(h.keys.user_lock(AID, "a"))).startswith("t2|")
    assert (await h.join("b"))[:2] == [TeamCode.OK, "t1"]  # t2 is full; t1 is the oldest
    assert (await h.join("c"))[:2] == [TeamCode.OK, "t1"]
    assert (await h.join("d"))[:2] == [TeamCode.OK, "t3"]
    # One lock per user and activity: a live lock anywhere is the answer, unchanged.
    assert await h.join("a") == [TeamCode.EXISTING, "t2", joined[2], joined[3], 3]
    await h.lock("t3", "b", other="t1")
    assert (await h.join("b"))[:2] == [TeamCode.EXISTING, "t3"]
    assert await h.record_types() == ["team.opened"] * 3  # locks live only in Redis


async def test_join_never_places_a_member_in_their_team_again(h: Harness) -> None:
    await h.open("t1", "L1")
    h.shift_ms += 1
    await h.open("t2", "L2")
    await h.lock("t1", "u1")
    await h.confirm("t1", "u1", "o1")
    assert (await h.join("u1"))[:2] == [TeamCode.OK, "t2"]
    await h.unlock("t2", "u1")
    x = await h.lock("t2", "x")
    await h.lock("t2", "y")
    # t1 has a seat, but u1 is a member there; t2 is full until x's lock expires.
    assert await h.join("u1") == [TeamCode.NO_TEAM_AVAILABLE, x[2]]
    assert (await h.join("L2"))[:2] == [TeamCode.OK, "t1"]


async def test_no_team_available_says_when_the_earliest_lock_expires(h: Harness) -> None:
    assert await h.join("u1") == [TeamCode.NO_TEAM_AVAILABLE, ""]  # no team at all
    await h.open("t1", "L1")
    first = await h.lock("t1", "a")
    h.shift_ms += 1_000
    await h.lock("t1", "b")
    assert await h.join("u1") == [TeamCode.NO_TEAM_AVAILABLE, first[2]]
    await h.redis.delete(h.keys.activity(AID))
    assert await h.join("u1") == [TeamCode.ACTIVITY_NOT_FOUND]


async def test_join_takes_a_seat_freed_by_a_lock_that_expired_unswept(h: Harness) -> None:
    await h.open("t1", "L1")
    h.shift_ms += 1
    await h.open("t2", "L2")
    for user in ("a", "b"):
        await h.lock("t1", user)
    h.shift_ms += 1_000
    for user in ("c", "d"):
        await h.lock("t2", user)
    assert code(await h.join("u1")) is TeamCode.NO_TEAM_AVAILABLE
    h.shift_ms += TTL_MS - 1_000  # t1's locks expired; nobody swept them; t2's still hold
    assert await h.open_seats() == {}  # the stored seats still count them
    assert (await h.join("u1"))[:2] == [TeamCode.OK, "t1"]
    assert (await h.join("u2"))[:2] == [TeamCode.OK, "t1"]
    assert code(await h.join("u3")) is TeamCode.NO_TEAM_AVAILABLE
    expired = [
        (r["team_id"], r["user_id"]) for r in await h.records() if r["type"] == "lock.expired"
    ]
    assert expired == [("t1", "a"), ("t1", "b")]


async def test_join_fails_a_team_past_its_deadline_and_never_locks_there(h: Harness) -> None:
    await h.open("t1", "L1", "o1")
    h.shift_ms += DEADLINE_MS - 1
    await h.open("t2", "L2")  # younger: t1 stays first in the index
    h.shift_ms += 1
    assert (await h.join("u1"))[:2] == [TeamCode.OK, "t2"]
    failed = [r for r in await h.records() if r["type"] == "team.failed"]
    assert [(r["team_id"], r["members"]) for r in failed] == [("t1", "L1|o1")]
    assert await h.redis.hget(h.keys.team(AID, "t1"), "status") == "failed"


async def test_join_looks_further_in_bounded_steps(h: Harness) -> None:
    now = int((await h.redis.time())[0]) * 1000
    for tid in ("t1", "t2", "t3"):
        await restore(h, tid, now, f"L{tid}", "u")  # u is a member of the first three
    await restore(h, "t4", now + 1, "L4")
    replies = await join_until_answered(h, "u", candidates=2)
    assert [code(r) for r in replies] == [TeamCode.LOOK_FURTHER, TeamCode.OK]
    assert replies[0][1:] == [str(seat_score(2, now)), "t2"] and replies[1][1] == "t4"
    assert code(await h.join("u", (replies[0][1], "t2"), candidates=2)) is TeamCode.EXISTING


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
    assert [r[:3] for r in replies[:2]] == [
        [TeamCode.LOOK_FURTHER, "", ""],  # time applied to two of three teams: again
        [TeamCode.LOOK_FURTHER, str(seat_score(2, now)), "t2"],
    ]
    assert replies[2][:2] == [TeamCode.OK, "t3"] and len(replies) == 3


async def test_join_keeps_the_activity_limit_on_teams_per_user(h: Harness) -> None:
    now = int((await h.redis.time())[0]) * 1000
    await restore(h, "t1", now, "L1", teams_limit=1)
    await h.redis.set(h.keys.user_counter(AID, "u", "teams"), 1)  # u belongs to a team
    assert await h.join("u") == [TeamCode.USER_LIMIT_REACHED, 1, 1, "teams_per_user"]
    assert await h.redis.zcard(h.keys.team_locks(AID, "t1")) == 0
    assert (await h.join("v"))[:2] == [TeamCode.OK, "t1"]


async def test_the_keys_join_builds_are_the_keys_keys_builds(h: Harness) -> None:
    await h.open("t-1", "L1")
    await h.open("t_2", "L2")
    await h.lock("t-1", "a")
    h.shift_ms += TTL_MS  # a's lock expires unswept: join drops it through built keys
    for user in ("b", "c", "d", "e"):
        assert code(await h.join(user)) is TeamCode.OK
    assert code(await h.page(10)) is TeamCode.OK
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


def page_ids(reply: list[Any]) -> list[str]:
    assert code(reply) is TeamCode.OK, reply
    return [entry[0] for entry in reply[3]]


async def test_team_list_pages_in_join_order_and_resumes_after_a_team_left(h: Harness) -> None:
    now = int((await h.redis.time())[0]) * 1000
    # One score for all (same members, same created_ms): Redis orders them by id, byte by
    # byte, whatever the server's locale: a-1 < a1 < aZ < a_1.
    for tid in ("a_1", "aZ", "a1", "a-1"):
        await restore(h, tid, now, f"L{tid}")
    await restore(h, "b", now + 5, "Lb", "m")  # two seats taken: first
    first = await h.page(3)
    assert page_ids(first) == ["b", "a-1", "a1"]
    assert first[1:3] == [str(seat_score(1, now)), "a1"]
    team, members, locks = first[3][0][1:]
    assert dict(zip(team[0::2], team[1::2], strict=True))["member_count"] == "2"
    assert members[0::2] == ["Lb", "m"] and locks == []
    await h.lock("a1", "x")
    await h.lock("a1", "y")  # full: a1 leaves the index; the page after it still follows
    second = await h.page(3, (first[1], first[2]))
    assert page_ids(second) == ["aZ", "a_1"] and second[1:3] == ["", ""]
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

    for fields in await h.records():
        record = team_codec.parse_team_record(fields)
        required, optional = record_keys(team_codec.TEAM_RECORDS[fields["type"]])
        assert set(fields) == set(record), fields  # no field the type does not have
        # Every field of the type, but a confirm's team.formed has no virtual seats.
        unused = {"virtual_seats"} if fields["type"] == "team.formed" else set()
        assert (required | optional) - set(fields) <= unused, fields
    types = {fields["type"] for fields in await h.records()}
    assert types == set(team_codec.TEAM_RECORDS)
