"""The team scripts' replies, parsed into one frozen dataclass per reply shape.

A script answers a flat `{code, ...}` list (see its contract in
groupbuy/locks/script_contracts.py); the parsers below are the only code that reads such a
list by position. Every reply is a `TeamReply` (its code); a shape with fields is a
subclass, so a caller checks `code` or the class and reads the fields by name. A code the
shape does not expect, or a reply with more or fewer fields than its shape, is a bug and
raises ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from groupbuy.locks.codec import PageCursor
from groupbuy.locks.codes import TeamCode, split_reply
from groupbuy.locks.view import TeamView
from groupbuy.storage.scripts import optional_int, reply_dict


@dataclass(frozen=True)
class TeamReply:
    """A reply that is its code alone (a refusal, or an outcome with nothing to add)."""

    code: TeamCode


@dataclass(frozen=True)
class LimitReached(TeamReply):
    """`{USER_LIMIT_REACHED, limit, current, name}`: the user is at one of the activity's
    limits (`teams_per_user` or `open_teams_per_leader`)."""

    limit: int
    current: int
    limit_name: str


@dataclass(frozen=True)
class Opened(TeamReply):
    """team_open's OK (opened now) or EXISTING (opened before): the team as it is now."""

    team: TeamView


@dataclass(frozen=True)
class Locked(TeamReply):
    """team_lock's or team_join's OK (a new lock) or EXISTING (the user's live lock)."""

    team_id: str
    locked_at_ms: int
    expires_at_ms: int
    version: int
    released_team_id: str  # the lock this one replaced ('' for none, or EXISTING)


@dataclass(frozen=True)
class SeatsTaken(TeamReply):
    """team_lock's TEAM_FULL: when the earliest lock was taken and expires (None when
    every seat is a member)."""

    earliest_locked_at_ms: int | None
    next_unlock_ms: int | None


@dataclass(frozen=True)
class SwitchNeeded(TeamReply):
    """team_lock's SWITCH_NEEDED: the user holds a lock in `team_id`; call again naming it."""

    team_id: str


@dataclass(frozen=True)
class Unlocked(TeamReply):
    """team_unlock's OK: whether a live lock was released."""

    released: bool


@dataclass(frozen=True)
class Confirmed(TeamReply):
    """team_confirm's OK or EXISTING: whether this user's confirm formed the team, and the
    team after the call."""

    formed: bool
    team: TeamView


@dataclass(frozen=True)
class TeamRead(TeamReply):
    """team_read's OK: Redis's time of the read and the team after the lazy checks."""

    now_ms: int
    team: TeamView


@dataclass(frozen=True)
class Swept(TeamReply):
    """team_sweep's OK: the locks it expired, the team's status, whether this call ended it."""

    locks_expired: int
    status: str
    ended_now: bool


@dataclass(frozen=True)
class NoSeatFree(TeamReply):
    """team_join's NO_TEAM_AVAILABLE: when the activity's earliest lock expires, if any."""

    next_unlock_ms: int | None


@dataclass(frozen=True)
class LookFurther(TeamReply):
    """team_join's LOOK_FURTHER: call again from this cursor ('' '' from the top)."""

    score: str
    team_id: str

    @property
    def cursor(self) -> tuple[str, str]:
        """The cursor to hand the next call."""
        return self.score, self.team_id


@dataclass(frozen=True)
class Listed(TeamReply):
    """team_list's OK: the teams of the page, and where the next page starts (None after
    the last one)."""

    teams: list[TeamView]
    next: PageCursor | None


@dataclass(frozen=True)
class UserLock(TeamReply):
    """user_lock_read's OK: the team the user holds a live lock in, and its times."""

    team_id: str
    locked_at_ms: int
    expires_at_ms: int


OpenReply = Opened | LimitReached | TeamReply
LockReply = Locked | SeatsTaken | SwitchNeeded | LimitReached | TeamReply
ConfirmReply = Confirmed | LimitReached | TeamReply
JoinReply = Locked | NoSeatFree | LookFurther | LimitReached | TeamReply


def _bare(code: TeamCode, rest: list[Any]) -> TeamReply:
    """A reply without a shape of its own: the limit refusal, or a code alone."""
    if code is TeamCode.USER_LIMIT_REACHED:
        limit, current, name = rest
        return LimitReached(code, int(limit), int(current), str(name))
    if rest:
        raise ValueError(f"reply {code.name} carries unexpected fields {rest!r}")
    return TeamReply(code)


def _team(activity_id: str, team_id: str, snapshot: list[Any]) -> TeamView:
    """A team from the three lists a team script answers it with (the team hash, the
    members hash, the locks oldest first; see `snapshot` in lua/_team_lib.lua)."""
    team, members, locks = snapshot
    return TeamView.from_redis(activity_id, team_id, reply_dict(team), reply_dict(members), locks)


def parse_open(reply: list[Any], activity_id: str, team_id: str) -> OpenReply:
    """team_open's reply."""
    code, rest = split_reply(reply)
    if code in (TeamCode.OK, TeamCode.EXISTING):
        return Opened(code, _team(activity_id, team_id, rest))
    return _bare(code, rest)


def parse_lock(reply: list[Any], team_id: str) -> LockReply:
    """team_lock's reply."""
    code, rest = split_reply(reply)
    if code is TeamCode.OK:
        locked_at, expires_at, released, version = rest
        return Locked(code, team_id, int(locked_at), int(expires_at), int(version), released)
    if code is TeamCode.EXISTING:
        locked_at, expires_at, version = rest
        return Locked(code, team_id, int(locked_at), int(expires_at), int(version), "")
    if code is TeamCode.TEAM_FULL:
        earliest, next_unlock = rest
        return SeatsTaken(code, optional_int(earliest), optional_int(next_unlock))
    if code is TeamCode.SWITCH_NEEDED:
        (other,) = rest
        return SwitchNeeded(code, other)
    return _bare(code, rest)


def parse_unlock(reply: list[Any]) -> Unlocked | TeamReply:
    """team_unlock's reply."""
    code, rest = split_reply(reply)
    if code is TeamCode.OK:
        (released,) = rest
        return Unlocked(code, bool(int(released)))
    return _bare(code, rest)


def parse_confirm(reply: list[Any], activity_id: str, team_id: str) -> ConfirmReply:
    """team_confirm's reply."""
    code, rest = split_reply(reply)
    if code in (TeamCode.OK, TeamCode.EXISTING):
        formed, *snapshot = rest
        return Confirmed(code, bool(int(formed)), _team(activity_id, team_id, snapshot))
    return _bare(code, rest)


def parse_read(reply: list[Any], activity_id: str, team_id: str) -> TeamRead | TeamReply:
    """team_read's reply."""
    code, rest = split_reply(reply)
    if code is TeamCode.OK:
        now_ms, *snapshot = rest
        return TeamRead(code, int(now_ms), _team(activity_id, team_id, snapshot))
    return _bare(code, rest)


def parse_sweep(reply: list[Any]) -> Swept | TeamReply:
    """team_sweep's reply."""
    code, rest = split_reply(reply)
    if code is TeamCode.OK:
        expired, status, ended_now = rest
        return Swept(code, int(expired), str(status), bool(int(ended_now)))
    return _bare(code, rest)


@dataclass(frozen=True)
class Counts(TeamReply):
    """activity_counts' OK: the activity's live counts at the call's instant."""

    teams_open: int
    teams_formed: int
    teams_failed: int
    members: int  # of open and formed teams, leaders included
    live_locks: int
    virtual_completions: int

    def body(self) -> dict[str, int]:
        """The counts as the activity's API body carries them."""
        return {
            "teams_open": self.teams_open,
            "teams_formed": self.teams_formed,
            "teams_failed": self.teams_failed,
            "members": self.members,
            "live_locks": self.live_locks,
            "virtual_completions": self.virtual_completions,
        }


def parse_counts(reply: list[Any]) -> Counts | TeamReply:
    """activity_counts' reply: OK with the counts, LOOK_FURTHER, ACTIVITY_NOT_FOUND."""
    code, rest = split_reply(reply)
    if code is TeamCode.OK:
        opened, formed, failed, members, live, virtual = (int(v) for v in rest)
        return Counts(code, opened, formed, failed, members, live, virtual)
    return _bare(code, rest)


def parse_restore(reply: list[Any]) -> TeamReply:
    """team_restore's reply: OK rebuilt, EXISTING Redis has the team."""
    code, rest = split_reply(reply)
    return _bare(code, rest)


def parse_join(reply: list[Any]) -> JoinReply:
    """team_join's reply."""
    code, rest = split_reply(reply)
    if code in (TeamCode.OK, TeamCode.EXISTING):
        team_id, locked_at, expires_at, version = rest
        return Locked(code, team_id, int(locked_at), int(expires_at), int(version), "")
    if code is TeamCode.NO_TEAM_AVAILABLE:
        (next_unlock,) = rest
        return NoSeatFree(code, optional_int(next_unlock))
    if code is TeamCode.LOOK_FURTHER:
        score, team_id = rest
        return LookFurther(code, str(score), team_id)
    return _bare(code, rest)


def parse_list(reply: list[Any], activity_id: str) -> Listed | TeamReply:
    """team_list's reply."""
    code, rest = split_reply(reply)
    if code is TeamCode.OK:
        score, team_id, page = rest
        teams = [_team(activity_id, listed, snapshot) for listed, *snapshot in page]
        return Listed(code, teams, PageCursor(int(score), team_id) if team_id else None)
    return _bare(code, rest)


def parse_user_lock(reply: list[Any]) -> UserLock | TeamReply:
    """user_lock_read's reply."""
    code, rest = split_reply(reply)
    if code is TeamCode.OK:
        team_id, locked_at, expires_at = rest
        return UserLock(code, team_id, int(locked_at), int(expires_at))
    return _bare(code, rest)
