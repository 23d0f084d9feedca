"""The waitlist, whole (SPEC §3 "Waitlist", §4.13): its scripts' specs and calls, and the
operations `Waitlist` hands out (`waitlist.join`, `.read`, `.leave`), and the sweep's pass
that ends expired entries (`expire_entries`).

A shopper who finds no free seat waits in line; every script that frees a seat offers it,
in the same call, to the head of the team's line, else of the activity's line
(lua/_waitlist_lib.lua), and says so with a `lock.offered` record. The scripts here only
queue, read, remove and expire entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from groupbuy_client.wire import Outcome, WaitlistOffered, WaitlistQueued, iso_ms

from groupbuy import errors
from groupbuy.locks.activity_copy import ActivityCopy
from groupbuy.locks.codes import TeamCode, raise_for
from groupbuy.locks.history import MissingTeam, TeamHistory
from groupbuy.locks.join import SeatJoin
from groupbuy.locks.lock import SeatLock
from groupbuy.locks.refusals import refuse_for_user
from groupbuy.locks.sale import refuse_for_sale
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.specs import (
    OK,
    PICK_ARGV,
    PICK_KEYS,
    SALE_REFUSALS,
    SEAT_REFUSALS,
    TEAM_ARGV,
    TEAM_KEYS,
    USER_LOCK_SLOT,
    C,
)
from groupbuy.metrics import WAITLIST_ENTRIES
from groupbuy.storage.specs import Field, ScriptSpec, Slot, flag, shape, slots


def _ints(values: list[Any]) -> list[int]:
    return [int(value) for value in values]


_QUEUED = (("position", int), ("expires_at_ms", int), ("team_id", str), ("queued_at_ms", int))
_OFFERED = (
    ("team_id", str),
    ("locked_at_ms", int),
    ("expires_at_ms", int),
    ("version", int),
    ("queued_at_ms", int),
)
# Calls of one POST: a free seat another caller took first sends it back to queue.
_ATTEMPTS = 4
# The refusals of a lock or join that mean "no seat now": the entry queues instead.
_NO_SEAT = (errors.TeamFull, errors.NoTeamAvailable, errors.ActivitySoldOut)

WAITLIST_JOIN = ScriptSpec(
    "waitlist_join",
    "Wait in line for the next free seat of a team ('' team: of any team of the activity).",
    keys=(*TEAM_KEYS, *slots(USER_LOCK_SLOT)),
    args=(
        *TEAM_ARGV,
        *slots(("user_id", "the user"), ("force", "'1': queue even if a seat looks free")),
    ),
    replies={
        C.QUEUED: shape("waiting (new: this call queued it)", *_QUEUED, ("new", flag)),
        C.OFFERED: shape("the line gave the user this lock", *_OFFERED),
        C.TAKE_SEAT: shape("a seat is free now and nobody waits: lock or join instead"),
        C.WAITLIST_FULL: shape("the activity's lines hold max_len entries", ("max_len", int)),
        C.ALREADY_LOCKED: shape("the user holds a live lock in team_id", ("team_id", str)),
        **SEAT_REFUSALS,
        C.ACTIVITY_NOT_STARTED: SALE_REFUSALS[C.ACTIVITY_NOT_STARTED],
        C.ACTIVITY_ENDED: SALE_REFUSALS[C.ACTIVITY_ENDED],
    },
)
WAITLIST_READ = ScriptSpec(
    "waitlist_read",
    "A user's waitlist entry (its position a rank: no scan), or the offer the line made.",
    keys=(
        *slots(
            ("activity_waitlist", "hash user -> waitlist entry or offer"),
            ("activity_line", "the line for any team ('<key>:<team>': a team's)"),
        ),
        *slots(USER_LOCK_SLOT),
    ),
    args=slots(("user_id", "the user"), ("shift_ms", "clock shift in ms (0 in production)")),
    replies={
        C.QUEUED: shape("waiting", *_QUEUED),
        C.OFFERED: shape("the lock the line gave (until it expires or is confirmed)", *_OFFERED),
        C.NOT_WAITING: shape("no entry and no live offer"),
    },
)
WAITLIST_LEAVE = ScriptSpec(
    "waitlist_leave",
    "Take a user's waiting entry out of the line (an offer stays: it is a lock).",
    keys=slots(
        ("activity_waitlist", "hash user -> waitlist entry or offer"),
        ("activity_line", "the line for any team ('<key>:<team>': a team's)"),
        ("activity_waitlist_due", "zset user -> when the entry expires"),
    ),
    args=slots(("user_id", "the user")),
    replies={OK: shape("removed: 1 when the user was waiting", ("removed", flag))},
)
WAITLIST_EXPIRE = ScriptSpec(
    "waitlist_expire",
    "End an activity's waiting entries whose time ran out, a batch at a time.",
    keys=TEAM_KEYS,
    args=(*TEAM_ARGV, *slots(("batch", "most entries one call ends"))),
    replies={
        OK: shape("entries expired now; more: the batch was full", ("expired", int), ("more", flag))
    },
)
WAITLIST_LINES = ScriptSpec(
    "waitlist_lines",
    "How many wait in each named team's line.",
    keys=slots(("activity_line", "the line for any team ('<key>:<team>': a team's)")),
    args=(),
    more_args=Slot("team_ids", "the teams whose lines to count"),
    replies={OK: shape("the lengths, in the order named", Field("lengths", _ints, rest=True))},
)
WAITLIST_SERVE = ScriptSpec(
    "waitlist_serve",
    "Offer free seats of the activity's open teams to its line for any team.",
    keys=PICK_KEYS,
    args=PICK_ARGV,
    replies={OK: shape("seats offered now (call again while any)", ("offered", int))},
)
CONTRACTS = (
    WAITLIST_JOIN,
    WAITLIST_READ,
    WAITLIST_LEAVE,
    WAITLIST_EXPIRE,
    WAITLIST_LINES,
    WAITLIST_SERVE,
)
# Calls of waitlist_serve after a raise of the stock: each one fills up to 8 teams.
_SERVE_ROUNDS = 100


async def waitlist_join(
    teams: TeamScripts, activity_id: str, team_id: str, user_id: str, force: bool = False
) -> TeamReply:
    """waitlist_join ('' team_id: any team)."""
    keys = WAITLIST_JOIN.key_list(
        *teams.team(activity_id, team_id), user_lock=teams.keys.user_lock(activity_id, user_id)
    )
    args = teams.team_args(activity_id, team_id, user_id=user_id, force="1" if force else "0")
    return await WAITLIST_JOIN.run(teams.caller, keys, args)


async def waitlist_read(teams: TeamScripts, activity_id: str, user_id: str) -> TeamReply:
    """waitlist_read."""
    keys = WAITLIST_READ.key_list(
        teams.keys.activity_keys(activity_id), user_lock=teams.keys.user_lock(activity_id, user_id)
    )
    args = {"user_id": user_id, "shift_ms": teams.clock.shift_ms}
    return await WAITLIST_READ.run(teams.caller, keys, args)


async def waitlist_leave(teams: TeamScripts, activity_id: str, user_id: str) -> TeamReply:
    """waitlist_leave."""
    keys = WAITLIST_LEAVE.key_list(teams.keys.activity_keys(activity_id))
    return await WAITLIST_LEAVE.run(teams.caller, keys, {"user_id": user_id})


async def line_lengths(
    teams: TeamScripts, activity_id: str, team_ids: Sequence[str]
) -> dict[str, int]:
    """How many wait in each team's line (one page of teams: one ZCARD each)."""
    if not team_ids:
        return {}
    keys = WAITLIST_LINES.key_list(activity_line=teams.keys.line(activity_id))
    reply = await WAITLIST_LINES.run(teams.caller, keys, {}, team_ids)
    return dict(zip(team_ids, reply.lengths, strict=True))


async def serve_line(teams: TeamScripts, activity_id: str) -> int:
    """Offer free seats to the activity's line for any team while units and seats allow
    (after a raise of the stock); how many were offered."""
    total = 0
    for _ in range(_SERVE_ROUNDS):
        keys = WAITLIST_SERVE.key_list(teams.keys.activity_keys(activity_id))
        reply = await WAITLIST_SERVE.run(
            teams.caller, keys, teams.pick_args(activity_id, 1, ("", ""))
        )
        total += int(reply.offered)
        if not reply.offered:
            break
    return total


async def expire_entries(teams: TeamScripts, activity_id: str, batch: int) -> int:
    """End the activity's waiting entries whose time ran out (one waitlist.expired each),
    `batch` per script call: the lock sweep's waitlist pass."""
    total = 0
    while True:
        reply = await WAITLIST_EXPIRE.run(
            teams.caller,
            WAITLIST_EXPIRE.key_list(*teams.team(activity_id, "")),
            teams.team_args(activity_id, "", batch=batch),
        )
        total += int(reply.expired)
        if not reply.more:
            return total


class Waitlist:
    """The waitlist's operations: `await waitlist.join(activity_id, user_id, team_id)`."""

    def __init__(
        self,
        teams: TeamScripts,
        lock: SeatLock,
        join: SeatJoin,
        activities: ActivityCopy,
        history: TeamHistory,
        recovery: MissingTeam,
    ) -> None:
        self._teams = teams
        self._lock = lock
        self._join = join
        self._activities = activities
        self._history = history
        self._recovery = recovery

    async def join(self, activity_id: str, user_id: str, team_id: str | None = None) -> Outcome:
        """A seat lock now when one is free and nobody waits (as a lock or join answers it),
        else the user's place in line (`status` queued), or the offer the line made."""
        force = False
        for _ in range(_ATTEMPTS):
            reply = await self._queue(activity_id, team_id or "", user_id, force)
            if reply.code is not TeamCode.TAKE_SEAT:
                break
            try:
                if team_id:
                    return await self._lock(activity_id, team_id, user_id)
                return await self._join(activity_id, user_id)
            except _NO_SEAT:
                force = True  # another caller took the seat first: queue
        else:
            raise errors.Conflict("the seats kept changing during every attempt; retry")
        if reply.code is TeamCode.QUEUED:
            if reply.new:
                WAITLIST_ENTRIES.labels(outcome="queued").inc()
            return Outcome(queued_body(user_id, reply), False)
        if reply.code is TeamCode.OFFERED:
            return Outcome(offered_body(user_id, reply), False)
        await self._refuse(reply, activity_id, team_id or "", user_id)

    async def read(self, activity_id: str, user_id: str) -> WaitlistQueued | WaitlistOffered:
        """The user's entry or offer, else NotWaiting (ActivityNotFound for no activity)."""
        reply = await waitlist_read(self._teams, activity_id, user_id)
        if reply.code is TeamCode.QUEUED:
            return queued_body(user_id, reply)
        if reply.code is TeamCode.OFFERED:
            return offered_body(user_id, reply)
        await self._activities.row(activity_id)  # an unknown activity is a 404 of its own
        raise errors.NotWaiting(f"user {user_id!r} is not waiting in activity {activity_id!r}")

    async def leave(self, activity_id: str, user_id: str) -> bool:
        """Take the user's entry out of the line; whether they were waiting."""
        reply = await waitlist_leave(self._teams, activity_id, user_id)
        if reply.removed:
            WAITLIST_ENTRIES.labels(outcome="removed").inc()
        return bool(reply.removed)

    async def lines(self, activity_id: str, team_ids: Sequence[str]) -> dict[str, int]:
        """How many wait in each team's line (a page of teams, one ZCARD each)."""
        return await line_lengths(self._teams, activity_id, team_ids)

    async def _queue(self, activity_id: str, team_id: str, user_id: str, force: bool) -> TeamReply:
        """waitlist_join, bringing back from SQL an activity or team Redis lost."""
        restored = copied = False
        while True:
            reply = await waitlist_join(self._teams, activity_id, team_id, user_id, force)
            if reply.code is TeamCode.ACTIVITY_NOT_FOUND and not copied:
                copied = True
                await self._recovery.bring_back_activity(activity_id)
                continue
            if reply.code is TeamCode.TEAM_NOT_FOUND and not restored:
                restored = True
                if await self._recovery.bring_back(activity_id, team_id):
                    continue
            return reply

    async def _refuse(
        self, reply: TeamReply, activity_id: str, team_id: str, user_id: str
    ) -> NoReturn:
        """Raise the API error of a refusal of waitlist_join."""
        if reply.code is TeamCode.WAITLIST_FULL:
            raise_for(reply.code, f"{reply.max_len} entries wait already", max_len=reply.max_len)
        if reply.code is TeamCode.ALREADY_LOCKED:
            raise_for(
                reply.code,
                f"user {user_id!r} holds a live lock in team {reply.team_id!r}",
                team_id=reply.team_id,
            )
        if reply.code is TeamCode.TEAM_NOT_FOUND:
            await self._history.raise_for_missing_team(activity_id, team_id)
        refuse_for_user(reply, user_id)
        refuse_for_sale(reply)
        raise_for(reply.code)


def queued_body(user_id: str, reply: TeamReply) -> WaitlistQueued:
    """A place in line as the API shows it."""
    return {
        "status": "queued",
        "user_id": user_id,
        "team_id": reply.team_id or None,
        "position": reply.position,
        "queued_at": iso_ms(reply.queued_at_ms),
        "expires_at": iso_ms(reply.expires_at_ms),
    }


def offered_body(user_id: str, reply: TeamReply) -> WaitlistOffered:
    """The lock the line gave, as the API shows it."""
    return {
        "status": "offered",
        "user_id": user_id,
        "team_id": reply.team_id,
        "locked_at": iso_ms(reply.locked_at_ms),
        "expires_at": iso_ms(reply.expires_at_ms),
        "version": reply.version,
        "queued_at": iso_ms(reply.queued_at_ms),
    }
