"""The team scripts called through their wrappers (TeamScripts), with the key layout the
service uses, at a clock shift a test moves: the harness of the tests in tests/lua/."""

from __future__ import annotations

from typing import Any

from groupbuy.locks import scripts as contracts
from groupbuy.locks.confirm import team_confirm
from groupbuy.locks.dissolve import team_dissolve
from groupbuy.locks.extend import team_extend
from groupbuy.locks.join import team_join
from groupbuy.locks.leave import team_leave
from groupbuy.locks.lock import team_lock
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.unlock import team_unlock
from groupbuy.locks.waitlist import expire_entries, waitlist_join, waitlist_leave, waitlist_read
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import Keys
from groupbuy.storage.specs import Scripts
from tests.support.seats import indexed_open_seats, recomputed_open_seats

AID = "act1"
TTL_MS = 10_000
DEADLINE_MS = 60_000
RETENTION_MS = 3_600_000


class Harness:
    """Calls the scripts through their wrappers (TeamScripts) with the key layout the service
    uses, at a controllable time shift."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.scripts = Scripts(redis)
        self.keys = Keys("t")
        self.clock = RedisClock()
        self.teams = TeamScripts(self.scripts, self.keys, self.clock)

    @property
    def shift_ms(self) -> int:
        """The scripts' clock shift: moving it lets time pass for them."""
        return self.clock.shift_ms

    @shift_ms.setter
    def shift_ms(self, value: int) -> None:
        self.clock.shift_ms = value

    async def activity(self, size: int = 3, **fields: int | str) -> None:
        """The activity's copy in Redis: its team size, TTLs and any other `fields`."""
        mapping = {"team_size": size, "lock_ttl_ms": TTL_MS, "team_deadline_ms": DEADLINE_MS}
        await self.redis.hset(self.keys.activity(AID), mapping={**mapping, **fields})

    async def open(self, tid: str, leader: str = "L", order: str = "") -> TeamReply:
        return await self.teams.open(AID, tid, leader, order, RETENTION_MS)

    async def lock(self, tid: str, user: str, other: str = "") -> TeamReply:
        return await team_lock(self.teams, AID, tid, user, other)

    async def unlock(self, tid: str, user: str) -> TeamReply:
        return await team_unlock(self.teams, AID, tid, user)

    async def confirm(self, tid: str, user: str, order: str) -> TeamReply:
        return await team_confirm(self.teams, AID, tid, user, order)

    async def leave(self, tid: str, user: str, order: str = "", reason: str = "") -> TeamReply:
        return await team_leave(self.teams, AID, tid, user, order, reason)

    async def dissolve(self, tid: str) -> TeamReply:
        return await team_dissolve(self.teams, AID, tid)

    async def extend(self, tid: str, user: str, hold_ms: int) -> TeamReply:
        return await team_extend(self.teams, AID, tid, user, hold_ms)

    async def join(
        self, user: str, cursor: tuple[Any, str] = ("", ""), candidates: int = 20
    ) -> TeamReply:
        return await team_join(self.teams, AID, user, candidates, cursor)

    async def page(
        self, limit: int, cursor: tuple[Any, str] = ("", ""), candidates: int = 20
    ) -> TeamReply:
        return await self.teams.list(AID, limit, candidates, cursor)

    async def queue(self, user: str, tid: str = "", force: bool = False) -> TeamReply:
        return await waitlist_join(self.teams, AID, tid, user, force)

    async def waiting(self, user: str) -> TeamReply:
        return await waitlist_read(self.teams, AID, user)

    async def unqueue(self, user: str) -> TeamReply:
        return await waitlist_leave(self.teams, AID, user)

    async def expire_entries(self, batch: int = 100) -> int:
        return await expire_entries(self.teams, AID, batch)

    async def sweep(self, tid: str) -> TeamReply:
        return await self.teams.sweep(AID, tid)

    async def restore(self, tid: str, members: list[str], **fields: Any) -> TeamReply:
        fields = {"departed": 0, "left_members": "", **fields}  # nobody left, unless said
        return await self.teams.restore(AID, tid, members, **fields)

    async def created_ms(self, tid: str) -> int:
        return int(await self.redis.hget(self.keys.team(AID, tid), "created_ms"))

    async def open_seats(self) -> dict[str, int]:
        """The open-seat index, checked against the teams' own keys first."""
        indexed = await indexed_open_seats(self.redis, self.keys, AID)
        assert indexed == await recomputed_open_seats(self.redis, self.keys, AID)
        return indexed

    async def read(self, tid: str) -> TeamReply:
        return await self.teams.read(AID, tid)

    async def read_raw(self, tid: str) -> list[Any]:
        """team_read's reply as the script answers it (the wire shape the parser reads)."""
        read = contracts.TEAM_READ
        keys = read.key_list(self.keys.team_keys(AID, tid), self.keys.activity_keys(AID))
        args = {
            "activity_id": AID,
            "team_id": tid,
            "shift_ms": self.shift_ms,
            "user_key_prefix": self.keys.user_key_prefix(AID),
        }
        return await read.call(self.scripts, keys, args)

    async def reindex(self, team_index: str, due_index: str) -> list[Any]:
        """activity_reindex's reply as the script answers it (`{1, earliest_ms}` or `{0}`)."""
        reindex = contracts.ACTIVITY_REINDEX
        keys = reindex.key_list(team_index=team_index, due_index=due_index)
        return await reindex.call(self.scripts, keys, {"activity_id": AID})

    async def user_lock(self, user: str) -> TeamReply:
        return await self.teams.user_lock(AID, user)

    async def records(self) -> list[dict[str, str]]:
        return [fields for _id, fields in await self.redis.xrange(self.keys.outbox(AID))]

    async def record_types(self) -> list[str]:
        return [r["type"] for r in await self.records()]
