"""The calling context of the team scripts (TeamScripts: the script caller, the key layout,
the clock, the key groups and arguments every team script starts with), and typed wrappers
of the scripts no one operation owns.

Their specs (groupbuy/locks/specs.py, exported here too) are the only place that
knows these scripts' KEYS, ARGV and replies. A wrapper takes named key groups and arguments
and answers the reply read by its spec: its code and its fields by name. An operation's own
script is called from its module (team_lock: groupbuy.locks.lock).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.specs import (
    ACTIVITY_COUNTS,
    ACTIVITY_COUNTS_PUT,
    ACTIVITY_REINDEX,
    ACTIVITY_RELEASE,
    PICK_ARGV,
    PICK_KEYS,
    TEAM_ARGV,
    TEAM_KEYS,
    TEAM_LIST,
    TEAM_OPEN,
    TEAM_READ,
    TEAM_RESTORE,
    TEAM_SWEEP,
    USER_LOCK_READ,
)
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import ActivityKeys, Keys, TeamKeys
from groupbuy.storage.specs import Reply, ScriptCaller, Verdict

__all__ = [
    "ACTIVITY_COUNTS",
    "ACTIVITY_COUNTS_PUT",
    "ACTIVITY_REINDEX",
    "ACTIVITY_RELEASE",
    "PICK_ARGV",
    "PICK_KEYS",
    "TEAM_ARGV",
    "TEAM_KEYS",
    "TEAM_LIST",
    "TEAM_OPEN",
    "TEAM_READ",
    "TEAM_RESTORE",
    "TEAM_SWEEP",
    "USER_LOCK_READ",
    "TeamReply",
    "TeamScripts",
]

TeamReply = Reply[TeamCode]


class TeamScripts:
    """The team scripts of one registry, called with named keys and arguments."""

    def __init__(self, scripts: ScriptCaller, keys: Keys, clock: RedisClock) -> None:
        self.caller = scripts
        self.keys = keys
        self.clock = clock

    def team(self, activity_id: str, team_id: str) -> tuple[TeamKeys, ActivityKeys]:
        """The key groups every script naming a team starts with (TEAM_KEYS)."""
        return self.keys.team_keys(activity_id, team_id), self.keys.activity_keys(activity_id)

    def team_args(self, activity_id: str, team_id: str, **rest: Any) -> dict[str, Any]:
        """TEAM_ARGV by name, then `rest`: the arguments of a script naming a team."""
        return {
            "activity_id": activity_id,
            "team_id": team_id,
            "shift_ms": self.clock.shift_ms,
            "user_key_prefix": self.keys.user_key_prefix(activity_id),
            **rest,
        }

    async def open(
        self, activity_id: str, team_id: str, leader_id: str, order_id: str, retention_ms: int
    ) -> TeamReply:
        """team_open."""
        keys = TEAM_OPEN.key_list(*self.team(activity_id, team_id))
        args = self.team_args(
            activity_id,
            team_id,
            leader_id=leader_id,
            leader_order_id=order_id,
            retention_ms=retention_ms,
        )
        return await TEAM_OPEN.run(self.caller, keys, args)

    async def read(self, activity_id: str, team_id: str) -> TeamReply:
        """team_read."""
        keys = TEAM_READ.key_list(*self.team(activity_id, team_id))
        return await TEAM_READ.run(self.caller, keys, self.team_args(activity_id, team_id))

    async def sweep(self, activity_id: str, team_id: str) -> TeamReply:
        """team_sweep."""
        keys = TEAM_SWEEP.key_list(*self.team(activity_id, team_id))
        return await TEAM_SWEEP.run(self.caller, keys, self.team_args(activity_id, team_id))

    async def restore(
        self, activity_id: str, team_id: str, members: Sequence[str], **fields: Any
    ) -> TeamReply:
        """team_restore; `fields` are the named ARGV after the common ones."""
        keys = TEAM_RESTORE.key_list(*self.team(activity_id, team_id))
        args = self.team_args(activity_id, team_id, **fields)
        return await TEAM_RESTORE.run(self.caller, keys, args, members)

    def pick_args(
        self, activity_id: str, candidates: int, cursor: Sequence[Any], **rest: Any
    ) -> dict[str, Any]:
        """PICK_ARGV by name, then `rest`: the arguments of a script picking among teams."""
        score, team_id = cursor
        return {
            "activity_id": activity_id,
            "shift_ms": self.clock.shift_ms,
            "team_key_prefix": self.keys.team_key_prefix(activity_id),
            "members_suffix": self.keys.members_suffix,
            "locks_suffix": self.keys.locks_suffix,
            "user_key_prefix": self.keys.user_key_prefix(activity_id),
            "candidates": candidates,
            "cursor_score": score,
            "cursor_team_id": team_id,
            **rest,
        }

    async def list(
        self,
        activity_id: str,
        page_size: int,
        candidates: int,
        cursor: Sequence[Any],
        full: bool = False,
    ) -> TeamReply:
        """team_list from `cursor`: teams with a free seat, or (`full`) full open teams."""
        keys = TEAM_LIST.key_list(self.keys.activity_keys(activity_id))
        args = self.pick_args(
            activity_id, candidates, cursor, page_size=page_size, full="1" if full else "0"
        )
        return await TEAM_LIST.run(self.caller, keys, args)

    async def user_lock(self, activity_id: str, user_id: str) -> TeamReply:
        """user_lock_read."""
        keys = USER_LOCK_READ.key_list(user_lock=self.keys.user_lock(activity_id, user_id))
        return await USER_LOCK_READ.run(self.caller, keys, {"shift_ms": self.clock.shift_ms})

    async def reindex(
        self, activity_id: str, team_index: str, due_index: str, also: str | None = None
    ) -> bool:
        """activity_reindex (`also`: a second index the activity is due by); whether the
        activity is still due."""
        more = {"also_index": also} if also else {}
        keys = ACTIVITY_REINDEX.key_list(team_index=team_index, due_index=due_index, **more)
        reply = await ACTIVITY_REINDEX.run(self.caller, keys, {"activity_id": activity_id})
        return reply.code is Verdict.YES

    async def release(self, activity_id: str) -> bool:
        """activity_release; whether the copy was dropped."""
        keys = ACTIVITY_RELEASE.key_list(self.keys.activity_keys(activity_id))
        reply = await ACTIVITY_RELEASE.run(self.caller, keys, {"activity_id": activity_id})
        return reply.code is Verdict.YES

    async def counts(self, activity_id: str, candidates: int) -> TeamReply:
        """activity_counts, applying time to at most `candidates` teams of each index."""
        keys = ACTIVITY_COUNTS.key_list(self.keys.activity_keys(activity_id))
        args = self.pick_args(activity_id, candidates, ("", ""))
        return await ACTIVITY_COUNTS.run(self.caller, keys, args)

    async def put_counts(self, activity_id: str, counts: Mapping[str, int]) -> TeamReply:
        """activity_counts_put: `counts` (SQL's) unless Redis has the activity's counts."""
        keys = ACTIVITY_COUNTS_PUT.key_list(activity_counts=self.keys.activity_counts(activity_id))
        return await ACTIVITY_COUNTS_PUT.run(self.caller, keys, counts)
