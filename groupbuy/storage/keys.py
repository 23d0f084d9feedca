"""Every Redis key the service uses, built in one place.

All keys of one activity share the hash tag ``{a:<activity_id>}``, all keys of one
packet ``{p:<packet_id>}``. Besides those, five indexes (sorted sets) say where
background work is waiting, so that the jobs read what is due instead of visiting every
live packet and activity: the streams with records for SQL, and what expires soonest.
The scripts keep them in the same atomic call as the change they index, so they are
passed in KEYS like every other key, and so is the copy of the blocked users they read.

Those shared keys, with the dead-letter stream, belong to no entity: where they live is
the key layout's business (KeyLayout, below): once on one Redis server, once per slot
in Redis Cluster. Their builders take an optional `slot` that only the cluster
layout reads; the jobs read every copy listed in the directory of slots in use
(groupbuy/storage/slots.py; docs/architecture.md, "Indexes of waiting work").
"""

from __future__ import annotations

import string
from binascii import crc_hqx
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Protocol

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from groupbuy.storage.specs import KeyGroup

# Where the shared keys live: once on one Redis server, once per slot in Redis Cluster.
# In Redis Cluster a script's keys must share one slot, so each shared key becomes one key
# per slot: its hash tag is a short string that lands in the slot of the entity it serves
# (`slot_tag`), and a script passes those of its own entity's slot. `Keys` asks its layout
# for these keys and for an entity's slot; everything that knows about slots is here (and
# in groupbuy/storage/slots.py, the directory of slots in use).

SLOTS = REDIS_CLUSTER_HASH_SLOTS  # 16,384
_TAG_CHARS = (string.digits + string.ascii_letters).encode()

Slot = int | None
"""Which copy of a shared key: a cluster slot, or None on one Redis server (one copy)."""


@cache
def slot_tags() -> tuple[str, ...]:
    """For each of the 16,384 slots, a three-character tag (digits and letters) that Redis
    Cluster hashes to it: the hash tag of that slot's shared keys. Built once per process
    from the CRC's linearity instead of hashing ~240,000 candidates: the CRC of
    head + tail (2 bytes) is crc(tail) XOR crc(b"\0\0", starting from crc(head)), so for
    each slot it is enough to look up, for a few heads, the tail whose CRC completes it."""
    mask = SLOTS - 1
    tails: dict[int, bytes] = {}
    for first in _TAG_CHARS:
        for second in _TAG_CHARS:
            tail = bytes((first, second))
            tails.setdefault(crc_hqx(tail, 0) & mask, tail)
    heads = [(bytes((c,)), crc_hqx(b"\0\0", crc_hqx(bytes((c,)), 0)) & mask) for c in _TAG_CHARS]
    tags: list[str] = []
    for slot in range(SLOTS):
        tag = next(head + tails[slot ^ shift] for head, shift in heads if slot ^ shift in tails)
        tags.append(tag.decode())
    return tuple(tags)


def slot_tag(slot: int) -> str:
    """The hash tag (without braces) of the shared keys of `slot`."""
    return slot_tags()[slot]


class KeyLayout(Protocol):
    """Where the shared keys live, and which copy of them an entity's scripts use."""

    @property
    def cluster(self) -> bool:
        """Whether there is one copy of each shared key per slot (Redis Cluster)."""

    def slot_of(self, key: str) -> Slot:
        """Which copy of the shared keys the scripts touching `key` use."""

    def shared(self, prefix: str, name: str, slot: Slot) -> str:
        """The key `name` under `prefix`, in the copy `slot`."""


@dataclass(frozen=True)
class OneServer:
    """One Redis server: each shared key exists once, and every script uses it."""

    cluster = False

    def slot_of(self, key: str) -> Slot:
        """Always the one copy."""
        return None

    def shared(self, prefix: str, name: str, slot: Slot) -> str:
        """`<prefix>:<name>`."""
        return f"{prefix}:{name}"


@dataclass(frozen=True)
class ClusterLayout:
    """Redis Cluster: each shared key exists once per slot, under that slot's tag."""

    cluster = True

    def __post_init__(self) -> None:
        slot_tags()  # built at start-up rather than inside the first request

    def slot_of(self, key: str) -> Slot:
        """The cluster slot of `key`."""
        return key_slot(key.encode())

    def shared(self, prefix: str, name: str, slot: Slot) -> str:
        """`<prefix>:{<slot tag>}:<name>`; the slot must be named."""
        if slot is None:
            raise ValueError(f"in Redis Cluster there is one {name} key per slot: name the slot")
        return f"{prefix}:{{{slot_tag(slot)}}}:{name}"


# After a team's hash key: its members hash and its locks zset.
_MEMBERS = ":members"
_LOCKS = ":locks"


@dataclass(frozen=True)
class TeamKeys(KeyGroup):
    """One team's keys: its state hash, members hash and locks zset."""

    prefix = "team_"
    hash: str
    members: str
    locks: str


@dataclass(frozen=True)
class ActivityKeys(KeyGroup):
    """The activity keys every team script takes: its outbox, lock, deadline and open-seat
    indexes, its live counts and lock-expiry zset under its tag, the pending, lock-due
    and deadline-due indexes (the copies of the shared keys the layout gives the activity),
    its parameters, the blocked users its scripts read, and its waitlist (entries, line,
    entry ends)."""

    prefix = "activity_"
    outbox: str
    lock_index: str
    deadlines: str
    pending: str
    due_locks: str
    due_deadlines: str
    open_seats: str
    counts: str
    lock_expiries: str
    hash: str
    blocklist: str
    waitlist: str
    line: str
    waitlist_due: str


@dataclass(frozen=True)
class PacketKeys(KeyGroup):
    """The keys every packet script takes: state hash, queued shares, grabs, outbox (under
    the packet's tag), then the pending and due indexes and the blocked users (the copies
    of the shared keys the layout gives the packet), then its grab order, recipients,
    wrong-password counts and terms (under its tag)."""

    prefix = "packet_"
    hash: str
    shares: str
    grabs: str
    outbox: str
    pending: str
    due: str
    blocklist: str
    order: str
    recipients: str
    attempts: str
    terms: str

    def own(self) -> tuple[str, ...]:
        """The packet's own keys (under its tag), which go when it is released."""
        return (
            self.hash,
            self.shares,
            self.grabs,
            self.outbox,
            self.order,
            self.recipients,
            self.attempts,
            self.terms,
        )


@dataclass(frozen=True)
class Keys:
    """Key builders under one prefix; `cluster` picks the key layout of Redis Cluster (the
    shared keys once per slot) instead of that of one Redis server (once)."""

    prefix: str = "gb"
    cluster: bool = False
    layout: KeyLayout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", ClusterLayout() if self.cluster else OneServer())

    # -- which copy of the shared keys an entity's scripts use (the layout decides) --------

    def slot_of(self, key: str) -> Slot:
        """The copy of the shared keys the scripts touching `key` use."""
        return self.layout.slot_of(key)

    def activity_slot(self, activity_id: str) -> Slot:
        """The copy of the shared keys an activity's scripts use."""
        return self.layout.slot_of(self.activity(activity_id))

    def packet_slot(self, packet_id: str) -> Slot:
        """The copy of the shared keys a packet's scripts use."""
        return self.layout.slot_of(self._packet_tag(packet_id))

    def sender_slot(self, sender_id: str) -> Slot:
        """The copy of the shared keys a sender's scripts use."""
        return self.layout.slot_of(self.sender_day(sender_id, 0))

    def _shared(self, name: str, slot: Slot) -> str:
        return self.layout.shared(self.prefix, name, slot)

    def slot_directory(self) -> str:
        """Set of the slots in use (Redis Cluster layout only): each slot that holds or held an
        activity, a packet or a sender's counters, added before their first key is written
        and never removed (at most 16,384 members). The jobs read the indexes of these
        slots; a block or unblock writes the blocklist copy of each."""
        return f"{self.prefix}:slots"

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

    members_suffix = _MEMBERS
    locks_suffix = _LOCKS

    def user_key_prefix(self, activity_id: str) -> str:
        """What every per-user key of an activity starts with (the user id follows)."""
        return f"{self._activity_tag(activity_id)}:user:"

    def user_lock(self, activity_id: str, user_id: str) -> str:
        """A user's current lock in an activity (value: see locks.codec.CurrentLock)."""
        return f"{self.user_key_prefix(activity_id)}{user_id}:lock"

    def user_counter(self, activity_id: str, user_id: str, what: str) -> str:
        """A user's counter behind the activity's limits: `teams` (teams they belong to) or
        `led` (open teams they lead). The team scripts build these names themselves from
        `user_key_prefix` (lua/_team_lib.lua, user_counter); a test checks both agree."""
        return f"{self.user_key_prefix(activity_id)}{user_id}:{what}"

    def _packet_tag(self, packet_id: str) -> str:
        return f"{self.prefix}:{{p:{packet_id}}}"

    # Built on every grab; a flash hits the same packets again and again (a visible share
    # of a grab's CPU went into these f-strings and the layout's slot lookups).
    @lru_cache(maxsize=4096)  # noqa: B019 (Keys lives as long as the process)
    def packet_keys(self, packet_id: str) -> PacketKeys:
        """The keys every packet script takes."""
        tag = self._packet_tag(packet_id)
        slot = self.packet_slot(packet_id)
        return PacketKeys(
            hash=f"{tag}:packet",
            shares=f"{tag}:shares",
            grabs=f"{tag}:grabs",
            outbox=f"{tag}:outbox",
            pending=self.pending_packets(slot),
            due=self.due_packets(slot),
            blocklist=self.blocked_users(slot),
            order=f"{tag}:order",
            recipients=f"{tag}:recipients",
            attempts=f"{tag}:attempts",
            terms=f"{tag}:terms",
        )

    def packet_restoring(self, packet_id: str) -> str:
        """The lock held while a packet Redis lost is rebuilt from SQL (one rebuilder)."""
        return f"{self._packet_tag(packet_id)}:restoring"

    def team_restoring(self, activity_id: str, team_id: str) -> str:
        """The lock held while a team Redis lost is rebuilt from SQL (one rebuilder)."""
        return f"{self.team(activity_id, team_id)}:restoring"

    def packet_outbox(self, packet_id: str) -> str:
        """Stream of a packet's grabs and endings for SQL (read by a consumer group)."""
        return f"{self._packet_tag(packet_id)}:outbox"

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

    def waitlist(self, activity_id: str) -> str:
        """Hash user_id -> the user's waitlist entry ('q|team_id|queued_ms|expires_ms|seq'
        while waiting, 'o|team_id|locked_at_ms|expires_at_ms|version' once offered) and
        '~seq', the last entry's number (lua/_waitlist_lib.lua)."""
        return f"{self._activity_tag(activity_id)}:waitlist"

    def line(self, activity_id: str) -> str:
        """Sorted set user_id -> entry number of those waiting for any team of an activity;
        a team's own line is this key, ':' and the team id."""
        return f"{self._activity_tag(activity_id)}:line"

    def waitlist_due(self, activity_id: str) -> str:
        """Sorted set user_id -> when the entry ends (ms): a waiting entry's expiry, an
        offer's lock expiry (what the lock sweep's waitlist pass reads)."""
        return f"{self._activity_tag(activity_id)}:waitlist_due"

    def pending_activities(self, slot: Slot = None) -> str:
        """Sorted set activity_id -> ms of the oldest record waiting in its outbox stream."""
        return self._shared("pending:activities", slot)

    def pending_packets(self, slot: Slot = None) -> str:
        """Sorted set packet_id -> ms of the oldest record waiting in its outbox stream."""
        return self._shared("pending:packets", slot)

    def dead_letters(self, slot: Slot = None) -> str:
        """Stream of the newest outbox records SQL could not apply (capped; the SQL table
        dead_letters keeps every one)."""
        return self._shared("dead_letters", slot)

    def due_locks(self, slot: Slot = None) -> str:
        """Sorted set activity_id -> at most the earliest score of its lock index (when a
        lock of it expires first); what sweep_locks reads."""
        return self._shared("due:locks", slot)

    def due_deadlines(self, slot: Slot = None) -> str:
        """Sorted set activity_id -> at most the earliest deadline in its deadline index;
        what expire_teams reads."""
        return self._shared("due:deadlines", slot)

    def due_packets(self, slot: Slot = None) -> str:
        """Sorted set packet_id -> expiry of each active packet; what expire_packets reads."""
        return self._shared("due:packets", slot)

    def global_indexes(self, slot: Slot = None) -> list[str]:
        """The indexes of waiting work (of `slot`'s copy)."""
        return [
            self.pending_activities(slot),
            self.pending_packets(slot),
            self.due_locks(slot),
            self.due_deadlines(slot),
            self.due_packets(slot),
        ]

    def seen_signature(self, signature: str) -> str:
        """Marks a request signature as used (SET NX, with a TTL): a replay finds it."""
        return f"{self.prefix}:sig:{signature}"

    def blocked_users(self, slot: Slot = None) -> str:
        """Hash user_id -> 'blocked_at_ms|reason' of the users an admin blocked (SQL holds the
        record; groupbuy.ops.blocklist). The scripts that let a user take a seat or money read
        it in the same call, so it is passed in their KEYS. Without a slot: the one hash
        (what the scripts read on one Redis server). With a slot, in the cluster layout:
        that slot's copy, user_id -> '1', the one the scripts of the slot's
        activities, packets and senders read (groupbuy.storage.slots writes it when the slot
        joins the directory)."""
        if slot is None:
            return f"{self.prefix}:blocked_users"
        return self._shared("blocked_users", slot)

    def activity_blocklist(self, activity_id: str) -> str:
        """The blocked users hash the team scripts of an activity read (in its slot)."""
        return self.blocked_users(self.activity_slot(activity_id))

    def sender_day(self, sender_id: str, day: int) -> str:
        """Hash of what a sender sent in one UTC day (day = ms since the epoch // 86,400,000):
        packet_id -> 'amount_cents|request token' for each send counted, and the totals under
        '#count' and '#amount' (an id never starts with '#'). Expires a little after the day
        ends."""
        return f"{self.prefix}:{{s:{sender_id}}}:sent:{day}"

    def rate_buckets(
        self, key_id: str, route_class: str, user_id: str | None, by_key: bool = True
    ) -> list[str]:
        """The token buckets one request takes from: its API key's for the route class, then
        its user's (when the route names one). Both share the key's hash tag so one script
        call checks them together in Redis Cluster; a key's users then sit in its slot,
        which its own bucket, hit by every request of the key, makes hot anyway. Each
        bucket expires once full again (lua/ratelimit_take.lua). Without `by_key`, only the
        user's."""
        tag = f"{self.prefix}:{{rl:{key_id}}}:{route_class}"
        buckets = [f"{tag}:key"] if by_key else []
        if user_id is not None:
            buckets.append(f"{tag}:user:{user_id}")
        return buckets

    def guesses(self, address: str) -> str:
        """Counter of the failed authentications of one client address (a normalised IP
        address, or a digest of a peer name that is none) in its window
        (lua/guess_count.lua); its own hash tag, so each address is one slot's business."""
        return f"{self.prefix}:{{guess:{address}}}"

    def activity_counts(self, activity_id: str) -> str:
        """Hash of an activity's live counts, kept by the team scripts (no expiry: the teams
        they count outlive the activity's copy; rebuilt from SQL after a loss)."""
        return f"{self._activity_tag(activity_id)}:counts"

    def lock_expiries(self, activity_id: str) -> str:
        """Sorted set 'team_id|user_id' -> expiry ms of each of an activity's seat locks."""
        return f"{self._activity_tag(activity_id)}:lock_expiries"

    def funnel(self, activity_id: str, minute: int, outcome: str = "") -> str:
        """Hash outcome -> count of an activity's seat locks in one minute (ms // 60,000 on
        Redis's clock), or with `outcome` the set of the digests of that outcome's events
        (counted once however often their records are applied): groupbuy/locks/funnel.py
        adds to them, and they expire a little after the console stops showing that minute."""
        tail = f":{outcome}" if outcome else ""
        return f"{self._activity_tag(activity_id)}:funnel:{minute}{tail}"

    def lease(self, name: str) -> str:
        """The key of a lease that lets one process at a time do something."""
        return f"{self.prefix}:lease:{name}"

    def fingerprint_secret(self) -> str:
        """The server's key of API key fingerprints when `[auth] fingerprint_secret` is unset:
        made once (SET NX) and kept without expiry, read by every process."""
        return f"{self.prefix}:fingerprint_secret"

    def console_session(self, session_id: str) -> str:
        """A console session that is signed in: set at sign-in with the session's lifetime,
        deleted at sign-out (a copy of the cookie then signs nobody in)."""
        return f"{self.prefix}:console_session:{session_id}"

    @lru_cache(maxsize=4096)  # noqa: B019 (Keys lives as long as the process)
    def activity_keys(self, activity_id: str) -> ActivityKeys:
        """An activity's keys every team script takes (cached: a storm of seat locks hits
        the same activities again and again)."""
        slot = self.activity_slot(activity_id)
        return ActivityKeys(
            outbox=self.outbox(activity_id),
            lock_index=self.lock_index(activity_id),
            deadlines=self.deadline_index(activity_id),
            pending=self.pending_activities(slot),
            due_locks=self.due_locks(slot),
            due_deadlines=self.due_deadlines(slot),
            open_seats=self.open_seats(activity_id),
            counts=self.activity_counts(activity_id),
            lock_expiries=self.lock_expiries(activity_id),
            hash=self.activity(activity_id),
            blocklist=self.activity_blocklist(activity_id),
            waitlist=self.waitlist(activity_id),
            line=self.line(activity_id),
            waitlist_due=self.waitlist_due(activity_id),
        )

    # Built on every seat lock; a storm hits the same teams again and again (a visible
    # share of a lock's own time went into these f-strings).
    @lru_cache(maxsize=4096)  # noqa: B019 (Keys lives as long as the process)
    def team_keys(self, activity_id: str, team_id: str) -> TeamKeys:
        """One team's hash, members and locks."""
        return TeamKeys(
            hash=self.team(activity_id, team_id),
            members=self.team_members(activity_id, team_id),
            locks=self.team_locks(activity_id, team_id),
        )
