"""The API bodies of an activity, built from its SQL row (an operation's own answer sits
in its module: a lock's in groupbuy.locks.lock)."""

from __future__ import annotations

from typing import Any

from groupbuy.locks.models import ActivityRow
from groupbuy.wire import iso_ms, to_ms


def activity_body(row: ActivityRow) -> dict[str, Any]:
    """An activity as the API shows it."""
    return {
        "activity_id": row.activity_id,
        "name": row.name,
        "team_size": row.team_size,
        "lock_ttl_s": row.lock_ttl_s,
        "team_deadline_s": row.team_deadline_s,
        "virtual_completion": virtual_body(row.virtual_min_members),
        "limits": limits_body(row.teams_per_user, row.open_teams_per_leader),
        "created_at": iso_ms(to_ms(row.created_at)),
        "status": row.status,
    }


def virtual_body(min_members: int | None) -> dict[str, int] | None:
    """An activity's `virtual_completion` as the API shows it."""
    return None if min_members is None else {"min_members": min_members}


def limits_body(teams_per_user: int | None, open_per_leader: int | None) -> dict[str, Any] | None:
    """An activity's `limits` as the API shows it (null when it sets none)."""
    if teams_per_user is None and open_per_leader is None:
        return None
    return {"teams_per_user": teams_per_user, "open_teams_per_leader": open_per_leader}
