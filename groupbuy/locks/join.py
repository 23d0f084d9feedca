"""The join, whole: lock a free seat in the open team closest to forming (team_join).

Its script's spec, its script call and the operation (`SeatJoin`, which the seat service
hands out as `seats.join`); a join answers as a lock does (groupbuy.locks.lock's
`lock_outcome`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from groupbuy_client.wire import Outcome, iso_ms

from groupbuy.locks.codes import LOCKED, TeamCode, raise_for
from groupbuy.locks.funnel import counts_seats
from groupbuy.locks.history import MissingTeam
from groupbuy.locks.lock import lock_outcome
from groupbuy.locks.refusals import refuse_for_user
from groupbuy.locks.sale import refuse_for_sale
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.specs import (
    ACTIVITY_CLOSED,
    ACTIVITY_NOT_FOUND,
    BLOCKED,
    CLOSED,
    EXISTING,
    LOOK_FURTHER,
    NO_ACTIVITY,
    OK,
    OVER_LIMIT,
    PICK_ARGV,
    PICK_KEYS,
    SALE_REFUSALS,
    USER_BLOCKED,
    USER_LIMIT_REACHED,
    USER_LOCK_SLOT,
    C,
)
from groupbuy.metrics import LOCK_OUTCOMES, counts_outcomes
from groupbuy.metrics import lock_outcome as lock_outcome_label
from groupbuy.settings import TeamSettings
from groupbuy.storage.specs import ScriptSpec, Slot, optional_int, shape, slots

_JOINED = (("team_id", str), ("locked_at_ms", int), ("expires_at_ms", int), ("version", int))
TEAM_JOIN = ScriptSpec(
    "team_join",
    "Lock a free seat in the open team closest to forming (自动拼团).",
    keys=(*PICK_KEYS, *slots(USER_LOCK_SLOT)),
    args=(*PICK_ARGV, Slot("user_id", "the user")),
    replies={
        OK: shape("a new lock in team_id", *_JOINED),
        EXISTING: shape("the user's live lock in the activity (unchanged)", *_JOINED),
        C.NO_TEAM_AVAILABLE: shape(
            "no open team has a free seat; when the earliest lock expires ('' for none)",
            ("next_unlock_ms", optional_int),
        ),
        LOOK_FURTHER: shape(
            "call again from this cursor ('' '' from the top)",
            ("score", str),
            ("team_id", str),
        ),
        USER_LIMIT_REACHED: OVER_LIMIT,
        ACTIVITY_NOT_FOUND: NO_ACTIVITY,
        USER_BLOCKED: BLOCKED,
        ACTIVITY_CLOSED: CLOSED,
        **SALE_REFUSALS,
    },
)


async def team_join(
    teams: TeamScripts, activity_id: str, user_id: str, candidates: int, cursor: Sequence[Any]
) -> TeamReply:
    """team_join from `cursor` (score, team_id; '' '' from the top)."""
    keys = TEAM_JOIN.key_list(
        teams.keys.activity_keys(activity_id),
        user_lock=teams.keys.user_lock(activity_id, user_id),
    )
    args = teams.pick_args(activity_id, candidates, cursor, user_id=user_id)
    return await TEAM_JOIN.run(teams.caller, keys, args)


class SeatJoin:
    """Join any open team: `await seats.join(activity_id, user_id)`."""

    def __init__(self, teams: TeamScripts, defaults: TeamSettings, recovery: MissingTeam) -> None:
        self._teams = teams
        self._defaults = defaults
        self._recovery = recovery

    @counts_seats
    @counts_outcomes(LOCK_OUTCOMES, lock_outcome_label, "join")
    async def __call__(self, activity_id: str, user_id: str) -> Outcome:
        """Hold a free seat for the user in the open team of the activity closest to forming
        (most members + live locks, then the oldest); the user's live lock in the activity,
        wherever it is, is the answer instead (`existing`)."""
        cursor: tuple[str, str] = ("", "")
        join = partial(team_join, self._teams, activity_id, user_id, self._defaults.join_candidates)
        while True:
            # Each call looks at a bounded number of teams; a long way down the index (the
            # user belongs to many of the first teams) takes several calls.
            reply: TeamReply = await join(cursor)
            if reply.code is TeamCode.ACTIVITY_NOT_FOUND:
                await self._recovery.bring_back_activity(activity_id)
                reply = await join(cursor)
            if reply.code is not TeamCode.LOOK_FURTHER:
                break
            cursor = (reply.score, reply.team_id)
        if reply.code in LOCKED:
            # Joining never releases a lock: a live one anywhere is the answer (EXISTING).
            return lock_outcome(user_id, reply)
        if reply.code is TeamCode.NO_TEAM_AVAILABLE:
            raise_for(
                reply.code,
                f"no open team of activity {activity_id!r} has a free seat for {user_id!r}",
                next_unlock_at=iso_ms(reply.next_unlock_ms),
            )
        refuse_for_user(reply, user_id)
        refuse_for_sale(reply)
        raise_for(reply.code)
