"""The API bodies of an activity, built from its SQL row (an operation's own answer sits
in its module: a lock's in groupbuy.locks.lock)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from groupbuy_client.wire import SaleStatus, iso_ms, to_ms

from groupbuy.locks.models import ActivityRow


def activity_body(row: ActivityRow, counts: Mapping[str, int]) -> dict[str, Any]:
    """An activity as the API shows it, with its live `counts` (activity_counts' fields and
    `now_ms`, Redis's clock when they were read: the status is judged on it)."""
    body: dict[str, Any] = {
        "activity_id": row.activity_id,
        "name": row.name,
        "team_size": row.team_size,
        "lock_ttl_s": row.lock_ttl_s,
        "team_deadline_s": row.team_deadline_s,
        "virtual_completion": virtual_body(row.virtual_min_members),
        "limits": limits_body(row.teams_per_user, row.open_teams_per_leader),
        "created_at": iso_ms(to_ms(row.created_at)),
        "status": sale_status(row, counts["now_ms"]),
        "max_hold_s": row.max_hold_s,
        "late_confirm": row.late_confirm,
        "waitlist": row.waitlist,
        "waiting": counts["waiting"],
        "waiting_any_team": counts["waiting_any_team"],
        "oldest_waiting_since": _queued_at(counts, row.waitlist["ttl_s"]),
        **{name: value for name, value in counts.items() if name not in _NOT_SHOWN},
    }
    if row.starts_at is not None:
        body["starts_at"] = iso_ms(to_ms(row.starts_at))
    if row.ends_at is not None:
        body["ends_at"] = iso_ms(to_ms(row.ends_at))
    if row.stock is not None:
        held = counts["members"] + counts["live_locks"]
        body["stock"] = row.stock
        body["stock_left"] = max(0, row.stock - held)
        body["stock_held_by_locks"] = counts["live_locks"]
    return body


# The counts that are not fields of the body as they are, or are placed before.
_NOT_SHOWN = ("now_ms", "oldest_entry_expires_ms", "waiting", "waiting_any_team")


def _queued_at(counts: Mapping[str, int], ttl_s: int) -> str | None:
    """When the oldest waiting entry queued (every entry waits ttl_s), or None."""
    expires = counts.get("oldest_entry_expires_ms", -1)
    return None if expires < 0 else iso_ms(expires - ttl_s * 1000)


def sale_status(row: ActivityRow, now_ms: int) -> SaleStatus:
    """closed (an admin closed it) wins; then ended (at or after ends_at), scheduled (before
    starts_at), else open."""
    if row.status == "closed":
        return "closed"
    if row.ends_at is not None and now_ms >= to_ms(row.ends_at):
        return "ended"
    if row.starts_at is not None and now_ms < to_ms(row.starts_at):
        return "scheduled"
    return "open"


def virtual_body(min_members: int | None) -> dict[str, int] | None:
    """An activity's `virtual_completion` as the API shows it."""
    return None if min_members is None else {"min_members": min_members}


def limits_body(teams_per_user: int | None, open_per_leader: int | None) -> dict[str, Any] | None:
    """An activity's `limits` as the API shows it (null when it sets none)."""
    if teams_per_user is None and open_per_leader is None:
        return None
    return {"teams_per_user": teams_per_user, "open_teams_per_leader": open_per_leader}
