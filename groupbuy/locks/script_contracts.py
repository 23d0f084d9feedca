"""The contracts of the team_* and activity_* scripts and user_lock_read: the only place
that knows the order of their KEYS and ARGV (docs/scripts.md is rendered from them;
tests/lua/test_contracts.py checks the `local` lines of the scripts against them).
groupbuy.locks.scripts wraps each one and exports them under its own name too.
"""

from __future__ import annotations

from groupbuy.storage.contracts import ScriptContract, Slot, slots

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
PICK_KEYS = (
    *_ACTIVITY_KEYS,
    Slot("activity_hash", "the activity's copy of its parameters and status"),
)
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
    keys=(
        *TEAM_KEYS,
        *slots(("activity_hash", "the activity's parameters and status"), _BLOCKLIST),
    ),
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
        "`{USER_LIMIT_REACHED, limit, current, name}`, `{USER_BLOCKED}`, "
        f"`{{ACTIVITY_CLOSED}}`; {_TEAM_SNAPSHOT}."
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
            ("activity_hash", "the activity's copy of its parameters and status"),
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
        "`{TEAM_NOT_FOUND}`, `{USER_LIMIT_REACHED, limit, current, name}`, `{USER_BLOCKED}`, "
        "`{ACTIVITY_NOT_FOUND}`, `{ACTIVITY_CLOSED}`."
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
        "`{USER_LIMIT_REACHED, limit, current, name}`, `{ACTIVITY_NOT_FOUND}`, `{USER_BLOCKED}`, "
        "`{ACTIVITY_CLOSED}`."
    ),
)
TEAM_LIST = ScriptContract(
    "team_list",
    "A page of the activity's open teams with a free seat, closest to forming first (or of "
    "the full ones, earliest deadline first).",
    keys=PICK_KEYS,
    argv=(
        *PICK_ARGV,
        *slots(
            ("page_size", "most teams in the page"),
            ("full", "'1': the open teams full of members and locks (deadline index), else '0'"),
        ),
    ),
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
    ),
    argv=slots(("activity_id", "the activity")),
    reply="`{1}` released, `{0}` a team is still open or a record waits (nothing changed).",
)
_COUNTS = ("teams_open", "teams_formed", "teams_failed", "members", "virtual_completions")
ACTIVITY_COUNTS = ScriptContract(
    "activity_counts",
    "An activity's live counts, after time is applied where it is due.",
    keys=PICK_KEYS,
    argv=PICK_ARGV,
    reply=(
        "`{OK, teams_open, teams_formed, teams_failed, members, live_locks, "
        "virtual_completions}`, `{LOOK_FURTHER}` more was due than one call applies (call "
        "again), `{ACTIVITY_NOT_FOUND}` Redis has no counts (put them back from SQL)."
    ),
)
ACTIVITY_COUNTS_PUT = ScriptContract(
    "activity_counts_put",
    "Set an activity's counts from SQL's, once: only while Redis has none.",
    keys=slots(("activity_counts", "hash of the activity's live counts")),
    argv=slots(*((name, f"{name.replace('_', ' ')} as SQL counts them") for name in _COUNTS)),
    reply="`{OK}` set, `{EXISTING}` Redis has counts (nothing changed).",
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
    ACTIVITY_COUNTS,
    ACTIVITY_COUNTS_PUT,
)
