"""Result codes of the team_* scripts; a refusal's name is its HTTP problem code."""

from __future__ import annotations

from enum import IntEnum

from groupbuy.errors import raise_for

__all__ = ["LOCKED", "TeamCode", "raise_for"]


class TeamCode(IntEnum):
    """Mirror of the code numbers in lua/_team_codes.lua. A refusal is named after the API
    error it becomes (TEAM_FULL: errors.TeamFull, problem team_full; `raise_for`)."""

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
    ACTIVITY_NOT_STARTED = 17
    ACTIVITY_ENDED = 18
    ACTIVITY_SOLD_OUT = 19
    NOT_A_MEMBER = 20
    ORDER_MISMATCH = 21
    LEFT_TEAM = 22  # the user left this team: no seat in it again
    INVALID_REQUEST = 23  # team_extend: a hold outside the activity's bounds (422)
    QUEUED = 24  # waitlist_join, waitlist_read: the user waits in line
    OFFERED = 25  # waitlist_join, waitlist_read: the line gave the user a seat lock
    TAKE_SEAT = 26  # waitlist_join: a seat is free now: lock (or join) instead of queueing
    WAITLIST_FULL = 27
    ALREADY_LOCKED = 28  # waitlist_join: the user holds a live lock in the activity
    NOT_WAITING = 29


# A lock's (or a join's, or a confirm's) new outcome, and the same again.
LOCKED = (TeamCode.OK, TeamCode.EXISTING)
