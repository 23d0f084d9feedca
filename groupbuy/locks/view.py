"""One shape for a team, whichever store it is read from, and its API body."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from groupbuy_client.wire import Member, Team, TeamStatus, iso_ms, to_ms

from groupbuy.locks.codec import LEFT_FIELD, parse_leave, parse_member
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.storage.specs import optional_int, reply_dict


class TeamSnapshot(NamedTuple):
    """A team as a team script answers it (see `snapshot` in lua/_team_lib.lua): the team
    hash, the members hash (user -> member value), the locks as a flat [user, locked_at_ms,
    ...] list, oldest first."""

    team: dict[str, str]
    members: dict[str, str]
    locks: list[Any]


def snapshot(values: list[Any]) -> TeamSnapshot:
    """The three lists a team script answers a team with (a reply's last field)."""
    team, members, locks = values
    return TeamSnapshot(reply_dict(team), reply_dict(members), list(locks))


def listing(page: list[Any]) -> list[tuple[str, TeamSnapshot]]:
    """team_list's page: (team_id, snapshot) of each team."""
    return [(team_id, snapshot(rest)) for team_id, *rest in page]


# A status read from Redis or SQL, as the wire names it (an unknown one is a bug: KeyError).
STATUSES: dict[str, TeamStatus] = {"open": "open", "formed": "formed", "failed": "failed"}


@dataclass(frozen=True)
class TeamView:
    """A team as either store holds it (Redis live, SQL once ended), in one shape."""

    activity_id: str
    team_id: str
    leader_id: str
    status: TeamStatus
    size: int
    members: list[tuple[str, str | None, int]]  # (user, order, joined_at_ms), joining order
    # (user, locked_at_ms, expires_at_ms), the first to expire first; unexpired only
    locks: list[tuple[str, int, int]]
    lock_ttl_ms: int
    deadline_ms: int
    formed_ms: int | None
    failed_ms: int | None
    version: int  # the team's changes so far (SPEC §3); a newer body has a larger one
    virtual_seats: int  # seats counted as filled by virtual completion (0 otherwise)
    # members of a formed team the shop refunded (still listed): user -> refunded_at ms
    refunded: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_redis(
        cls,
        activity_id: str,
        team_id: str,
        team: dict[str, str],
        members: dict[str, str],
        locks: list[Any],
    ) -> TeamView:
        """From a team_read reply: the team hash, the members hash (user -> member value)
        and the locks as a flat [user, locked_at_ms, ...] list, oldest first."""
        joined = sorted(
            ((parse_member(value), user) for user, value in members.items()),
            key=lambda item: item[0].seq,
        )
        return cls(
            activity_id=activity_id,
            team_id=team_id,
            leader_id=team["leader_id"],
            status=STATUSES[team["status"]],
            size=int(team["size"]),
            members=[(user, m.order_id, m.joined_at_ms) for m, user in joined],
            locks=_locks(team, locks),
            lock_ttl_ms=int(team["lock_ttl_ms"]),
            deadline_ms=int(team["deadline_ms"]),
            formed_ms=optional_int(team.get("formed_ms")),
            failed_ms=optional_int(team.get("failed_ms")),
            version=int(team.get("version", 0)),
            virtual_seats=int(team.get("virtual_seats", 0)),
            refunded=_refunded(team),
        )

    @classmethod
    def from_snapshot(cls, activity_id: str, team_id: str, found: TeamSnapshot) -> TeamView:
        """From a team script's reply (its `team` field)."""
        return cls.from_redis(activity_id, team_id, *found)

    @classmethod
    def from_rows(cls, team: TeamRow, members: Sequence[MemberRow]) -> TeamView:
        """From the SQL record of an ended (or Redis-forgotten) team; members in seq order,
        its version the highest its applied records carry. A member who left an open team
        is not listed (SQL keeps the row, with left_at); a refunded one is, with its time."""
        members = [m for m in members if m.left_at is None]
        return cls(
            activity_id=team.activity_id,
            team_id=team.team_id,
            leader_id=team.leader_id,
            status=STATUSES[team.status],
            size=team.size,
            members=[(m.user_id, m.order_id, to_ms(m.joined_at)) for m in members],
            locks=[],  # locks live only in Redis
            lock_ttl_ms=0,
            deadline_ms=to_ms(team.deadline_at),
            formed_ms=to_ms(team.formed_at) if team.formed_at else None,
            failed_ms=to_ms(team.failed_at) if team.failed_at else None,
            version=team.version,
            # a formed team short of members was formed by virtual completion
            virtual_seats=team.size - len(members) if team.status == "formed" else 0,
            refunded={m.user_id: to_ms(m.refunded_at) for m in members if m.refunded_at},
        )

    def body(self) -> Team:
        """The API's team JSON (SPEC §3: members + locks + free_seats == size while open)."""
        is_open = self.status == "open"
        return {
            "activity_id": self.activity_id,
            "team_id": self.team_id,
            "leader_id": self.leader_id,
            "status": self.status,
            "size": self.size,
            "members": [self._member(user, order, at) for user, order, at in self.members],
            "locks": [
                {"user_id": user, "locked_at": iso_ms(at), "expires_at": iso_ms(expires)}
                for user, at, expires in self.locks
            ],
            "free_seats": self.size - len(self.members) - len(self.locks) if is_open else 0,
            "next_unlock_at": iso_ms(self.locks[0][2]) if self.locks else None,
            "deadline_at": iso_ms(self.deadline_ms),
            "formed_at": iso_ms(self.formed_ms),
            "failed_at": iso_ms(self.failed_ms),
            "virtual_seats": self.virtual_seats,
            "version": self.version,
        }

    def _member(self, user: str, order: str | None, joined_ms: int) -> Member:
        member: Member = {"user_id": user, "order_id": order, "joined_at": iso_ms(joined_ms)}
        if user in self.refunded:
            member["refunded_at"] = iso_ms(self.refunded[user])
        return member


def _refunded(team: dict[str, str]) -> dict[str, int]:
    """The refunded members a team hash remembers: user -> refunded_at ms."""
    refunded = {}
    for name, value in team.items():
        if name.startswith(LEFT_FIELD):
            leave = parse_leave(value)
            if leave.kind == "refunded":
                refunded[name[len(LEFT_FIELD) :]] = leave.at_ms
    return refunded


def _locks(team: dict[str, str], flat: list[Any]) -> list[tuple[str, int, int]]:
    """(user, locked_at_ms, expires_at_ms) of a team_read's locks: each scored by its expiry
    minus the team's lock_ttl_ms, an extended one's locked_at in the team hash
    ("Extended locks" in lua/_team_lib.lua)."""
    ttl = int(team["lock_ttl_ms"])
    locks = []
    for user, score in zip(flat[0::2], flat[1::2], strict=True):
        start = int(float(score))
        locked_at = int(team.get(f"locked_at:{user}", start))
        locks.append((user, locked_at, start + ttl))
    return locks
