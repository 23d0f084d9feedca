"""Every Redis key the service uses, built in one place.

All keys of one activity share the hash tag ``{a:<activity_id>}``, all keys of one
packet ``{p:<packet_id>}``. Besides those, five global indexes (sorted sets) say where
background work is waiting, so that the jobs read what is due instead of visiting every
live packet and activity: the streams with records for SQL, and what expires soonest.
The scripts keep them in the same atomic call as the change they index, so they are
passed in KEYS like every other key; in Redis Cluster they would sit in other slots than
the tagged keys (docs/architecture.md, "Indexes of waiting work", says how they map).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

# After a team's hash key: its members hash and its locks zset.
_MEMBERS = ":members"
_LOCKS = ":locks"


@dataclass(frozen=True)
class Keys:
    """Key builders under one prefix."""

    prefix: str = "gb"

    def _activity_tag(self, activity_id: str) -> str:
        return f"{self.prefix}:{{a:{activity_id}}}"

    def activity(self, activity_id: str) -> str:
        """Hash of an activity's parameters."""
        return f"{self._activity_tag(activity_id)}:activity"

    def outbox(self, activity_id: str) -> str:
        """Stream of records an activity's scripts wrote for SQL."""
        return f"{self._activity_tag(activity_id)}:outbox"

    def team_key_prefix(self, activity_id: str) -> str:
        """What every team hash key of an activity starts with (the team id follows)."""
        return f"{self._activity_tag(activity_id)}:team:"

    def team(self, activity_id: str, team_id: str) -> str:
        """Hash of one team's state."""
        return f"{self.team_key_prefix(activity_id)}{team_id}"

    def team_members(self, activity_id: str, team_id: str) -> str:
        """Hash user_id -> 'seq|joined_at_ms|order_id'."""
        return f"{self.team(activity_id, team_id)}{_MEMBERS}"

    def team_locks(self, activity_id: str, team_id: str) -> str:
        """Sorted set of a team's seat locks: member user_id, score locked_at_ms."""
        return f"{self.team(activity_id, team_id)}{_LOCKS}"

    def team_key_formats(self, activity_id: str) -> list[str]:
        """How the scripts that pick teams (lua/_team_pick.lua) build a team's keys: the
        prefix of its hash, then the suffixes of its members hash and locks zset."""
        return [self.team_key_prefix(activity_id), _MEMBERS, _LOCKS]

    def user_lock(self, activity_id: str, user_id: str) -> str:
        """A user's current lock in an activity (value: see locks.codec.CurrentLock)."""
        return f"{self._activity_tag(activity_id)}:user:{user_id}:lock"

    def user_counter(self, activity_id: str, user_id: str, what: str) -> str:
        """A user's counter behind the activity's limits: `teams` (teams they belong to) or
        `led` (open teams they lead). The team scripts build these names themselves
        (lua/_team_lib.lua, user_counter); a test checks both agree."""
        return f"{self._activity_tag(activity_id)}:user:{user_id}:{what}"

    def _packet_tag(self, packet_id: str) -> str:
        return f"{self.prefix}:{{p:{packet_id}}}"

    def packet_keys(self, packet_id: str) -> list[str]:
        """The KEYS[1..7] of every packet script: state hash, queued shares, grabs, outbox
        (the packet's own, under its tag), then the pending and due indexes and the blocked
        users (global)."""
        tag = self._packet_tag(packet_id)
        return [
            f"{tag}:packet",
            f"{tag}:shares",
            f"{tag}:grabs",
            f"{tag}:outbox",
            self.pending_packets(),
            self.due_packets(),
            self.blocked_users(),
        ]

    def packet_restoring(self, packet_id: str) -> str:
        """The lock held while a packet Redis lost is rebuilt from SQL (one rebuilder)."""
        return f"{self._packet_tag(packet_id)}:restoring"

    def team_restoring(self, activity_id: str, team_id: str) -> str:
        """The lock held while a team Redis lost is rebuilt from SQL (one rebuilder)."""
        return f"{self.team(activity_id, team_id)}:restoring"

    def packet_outbox(self, packet_id: str) -> str:
        """Stream of a packet's grabs and endings for SQL (read by a consumer group)."""
        return self.packet_keys(packet_id)[3]

    def lock_index(self, activity_id: str) -> str:
        """Sorted set team_id -> when the team's earliest lock expires (what sweep_locks reads)."""
        return f"{self._activity_tag(activity_id)}:lock_due"

    def deadline_index(self, activity_id: str) -> str:
        """Sorted set team_id -> deadline of each open team (what expire_teams reads)."""
        return f"{self._activity_tag(activity_id)}:deadlines"

    def open_seats(self, activity_id: str) -> str:
        """Sorted set team_id -> seat score (locks.codec.seat_score) of each open team with a
        free seat: the most taken seats first, then the oldest (what team_join reads)."""
        return f"{self._activity_tag(activity_id)}:open_seats"

    def pending_activities(self) -> str:
        """Sorted set activity_id -> ms of the oldest record waiting in its outbox stream."""
        return f"{self.prefix}:pending:activities"

    def pending_packets(self) -> str:
        """Sorted set packet_id -> ms of the oldest record waiting in its outbox stream."""
        return f"{self.prefix}:pending:packets"

    def dead_letters(self) -> str:
        """Stream of the newest outbox records SQL could not apply (capped; the SQL table
        dead_letters keeps every one)."""
        return f"{self.prefix}:dead_letters"

    def due_locks(self) -> str:
        """Sorted set activity_id -> at most the earliest score of its lock index (when a
        lock of it expires first); what sweep_locks reads."""
        return f"{self.prefix}:due:locks"

    def due_deadlines(self) -> str:
        """Sorted set activity_id -> at most the earliest deadline in its deadline index;
        what expire_teams reads."""
        return f"{self.prefix}:due:deadlines"

    def due_packets(self) -> str:
        """Sorted set packet_id -> expiry of each active packet; what expire_packets reads."""
        return f"{self.prefix}:due:packets"

    def global_indexes(self) -> list[str]:
        """The keys outside every hash tag: the indexes of waiting work."""
        return [
            self.pending_activities(),
            self.pending_packets(),
            self.due_locks(),
            self.due_deadlines(),
            self.due_packets(),
        ]

    def seen_signature(self, signature: str) -> str:
        """Marks a request signature as used (SET NX, with a TTL): a replay finds it."""
        return f"{self.prefix}:sig:{signature}"

    def blocked_users(self) -> str:
        """Hash user_id -> 'blocked_at_ms|reason' of the users an admin blocked (SQL holds the
        record; groupbuy.ops.blocklist). The scripts that let a user take a seat or money read
        it in the same call, so it is passed in their KEYS. It is global, outside every hash
        tag: under Redis Cluster those scripts' keys would span slots, so this key must then
        be placed per slot (one copy under each activity's and packet's tag, or per slot,
        written by every block and unblock) before cluster mode can work."""
        return f"{self.prefix}:blocked_users"

    def sender_day(self, sender_id: str, day: int) -> str:
        """Hash of what a sender sent in one UTC day (day = ms since the epoch // 86,400,000):
        packet_id -> 'amount_cents|request token' for each send counted, and the totals under
        '#count' and '#amount' (an id never starts with '#'). Expires a little after the day
        ends."""
        return f"{self.prefix}:{{s:{sender_id}}}:sent:{day}"

    def rate_buckets(self, key_id: str, route_class: str, user_id: str | None) -> list[str]:
        """The token buckets one request takes from: its API key's for the route class, then
        its user's (when the route names one). Both share the key's hash tag so one script
        call checks them together in Redis Cluster; a key's users then sit in its slot,
        which its own bucket, hit by every request of the key, makes hot anyway. Each
        bucket expires once full again (lua/ratelimit_take.lua)."""
        tag = f"{self.prefix}:{{rl:{key_id}}}:{route_class}"
        if user_id is None:
            return [f"{tag}:key"]
        return [f"{tag}:key", f"{tag}:user:{user_id}"]

    def lease(self, name: str) -> str:
        """The key of a lease that lets one process at a time do something."""
        return f"{self.prefix}:lease:{name}"

    def activity_release_keys(self, activity_id: str) -> list[str]:
        """The KEYS of activity_release.lua: the activity's copy, its two indexes, and the
        two global due indexes it leaves."""
        return [
            self.activity(activity_id),
            self.lock_index(activity_id),
            self.deadline_index(activity_id),
            self.due_locks(),
            self.due_deadlines(),
        ]

    def activity_keys(self, activity_id: str) -> list[str]:
        """An activity's keys every team script takes (KEYS[4..10] of lua/_team_lib.lua): its
        outbox, lock, deadline and open-seat indexes under its tag, and the pending, lock-due
        and deadline-due indexes (global)."""
        return [
            self.outbox(activity_id),
            self.lock_index(activity_id),
            self.deadline_index(activity_id),
            self.pending_activities(),
            self.due_locks(),
            self.due_deadlines(),
            self.open_seats(activity_id),
        ]

    def pick_keys(self, activity_id: str) -> list[str]:
        """The KEYS[1..8] of the scripts that pick teams (lua/_team_pick.lua): the activity's
        keys, then its hash."""
        return [*self.activity_keys(activity_id), self.activity(activity_id)]

    def team_keys(self, activity_id: str, team_id: str) -> list[str]:
        """The KEYS[1..10] every script naming a team starts with (see lua/_team_lib.lua): the
        team's hash, members and locks, then the activity's keys."""
        return list(self._team_keys(activity_id, team_id))

    # Built on every seat lock; a storm hits the same teams again and again (15% of a lock's
    # own time went into these f-strings). A fresh list per call: callers extend it.
    @lru_cache(maxsize=4096)  # noqa: B019 (Keys lives as long as the process)
    def _team_keys(self, activity_id: str, team_id: str) -> tuple[str, ...]:
        return (
            self.team(activity_id, team_id),
            self.team_members(activity_id, team_id),
            self.team_locks(activity_id, team_id),
            *self.activity_keys(activity_id),
        )
