"""The key groups and reply shapes the team scripts share, and the specs of the scripts
no one operation owns: the only place that knows the order of their KEYS and ARGV
(docs/scripts.md is rendered from them; tests/lua/test_contracts.py checks the `local`
lines of the scripts against them). An operation's own script has its spec in the
operation's module (team_lock: groupbuy.locks.lock); groupbuy.locks.engine lists them all.
groupbuy.locks.scripts wraps the ones here and exports them under its own name too.
"""

from __future__ import annotations

from typing import Any

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.view import listing, snapshot
from groupbuy.storage.specs import (
    Field,
    ScriptSpec,
    Slot,
    Verdict,
    flag,
    optional_int,
    shape,
    slots,
)

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
    ("activity_counts", "hash of the activity's live counts (activity_counts reads it)"),
    ("activity_lock_expiries", "zset 'team_id|user_id' -> expiry ms of each seat lock"),
    ("activity_hash", "the activity's copy of its parameters and status"),
    ("activity_blocklist", "blocked users hash (the copy of the activity's slot in a cluster)"),
    ("activity_waitlist", "hash user -> waitlist entry or offer, and '~seq'"),
    (
        "activity_line",
        "zset user -> entry number: the line for any team ('<key>:<team>': a team's)",
    ),
    ("activity_waitlist_due", "zset user -> when each waiting entry expires (ms)"),
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
PICK_KEYS = _ACTIVITY_KEYS
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
C = TeamCode
OK, EXISTING, LOOK_FURTHER = C.OK, C.EXISTING, C.LOOK_FURTHER
TEAM_NOT_FOUND, ACTIVITY_NOT_FOUND, ACTIVITY_CLOSED = (
    C.TEAM_NOT_FOUND,
    C.ACTIVITY_NOT_FOUND,
    C.ACTIVITY_CLOSED,
)
USER_LIMIT_REACHED, USER_BLOCKED = C.USER_LIMIT_REACHED, C.USER_BLOCKED
# The replies several scripts share.
TEAM = Field("team", snapshot, rest=True)  # the team hash, members hash and locks
OVER_LIMIT = shape(
    "the user is at one of the activity's limits (teams_per_user, open_teams_per_leader)",
    ("limit", int),
    ("current", int),
    ("limit_name", str),
)
BLOCKED = shape("an admin blocked the user")
NO_TEAM = shape("Redis has no such team")
NO_ACTIVITY = shape("Redis has no copy of the activity")
CLOSED = shape("the activity is closed")
MEMBER = shape("the user is a member of the team")
FORMED = shape("the team is formed")
FAILED = shape("the team failed")
LEFT = shape("the user left this team: no seat in it again")
USER_LOCK_SLOT = (
    "user_lock",
    "the user's current lock: 'team_id|locked_at_ms|expires_at_ms|deadline_ms'",
)
# What a script that takes a seat of a named team for a user refuses before the seat.
SEAT_REFUSALS = {
    C.ALREADY_MEMBER: MEMBER,
    C.LEFT_TEAM: LEFT,
    C.TEAM_FORMED: FORMED,
    C.TEAM_FAILED: FAILED,
    TEAM_NOT_FOUND: NO_TEAM,
    USER_LIMIT_REACHED: OVER_LIMIT,
    USER_BLOCKED: BLOCKED,
    ACTIVITY_NOT_FOUND: NO_ACTIVITY,
    ACTIVITY_CLOSED: CLOSED,
}
# The sale's refusals (lua/_sale_lib.lua) of the scripts that take a unit of the stock.
SALE_REFUSALS = {
    C.ACTIVITY_NOT_STARTED: shape("before the sale's starts_at", ("starts_ms", int)),
    C.ACTIVITY_ENDED: shape("from the sale's ends_at on"),
    C.ACTIVITY_SOLD_OUT: shape(
        "no unit of the stock left; when the activity's earliest live lock expires ('' for none)",
        ("next_unlock_ms", optional_int),
    ),
}

TEAM_OPEN = ScriptSpec(
    "team_open",
    "Open a team whose leader is member 1, idempotently.",
    keys=TEAM_KEYS,
    args=(
        *TEAM_ARGV,
        *slots(
            ("leader_id", "the leader (member 1)"),
            ("leader_order_id", "the leader's order ('' for none)"),
            ("retention_ms", "how long the keys outlive the deadline"),
        ),
    ),
    replies={
        OK: shape("opened now", TEAM),
        EXISTING: shape("opened before (by this same call)", TEAM),
        C.CONFLICT: shape("the team exists with another leader or order"),
        ACTIVITY_NOT_FOUND: NO_ACTIVITY,
        USER_LIMIT_REACHED: OVER_LIMIT,
        USER_BLOCKED: BLOCKED,
        ACTIVITY_CLOSED: CLOSED,
        **SALE_REFUSALS,
    },
)
TEAM_READ = ScriptSpec(
    "team_read",
    "A team's state after the lazy checks (deadline, expired locks).",
    keys=TEAM_KEYS,
    args=TEAM_ARGV,
    replies={
        OK: shape("the team at Redis's now_ms", ("now_ms", int), TEAM),
        TEAM_NOT_FOUND: NO_TEAM,
    },
)
TEAM_SWEEP = ScriptSpec(
    "team_sweep",
    "Apply what time did to one team (expired locks, a passed deadline).",
    keys=TEAM_KEYS,
    args=TEAM_ARGV,
    replies={
        OK: shape(
            "locks it expired, the team's status, 1 when this call ended the team",
            ("locks_expired", int),
            ("status", str),
            ("ended_now", flag),
        ),
        TEAM_NOT_FOUND: NO_TEAM,
    },
)
TEAM_RESTORE = ScriptSpec(
    "team_restore",
    "Rebuild an open team that Redis lost, from its SQL record, once.",
    keys=TEAM_KEYS,
    args=(
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
            ("departed", "members who left (a new member's seq is member_count + departed)"),
            ("left_members", "'user_id|left_at_ms|order_id' of each who left, ','-separated"),
        ),
    ),
    more_args=Slot("members", "pairs: user_id, 'seq|joined_at_ms|order_id' (still members)"),
    replies={
        OK: shape("rebuilt (without its locks)"),
        EXISTING: shape("Redis has it (nothing changed)"),
    },
)
TEAM_LIST = ScriptSpec(
    "team_list",
    "A page of the activity's open teams with a free seat, closest to forming first (or of "
    "the full ones, earliest deadline first).",
    keys=PICK_KEYS,
    args=(
        *PICK_ARGV,
        *slots(
            ("page_size", "most teams in the page"),
            ("full", "'1': the open teams full of members and locks (deadline index), else '0'"),
        ),
    ),
    replies={
        OK: shape(
            "the page, and where the next one starts ('' '' after the last page)",
            ("cursor_score", str),
            ("cursor_team_id", str),
            ("page", listing),
        ),
        ACTIVITY_NOT_FOUND: NO_ACTIVITY,
    },
)
USER_LOCK_READ = ScriptSpec(
    "user_lock_read",
    "The user's live lock in an activity, from their current-lock key alone.",
    keys=slots(USER_LOCK_SLOT),
    args=slots(("shift_ms", "clock shift in ms (0 in production)")),
    replies={
        OK: shape(
            "the team the user holds a live lock in, and its times",
            ("team_id", str),
            ("locked_at_ms", int),
            ("expires_at_ms", int),
        ),
        C.NO_LOCK: shape("the user holds no live lock in the activity"),
    },
)
ACTIVITY_REINDEX = ScriptSpec(
    "activity_reindex",
    "Set an activity's entry in a due index to the earliest entry of its own index.",
    keys=slots(
        ("team_index", "the activity's lock index or deadline index"),
        ("due_index", "the matching due index (of the activity's slot in a cluster)"),
        ("also_index", "with the lock index: the waitlist's entry ends, due on the same sweep"),
    ),
    optional_keys=("also_index",),
    args=slots(("activity_id", "the activity")),
    replies={
        Verdict.YES: shape("indexed", ("earliest_ms", int)),
        Verdict.NO: shape("nothing due any more (the entry is gone)"),
    },
)
ACTIVITY_RELEASE = ScriptSpec(
    "activity_release",
    "Drop an activity's Redis copy and counts once no team of it is live and SQL has every "
    "record of it (SQL keeps it).",
    keys=slots(
        ("activity_hash", "the activity's copy of its parameters"),
        ("activity_lock_index", "zset team_id -> when its earliest lock expires"),
        ("activity_deadlines", "zset team_id -> deadline ms"),
        ("activity_due_locks", "lock-due index (of its slot in a cluster)"),
        ("activity_due_deadlines", "deadline-due index (of its slot in a cluster)"),
        ("activity_outbox", "the activity's outbox stream (gone once SQL has every record)"),
        ("activity_counts", "hash of the activity's live counts"),
        ("activity_lock_expiries", "zset 'team_id|user_id' -> expiry ms of each seat lock"),
        ("activity_waitlist", "the waitlist's entries (the copy stays while it has any)"),
    ),
    args=slots(("activity_id", "the activity")),
    replies={
        Verdict.YES: shape("released"),
        Verdict.NO: shape(
            "a team is still open, a record or a waitlist entry waits (nothing changed)"
        ),
    },
)
_COUNTS = ("teams_open", "teams_formed", "teams_failed", "members", "virtual_completions")
# activity_counts' fields; members: of open and formed teams, leaders included.
COUNTS = (*_COUNTS[:4], "live_locks", _COUNTS[4])
# What activity_counts says of the waitlist: entries waiting, those for any team.
WAITLIST_COUNTS = ("waiting", "waiting_any_team")
ACTIVITY_COUNTS = ScriptSpec(
    "activity_counts",
    "An activity's live counts, after time is applied where it is due.",
    keys=PICK_KEYS,
    args=PICK_ARGV,
    replies={
        OK: shape(
            "the counts, and Redis's clock (the activity's status is judged on it)",
            *((name, int) for name in COUNTS),
            ("now_ms", int),
            *((name, int) for name in WAITLIST_COUNTS),
            ("oldest_entry_expires_ms", optional_int),
        ),
        LOOK_FURTHER: shape("more was due than one call applies: call again"),
        ACTIVITY_NOT_FOUND: shape("Redis has no counts (put them back from SQL)"),
    },
)
ACTIVITY_COUNTS_PUT = ScriptSpec(
    "activity_counts_put",
    "Set an activity's counts from SQL's, once: only while Redis has none.",
    keys=slots(("activity_counts", "hash of the activity's live counts")),
    args=slots(
        *((name, f"{name.replace('_', ' ')} as SQL counts them") for name in _COUNTS),
        ("ttl_ms", "how long the counts live while no team of the activity does (ms)"),
    ),
    replies={OK: shape("set"), EXISTING: shape("Redis has counts (nothing changed)")},
)
CONTRACTS: tuple[ScriptSpec[Any], ...] = (
    TEAM_OPEN,
    TEAM_READ,
    TEAM_SWEEP,
    TEAM_RESTORE,
    TEAM_LIST,
    USER_LOCK_READ,
    ACTIVITY_REINDEX,
    ACTIVITY_RELEASE,
    ACTIVITY_COUNTS,
    ACTIVITY_COUNTS_PUT,
)
