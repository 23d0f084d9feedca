"""The seat lock, whole: hold one free seat of a team for a user (team_lock).

Its script's spec, its script call, the operation (`SeatLock`, which the seat service hands
out as `seats.lock`) and its answer (`lock_outcome`, a join's answer too). What every
operation shares sits beside: the key groups and reply shapes (specs), the calling context
(scripts), the SQL answers once Redis let a team go (history).
"""

from __future__ import annotations

from groupbuy_client.wire import LockTaken, Outcome, iso_ms

from groupbuy import errors
from groupbuy.locks.codes import LOCKED, TeamCode, raise_for
from groupbuy.locks.funnel import counts_seats
from groupbuy.locks.history import MissingTeam, TeamHistory
from groupbuy.locks.refusals import refuse_for_user
from groupbuy.locks.sale import refuse_for_sale
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.specs import (
    EXISTING,
    OK,
    SALE_REFUSALS,
    SEAT_REFUSALS,
    TEAM_ARGV,
    TEAM_KEYS,
    USER_LOCK_SLOT,
    C,
)
from groupbuy.metrics import LOCK_OUTCOMES, counts_outcomes
from groupbuy.metrics import lock_outcome as lock_outcome_label
from groupbuy.storage.specs import ScriptSpec, optional_int, shape, slots

# A user switching teams needs a second call naming the old team; more tries than
# this means the same user is racing with themselves, and they may simply retry.
_SWITCH_ATTEMPTS = 5

TEAM_LOCK = ScriptSpec(
    "team_lock",
    "Hold one free seat of a team for a user, atomically.",
    keys=(
        *TEAM_KEYS,
        *slots(
            USER_LOCK_SLOT,
            ("other_hash", "hash of the team the caller believes the user holds a lock in"),
            ("other_locks", "locks zset of that team"),
        ),
    ),
    args=(
        *TEAM_ARGV,
        *slots(("user_id", "the user"), ("other_team_id", "that other team's id, or ''")),
    ),
    optional_keys=("other_hash", "other_locks"),
    replies={
        OK: shape(
            "a new lock; version: the team's after it",
            ("locked_at_ms", int),
            ("expires_at_ms", int),
            ("released_team_id", str),
            ("version", int),
            given=("team_id",),
        ),
        EXISTING: shape(
            "the user's unexpired lock on this team (unchanged)",
            ("locked_at_ms", int),
            ("expires_at_ms", int),
            ("version", int),
            given=("team_id",),
        ),
        C.TEAM_FULL: shape(
            "no free seat; the earliest lock's times ('' when every seat is a member)",
            ("earliest_locked_at_ms", optional_int),
            ("next_unlock_ms", optional_int),
        ),
        C.SWITCH_NEEDED: shape(
            "the user holds a live lock in team_id: call again naming it", ("team_id", str)
        ),
        **SEAT_REFUSALS,
        **SALE_REFUSALS,
    },
)


async def team_lock(
    teams: TeamScripts, activity_id: str, team_id: str, user_id: str, other_team_id: str
) -> TeamReply:
    """team_lock; `other_team_id` ('' for none) is the team the user may hold a lock in."""
    k = teams.keys
    other: dict[str, str] = {}
    if other_team_id:
        other_keys = k.team_keys(activity_id, other_team_id)
        other = {"other_hash": other_keys.hash, "other_locks": other_keys.locks}
    keys = TEAM_LOCK.key_list(
        *teams.team(activity_id, team_id),
        user_lock=k.user_lock(activity_id, user_id),
        **other,
    )
    args = teams.team_args(activity_id, team_id, user_id=user_id, other_team_id=other_team_id)
    return await TEAM_LOCK.run(teams.caller, keys, args, team_id=team_id)


class SeatLock:
    """Lock a seat: `await seats.lock(activity_id, team_id, user_id)`."""

    def __init__(self, teams: TeamScripts, history: TeamHistory, recovery: MissingTeam) -> None:
        self._teams = teams
        self._history = history
        self._recovery = recovery

    @counts_seats
    @counts_outcomes(LOCK_OUTCOMES, lock_outcome_label, "lock")
    async def __call__(self, activity_id: str, team_id: str, user_id: str) -> Outcome:
        """Hold a free seat of the team for the user (releasing their lock in another team)."""
        other = ""
        restored = copied = False
        for _ in range(_SWITCH_ATTEMPTS):
            reply = await team_lock(self._teams, activity_id, team_id, user_id, other)
            if reply.code is TeamCode.SWITCH_NEEDED:
                other = reply.team_id
                continue
            if reply.code is TeamCode.ACTIVITY_NOT_FOUND and not copied:
                # The activity's copy expired or was lost while a team lives: SQL has it,
                # with its status (404 when SQL does not know the activity either).
                copied = True
                await self._recovery.bring_back_activity(activity_id)
                continue
            if reply.code is TeamCode.TEAM_NOT_FOUND and not restored:
                restored = True
                if await self._recovery.bring_back(activity_id, team_id):
                    continue
            break
        else:
            raise errors.Conflict("the user's lock changed during every attempt; retry")

        if reply.code in LOCKED:
            return lock_outcome(user_id, reply)
        if reply.code is TeamCode.TEAM_FULL:
            raise_for(
                reply.code,
                f"team {team_id!r} has no free seat",
                next_unlock_at=iso_ms(reply.next_unlock_ms),
                earliest_locked_at=iso_ms(reply.earliest_locked_at_ms),
            )
        if reply.code is TeamCode.TEAM_NOT_FOUND:
            await self._history.raise_for_missing_team(activity_id, team_id)
        refuse_for_user(reply, user_id)
        refuse_for_sale(reply)
        raise_for(reply.code)


def lock_outcome(user_id: str, locked: TeamReply) -> Outcome:
    """The answer of a lock or a join: a new lock (OK), else the user's existing lock,
    unchanged (EXISTING)."""
    body: LockTaken = {
        "status": "locked",
        "user_id": user_id,
        "team_id": locked.team_id,
        "locked_at": iso_ms(locked.locked_at_ms),
        "expires_at": iso_ms(locked.expires_at_ms),
        "released_team_id": locked.get("released_team_id") or None,
        "version": locked.version,
    }
    if locked.code is TeamCode.EXISTING:
        body["existing"] = True
        return Outcome(body, False)
    return Outcome(body, True)
