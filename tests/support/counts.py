"""What an activity's live counts must be, worked out from its teams as each reads itself."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from groupbuy.services import Services

COUNT_FIELDS = (
    "teams_open",
    "teams_formed",
    "teams_failed",
    "members",
    "live_locks",
    "virtual_completions",
)


def counts_of(body: dict[str, Any]) -> dict[str, int]:
    """The counts an activity body carries."""
    return {name: body[name] for name in COUNT_FIELDS}


def counts_from_teams(teams: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The counts that the teams' own bodies say (SPEC §3 Activities)."""
    listed = list(teams)
    by = {status: [t for t in listed if t["status"] == status] for status in ("open", "formed")}
    return {
        "teams_open": len(by["open"]),
        "teams_formed": len(by["formed"]),
        "teams_failed": sum(1 for t in listed if t["status"] == "failed"),
        "members": sum(len(t["members"]) for t in by["open"] + by["formed"]),
        "live_locks": sum(len(t["locks"]) for t in by["open"]),
        "virtual_completions": sum(1 for t in by["formed"] if t["virtual_seats"] > 0),
    }


async def check_counts(services: Services, activity_id: str, team_ids: Iterable[str]) -> None:
    """The activity's counts, read first (the read applies what time did), equal what its
    teams say when each is read afterwards."""
    activities = services.teams.activities
    counts = counts_of(await activities.get_activity(activity_id))
    teams = [await activities.get_team(activity_id, tid) for tid in team_ids]
    assert counts == counts_from_teams(teams), counts
