"""One shape for a team, whichever store it is read from, and its API body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from groupbuy.storage.timefmt import iso_ms


@dataclass(frozen=True)
class TeamView:
    """A team as either store holds it (Redis live, SQL once ended), in one shape."""

    activity_id: str
    team_id: str
    leader_id: str
    status: str
    size: int
    members: list[tuple[str, str | None, int]]  # (user, order, joined_at_ms), joining order
    locks: list[tuple[str, int]]  # (user, locked_at_ms), oldest first; unexpired only
    lock_ttl_ms: int
    deadline_ms: int
    formed_ms: int | None
    failed_ms: int | None

    def body(self) -> dict[str, Any]:
        """The API's team JSON (SPEC §3: members + locks + free_seats == size while open)."""
        ttl = self.lock_ttl_ms
        is_open = self.status == "open"
        return {
            "activity_id": self.activity_id,
            "team_id": self.team_id,
            "leader_id": self.leader_id,
            "status": self.status,
            "size": self.size,
            "members": [
                {"user_id": user, "order_id": order, "joined_at": iso_ms(at)}
                for user, order, at in self.members
            ],
            "locks": [
                {"user_id": user, "locked_at": iso_ms(at), "expires_at": iso_ms(at + ttl)}
                for user, at in self.locks
            ],
            "free_seats": self.size - len(self.members) - len(self.locks) if is_open else 0,
            "next_unlock_at": iso_ms(self.locks[0][1] + ttl) if self.locks else None,
            "deadline_at": iso_ms(self.deadline_ms),
            "formed_at": iso_ms(self.formed_ms),
            "failed_at": iso_ms(self.failed_ms),
        }
