"""Typed wrappers of the team_* and activity_* scripts and user_lock_read.

The contracts below are the only place that knows the order of these scripts' KEYS and
ARGV (docs/scripts.md is rendered from them; tests/lua/test_contracts.py checks the
`local` lines of the scripts against them). A wrapper takes named key groups and
arguments and answers the reply parsed (groupbuy/locks/replies.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from groupbuy.locks import replies
from groupbuy.locks.replies import (
    ConfirmReply,
    JoinReply,
    Listed,
    LockReply,
    OpenReply,
    Swept,
    TeamRead,
    TeamReply,
    Unlocked,
    UserLock,
)
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.contracts import ScriptCaller, ScriptContract, Slot, slots
from groupbuy.storage.keys import ActivityKeys, Keys, TeamKeys

_ACTIVITY_KEYS = slots(
    ("activity_outbox", "the activity's outbox stream"),
    ("activity_lock_index", "zset team_id -> when its earliest lock expires (ms)"),
    ("activity_deadlines", "zset team_id -> deadline ms (open teams only)"),
    ("activity_pending", "pending index: zset activity_id -> ms of its oldest outbox record"),
    ("activity_due_locks", "lock-due index: zset activity_id -> at most its earliest lock expiry"),
    (
        "activity_due_deadlines",
        "deadline-due index: zset activity_id -> at most its earliest deadline",
    ),
    ("activity_open_seats", "zset team_id -> seat score of each open team with a free seat"),
)
# The KEYS and ARGV every script naming a team starts with (lua/_team_keys.lua).
TEAM_KEYS = (
    *slots(
        ("team_hash", "the team's state hash"),
        ("team_members", "hash user -> 'seq|joined_at_ms|order_id'"),
        ("team_locks", "zset of seat locks: member user_id, score locked_at_ms"),
    ),
    *_ACTIVITY_KEYS,
)
TEAM_ARGV = slots(
    ("activity_id", "the activity"),
    ("team_id", "the team"),
    ("shift_ms", "clock shift in ms (0 in production)"),
    ("user_key_prefix", "what the activity's per-user keys start with (Keys.user_key_prefix)"),
)
# The KEYS and ARGV of the scripts that pick among an activity's teams (lua/_pick_keys.lua).
PICK_KEYS = (*_ACTIVITY_KEYS, Slot("activity_hash", "the activity's copy of its parameters"))
PICK_ARGV = slots(
    ("activity_id", "the activity"),
    ("shift_ms", "clock shift in ms (0 in production)"),
    ("team_key_prefix", "a team's hash key is this prefix then the team id"),
    ("members_suffix", "after a team's hash key: its members hash"),
    ("locks_suffix", "after a team's hash key: its locks zset"),
    ("user_key_prefix", "what the activity's per-user keys start with"),
    ("candidates", "most index entries each bounded pass looks at"),
    ("cursor_score", "seat score of the last entry seen before ('' to start at the top)"),
    ("cursor_team_id", "team id of the last entry seen before ('' to start at the top)"),
)
_USER_LOCK = (
    "user_lock",
    "the user's current lock: 'team_id|locked_at_ms|expires_at_ms|deadline_ms'",
)
_BLOCKLIST = ("blocklist", "blocked users hash (the copy of the activity's slot in a cluster)")
_TEAM_SNAPSHOT = "team...: the team hash, members hash and locks as three flat lists"

TEAM_OPEN = ScriptContract(
    "team_open",
    "Open a team whose leader is member 1, idempotently.",
    keys=(*TEAM_KEYS, *slots(("activity_hash", "the activity's parameters"), _BLOCKLIST)),
    argv=(
        *TEAM_ARGV,
        *slots(
            ("leader_id", "the leader (member 1)"),
            ("leader_order_id", "the leader's order ('' for none)"),
            ("retention_ms", "how long the keys outlive the deadline"),
        ),
    ),
    reply=(
        "`{OK, team...}` opened, `{EXISTING, team...}`, `{CONFLICT}`, `{ACTIVITY_NOT_FOUND}`, "
        f"`{{USER_LIMIT_REACHED, limit, current, name}}`, `{{USER_BLOCKED}}`; {_TEAM_SNAPSHOT}."
    ),
)
TEAM_LOCK = ScriptContract(
    "team_lock",
    "Hold one free seat of a team for a user, atomically.",
    keys=(
        *TEAM_KEYS,
        *slots(
            _USER_LOCK,
            _BLOCKLIST,
            ("other_hash", "hash of the team the caller believes the user holds a lock in"),
            ("other_locks", "locks zset of that team"),
        ),
    ),
    argv=(
        *TEAM_ARGV,
        *slots(("user_id", "the user"), ("other_team_id", "that other team's id, or ''")),
    ),
    optional_keys=("other_hash", "other_locks"),
    reply=(
        "`{OK, locked_at_ms, expires_at_ms, released_team_id or '', version}`, "
        "`{EXISTING, locked_at_ms, expires_at_ms, version}`, "
        "`{TEAM_FULL, earliest_locked_at_ms or '', next_unlock_ms or ''}`, "
        "`{SWITCH_NEEDED, team_id}`, `{ALREADY_MEMBER}`, `{TEAM_FORMED}`, `{TEAM_FAILED}`, "
        "`{TEAM_NOT_FOUND}`, `{USER_LIMIT_REACHED, limit, current, name}`, `{USER_BLOCKED}`."
    ),
)
TEAM_UNLOCK = ScriptContract(
    "team_unlock",
    "Release a user's seat lock on a team (idempotent).",
    keys=(*TEAM_KEYS, *slots(_USER_LOCK)),
    argv=(*TEAM_ARGV, *slots(("user_id", "the user"))),
    reply="`{OK, 1}` released a live lock, `{OK, 0}` there was none, `{TEAM_NOT_FOUND}`.",
)
TEAM_CONFIRM = ScriptContract(
    "team_confirm",
    "Payment succeeded: turn the user's unexpired lock into membership.",
    keys=(*TEAM_KEYS, *slots(_USER_LOCK, _BLOCKLIST)),
    argv=(*TEAM_ARGV, *slots(("user_id", "the user"), ("order_id", "the paid order"))),
    reply=(
        "`{OK, formed 0|1, team...}`, `{EXISTING, formed 0|1, team...}`, `{ALREADY_MEMBER}`, "
        "`{LOCK_REQUIRED}`, `{TEAM_FORMED}`, `{TEAM_FAILED}`, `{TEAM_NOT_FOUND}`, "
        f"`{{USER_LIMIT_REACHED, limit, current, name}}`, `{{USER_BLOCKED}}`; {_TEAM_SNAPSHOT}."
    ),
)
TEAM_READ = ScriptContract(
    "team_read",
    "A team's state after the lazy checks (deadline, expired locks).",
    keys=TEAM_KEYS,
    argv=TEAM_ARGV,
    reply=f"`{{OK, now_ms, team...}}` or `{{TEAM_NOT_FOUND}}`; {_TEAM_SNAPSHOT}.",
)
TEAM_SWEEP = ScriptContract(
    "team_sweep",
    "Apply what time did to one team (expired locks, a passed deadline).",
    keys=TEAM_KEYS,
    argv=TEAM_ARGV,
    reply="`{OK, locks expired now, status, 1 when this call ended it}` or `{TEAM_NOT_FOUND}`.",
)
TEAM_RESTORE = ScriptContract(
    "team_restore",
    "Rebuild an open team that Redis lost, from its SQL record, once.",
    keys=TEAM_KEYS,
    argv=(
        *TEAM_ARGV,
        *slots(
            ("leader_id", "the leader"),
            ("leader_order_id", "the leader's order ('' for none)"),
            ("size", "seats"),
            ("lock_ttl_ms", "how long a lock lasts"),
            ("created_ms", "when the team opened"),
            ("deadline_ms", "the team's deadline"),
            ("retention_ms", "how long the keys outlive the deadline"),
            ("version", "after every recorded change, plus this one"),
            ("virtual_min", "virtual completion threshold (0: none)"),
            ("teams_limit", "teams per user (0: none)"),
            ("led_limit", "open teams per leader (0: none)"),
        ),
    ),
    more_argv=Slot("members", "pairs: user_id, 'seq|joined_at_ms|order_id'"),
    reply="`{OK}` rebuilt (without its locks), `{EXISTING}` Redis has it.",
)
TEAM_JOIN = ScriptContract(
    "team_join",
    "Lock a free seat in the open team closest to forming (自动拼团).",
    keys=(*PICK_KEYS, *slots(_USER_LOCK, _BLOCKLIST)),
    argv=(*PICK_ARGV, Slot("user_id", "the user")),
    reply=(
        "`{OK, team_id, locked_at_ms, expires_at_ms, version}`, `{EXISTING, ...same}`, "
        "`{NO_TEAM_AVAILABLE, next_unlock_ms or ''}`, `{LOOK_FURTHER, score, team_id}`, "
        "`{USER_LIMIT_REACHED, limit, current, name}`, `{ACTIVITY_NOT_FOUND}`, `{USER_BLOCKED}`."
    ),
)
TEAM_LIST = ScriptContract(
    "team_list",
    "A page of the activity's open teams with a free seat, closest to forming first.",
    keys=PICK_KEYS,
    argv=(*PICK_ARGV, Slot("page_size", "most teams in the page")),
    reply=(
        "`{OK, cursor score or '', cursor team_id or '', {{team_id, team...}, ...}}` or "
        f"`{{ACTIVITY_NOT_FOUND}}`; {_TEAM_SNAPSHOT}."
    ),
)
USER_LOCK_READ = ScriptContract(
    "user_lock_read",
    "The user's live lock in an activity, from their current-lock key alone.",
    keys=slots(_USER_LOCK),
    argv=slots(("shift_ms", "clock shift in ms (0 in production)")),
    reply="`{OK, team_id, locked_at_ms, expires_at_ms}` or `{NO_LOCK}`.",
)
ACTIVITY_REINDEX = ScriptContract(
    "activity_reindex",
    "Set an activity's entry in a due index to the earliest entry of its own index.",
    keys=slots(
        ("team_index", "the activity's lock index or deadline index"),
        ("due_index", "the matching due index (of the activity's slot in a cluster)"),
    ),
    argv=slots(("activity_id", "the activity")),
    reply="`{1, earliest_ms}` indexed, `{0}` nothing due any more.",
)
ACTIVITY_RELEASE = ScriptContract(
    "activity_release",
    "Drop an activity's Redis copy once no team of it is live (SQL keeps it).",
    keys=slots(
        ("activity_hash", "the activity's copy of its parameters"),
        ("activity_lock_index", "zset team_id -> when its earliest lock expires"),
        ("activity_deadlines", "zset team_id -> deadline ms"),
        ("activity_due_locks", "lock-due index (of its slot in a cluster)"),
        ("activity_due_deadlines", "deadline-due index (of its slot in a cluster)"),
    ),
    argv=slots(("activity_id", "the activity")),
    reply="`{1}` released, `{0}` a team is still open (nothing changed).",
)
CONTRACTS = (
    TEAM_OPEN,
    TEAM_LOCK,
    TEAM_UNLOCK,
    TEAM_CONFIRM,
    TEAM_READ,
    TEAM_SWEEP,
    TEAM_RESTORE,
    TEAM_JOIN,
    TEAM_LIST,
    USER_LOCK_READ,
    ACTIVITY_REINDEX,
    ACTIVITY_RELEASE,
)


class TeamScripts:
    """The team scripts of one registry, called with named keys and arguments."""

    def __init__(self, scripts: ScriptCaller, keys: Keys, clock: RedisClock) -> None:
        self._scripts = scripts
        self._keys = keys
        self._clock = clock

    def _team(self, activity_id: str, team_id: str) -> tuple[TeamKeys, ActivityKeys]:
        return self._keys.team_keys(activity_id, team_id), self._keys.activity_keys(activity_id)

    def _team_args(self, activity_id: str, team_id: str, **rest: Any) -> dict[str, Any]:
        return {
            "activity_id": activity_id,
            "team_id": team_id,
            "shift_ms": self._clock.shift_ms,
            "user_key_prefix": self._keys.user_key_prefix(activity_id),
            **rest,
        }

    async def open(
        self, activity_id: str, team_id: str, leader_id: str, order_id: str, retention_ms: int
    ) -> OpenReply:
        """team_open."""
        keys = TEAM_OPEN.key_list(
            *self._team(activity_id, team_id),
            activity_hash=self._keys.activity(activity_id),
            blocklist=self._keys.activity_blocklist(activity_id),
        )
        args = self._team_args(
            activity_id,
            team_id,
            leader_id=leader_id,
            leader_order_id=order_id,
            retention_ms=retention_ms,
        )
        reply = await TEAM_OPEN.call(self._scripts, keys, args)
        return replies.parse_open(reply, activity_id, team_id)

    async def lock(
        self, activity_id: str, team_id: str, user_id: str, other_team_id: str
    ) -> LockReply:
        """team_lock; `other_team_id` ('' for none) is the team the user may hold a lock in."""
        other: dict[str, str] = {}
        if other_team_id:
            other_keys = self._keys.team_keys(activity_id, other_team_id)
            other = {"other_hash": other_keys.hash, "other_locks": other_keys.locks}
        keys = TEAM_LOCK.key_list(
            *self._team(activity_id, team_id),
            user_lock=self._keys.user_lock(activity_id, user_id),
            blocklist=self._keys.activity_blocklist(activity_id),
            **other,
        )
        args = self._team_args(activity_id, team_id, user_id=user_id, other_team_id=other_team_id)
        return replies.parse_lock(await TEAM_LOCK.call(self._scripts, keys, args), team_id)

    async def unlock(self, activity_id: str, team_id: str, user_id: str) -> Unlocked | TeamReply:
        """team_unlock."""
        keys = TEAM_UNLOCK.key_list(
            *self._team(activity_id, team_id), user_lock=self._keys.user_lock(activity_id, user_id)
        )
        args = self._team_args(activity_id, team_id, user_id=user_id)
        return replies.parse_unlock(await TEAM_UNLOCK.call(self._scripts, keys, args))

    async def confirm(
        self, activity_id: str, team_id: str, user_id: str, order_id: str
    ) -> ConfirmReply:
        """team_confirm."""
        keys = TEAM_CONFIRM.key_list(
            *self._team(activity_id, team_id),
            user_lock=self._keys.user_lock(activity_id, user_id),
            blocklist=self._keys.activity_blocklist(activity_id),
        )
        args = self._team_args(activity_id, team_id, user_id=user_id, order_id=order_id)
        reply = await TEAM_CONFIRM.call(self._scripts, keys, args)
        return replies.parse_confirm(reply, activity_id, team_id)

    async def read(self, activity_id: str, team_id: str) -> TeamRead | TeamReply:
        """team_read."""
        keys = TEAM_READ.key_list(*self._team(activity_id, team_id))
        reply = await TEAM_READ.call(self._scripts, keys, self._team_args(activity_id, team_id))
        return replies.parse_read(reply, activity_id, team_id)

    async def sweep(self, activity_id: str, team_id: str) -> Swept | TeamReply:
        """team_sweep."""
        keys = TEAM_SWEEP.key_list(*self._team(activity_id, team_id))
        reply = await TEAM_SWEEP.call(self._scripts, keys, self._team_args(activity_id, team_id))
        return replies.parse_sweep(reply)

    async def restore(
        self, activity_id: str, team_id: str, members: Sequence[str], **fields: Any
    ) -> TeamReply:
        """team_restore; `fields` are the named ARGV after the common ones."""
        keys = TEAM_RESTORE.key_list(*self._team(activity_id, team_id))
        args = self._team_args(activity_id, team_id, **fields)
        return replies.parse_restore(await TEAM_RESTORE.call(self._scripts, keys, args, members))

    def _pick_args(
        self, activity_id: str, candidates: int, cursor: Sequence[Any], **rest: Any
    ) -> dict[str, Any]:
        score, team_id = cursor
        return {
            "activity_id": activity_id,
            "shift_ms": self._clock.shift_ms,
            "team_key_prefix": self._keys.team_key_prefix(activity_id),
            "members_suffix": self._keys.members_suffix,
            "locks_suffix": self._keys.locks_suffix,
            "user_key_prefix": self._keys.user_key_prefix(activity_id),
            "candidates": candidates,
            "cursor_score": score,
            "cursor_team_id": team_id,
            **rest,
        }

    async def join(
        self, activity_id: str, user_id: str, candidates: int, cursor: Sequence[Any]
    ) -> JoinReply:
        """team_join from `cursor` (score, team_id; '' '' from the top)."""
        keys = TEAM_JOIN.key_list(
            self._keys.activity_keys(activity_id),
            activity_hash=self._keys.activity(activity_id),
            user_lock=self._keys.user_lock(activity_id, user_id),
            blocklist=self._keys.activity_blocklist(activity_id),
        )
        args = self._pick_args(activity_id, candidates, cursor, user_id=user_id)
        return replies.parse_join(await TEAM_JOIN.call(self._scripts, keys, args))

    async def list(
        self, activity_id: str, page_size: int, candidates: int, cursor: Sequence[Any]
    ) -> Listed | TeamReply:
        """team_list from `cursor`."""
        keys = TEAM_LIST.key_list(
            self._keys.activity_keys(activity_id), activity_hash=self._keys.activity(activity_id)
        )
        args = self._pick_args(activity_id, candidates, cursor, page_size=page_size)
        reply = await TEAM_LIST.call(self._scripts, keys, args)
        return replies.parse_list(reply, activity_id)

    async def user_lock(self, activity_id: str, user_id: str) -> UserLock | TeamReply:
        """user_lock_read."""
        keys = USER_LOCK_READ.key_list(user_lock=self._keys.user_lock(activity_id, user_id))
        reply = await USER_LOCK_READ.call(self._scripts, keys, {"shift_ms": self._clock.shift_ms})
        return replies.parse_user_lock(reply)

    async def reindex(self, activity_id: str, team_index: str, due_index: str) -> bool:
        """activity_reindex; whether the activity is still due."""
        keys = ACTIVITY_REINDEX.key_list(team_index=team_index, due_index=due_index)
        reply = await ACTIVITY_REINDEX.call(self._scripts, keys, {"activity_id": activity_id})
        return bool(int(reply[0]))

    async def release(self, activity_id: str) -> bool:
        """activity_release; whether the copy was dropped."""
        keys = ACTIVITY_RELEASE.key_list(
            self._keys.activity_keys(activity_id), activity_hash=self._keys.activity(activity_id)
        )
        reply = await ACTIVITY_RELEASE.call(self._scripts, keys, {"activity_id": activity_id})
        return bool(int(reply[0]))
