"""The dissolve, whole: an admin fails an open team now (team_dissolve).

Its `team.failed` record carries `reason: dissolved` and lists the members to refund. Its
script's spec, its script call and the operation (`TeamDissolve`, which the engine hands
out as `teams.dissolve`) with its answer.
"""

from __future__ import annotations

from groupbuy_client.wire import Dissolved

from groupbuy.locks.codes import LOCKED, TeamCode, raise_for
from groupbuy.locks.history import MissingTeam, TeamHistory
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.specs import (
    EXISTING,
    FORMED,
    NO_TEAM,
    OK,
    TEAM,
    TEAM_ARGV,
    TEAM_KEYS,
    TEAM_NOT_FOUND,
    C,
)
from groupbuy.locks.view import TeamView
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.storage.specs import ScriptSpec, shape

TEAM_DISSOLVE = ScriptSpec(
    "team_dissolve",
    "An admin fails an open team now (reason dissolved), idempotently.",
    keys=TEAM_KEYS,
    args=TEAM_ARGV,
    replies={
        OK: shape("failed now", TEAM),
        EXISTING: shape("dissolved before", TEAM),
        C.TEAM_FORMED: FORMED,
        C.TEAM_FAILED: shape("the team failed otherwise (deadline, abandoned)"),
        TEAM_NOT_FOUND: NO_TEAM,
    },
)


async def team_dissolve(teams: TeamScripts, activity_id: str, team_id: str) -> TeamReply:
    """team_dissolve."""
    keys = TEAM_DISSOLVE.key_list(*teams.team(activity_id, team_id))
    return await TEAM_DISSOLVE.run(teams.caller, keys, teams.team_args(activity_id, team_id))


class TeamDissolve:
    """Dissolve an open team: `await teams.dissolve(activity_id, team_id)`."""

    def __init__(
        self,
        teams: TeamScripts,
        outbox: TeamRecordWriter,
        history: TeamHistory,
        recovery: MissingTeam,
    ) -> None:
        self._teams = teams
        self._outbox = outbox
        self._history = history
        self._recovery = recovery

    async def __call__(self, activity_id: str, team_id: str) -> Dissolved:
        """Fail the open team now; a repeat answers the same. TeamFormed, TeamFailed (it
        failed otherwise), TeamNotFound."""
        reply = await team_dissolve(self._teams, activity_id, team_id)
        if reply.code is TeamCode.TEAM_NOT_FOUND and await self._recovery.bring_back(
            activity_id, team_id
        ):
            reply = await team_dissolve(self._teams, activity_id, team_id)
        if reply.code is TeamCode.TEAM_NOT_FOUND:
            return await self._history.dissolved_before(activity_id, team_id)
        if reply.code not in LOCKED:
            raise_for(reply.code)
        # The record (and its refund list) reaches SQL with the next flush if not now.
        await self._outbox.drain_quietly(activity_id)
        team = TeamView.from_snapshot(activity_id, team_id, reply.team)
        return {"team": team.body(), "dissolved": True}
