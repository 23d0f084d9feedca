"""Result codes of the team_* scripts and the one place that turns them into errors."""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NoReturn

from groupbuy import errors


class TeamCode(IntEnum):
    """Mirror of the code numbers at the end of lua/_team_lib.lua."""

    OK = 0
    EXISTING = 1
    TEAM_FULL = 2
    ALREADY_MEMBER = 3
    TEAM_FORMED = 4
    TEAM_FAILED = 5
    TEAM_NOT_FOUND = 6
    ACTIVITY_NOT_FOUND = 7
    LOCK_REQUIRED = 8
    CONFLICT = 9
    SWITCH_NEEDED = 10
    NO_LOCK = 11
    NO_TEAM_AVAILABLE = 12
    LOOK_FURTHER = 13  # team_join, activity_counts: call again (from the cursor it answered)
    USER_LIMIT_REACHED = 14
    USER_BLOCKED = 15
    ACTIVITY_CLOSED = 16


_ERRORS: dict[TeamCode, type[errors.GroupBuyError]] = {
    TeamCode.TEAM_FULL: errors.TeamFull,
    TeamCode.ALREADY_MEMBER: errors.AlreadyMember,
    TeamCode.TEAM_FORMED: errors.TeamFormed,
    TeamCode.TEAM_FAILED: errors.TeamFailed,
    TeamCode.TEAM_NOT_FOUND: errors.TeamNotFound,
    TeamCode.ACTIVITY_NOT_FOUND: errors.ActivityNotFound,
    TeamCode.LOCK_REQUIRED: errors.LockRequired,
    TeamCode.CONFLICT: errors.Conflict,
    TeamCode.NO_LOCK: errors.NoLock,
    TeamCode.NO_TEAM_AVAILABLE: errors.NoTeamAvailable,
    TeamCode.USER_LIMIT_REACHED: errors.UserLimitReached,
    TeamCode.USER_BLOCKED: errors.UserBlocked,
    TeamCode.ACTIVITY_CLOSED: errors.ActivityClosed,
}


def split_reply(reply: list[Any]) -> tuple[TeamCode, list[Any]]:
    """(code, rest) of a script reply; an unknown code is a bug and raises."""
    return TeamCode(int(reply[0])), list(reply[1:])


def raise_for(code: TeamCode, detail: str | None = None, **extra: Any) -> NoReturn:
    """Raise the API error that a failure code stands for."""
    error = _ERRORS.get(code)
    if error is None:
        raise RuntimeError(f"script code {code!r} has no error mapping")
    raise error(detail, **extra)
