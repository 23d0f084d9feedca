"""The group-buy engine: its parts by job, built once and handed to the callers together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from groupbuy.locks.activities import ActivityService
from groupbuy.locks.activity_copy import ActivityCopy
from groupbuy.locks.confirm import TEAM_CONFIRM
from groupbuy.locks.counts import ActivityCounts
from groupbuy.locks.dissolve import TEAM_DISSOLVE, TeamDissolve
from groupbuy.locks.extend import TEAM_EXTEND
from groupbuy.locks.history import TeamHistory
from groupbuy.locks.join import TEAM_JOIN
from groupbuy.locks.leave import TEAM_LEAVE
from groupbuy.locks.listings import Listings
from groupbuy.locks.lock import TEAM_LOCK
from groupbuy.locks.recovery import TeamRecovery
from groupbuy.locks.sale import ACTIVITY_SALE
from groupbuy.locks.scripts import TeamScripts
from groupbuy.locks.seats import SeatService
from groupbuy.locks.specs import CONTRACTS as SHARED_CONTRACTS
from groupbuy.locks.sweeps import TeamSweeps
from groupbuy.locks.unlock import TEAM_UNLOCK
from groupbuy.locks.waitlist import CONTRACTS as WAITLIST_CONTRACTS
from groupbuy.locks.waitlist import Waitlist
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.settings import TeamSettings
from groupbuy.storage.backends import Backends
from groupbuy.storage.specs import ScriptSpec

# Every script of the engine by its spec: an operation's own in its module, the rest in
# groupbuy.locks.specs (docs/scripts.md is rendered from them).
CONTRACTS: tuple[ScriptSpec[Any], ...] = (
    *SHARED_CONTRACTS,
    ACTIVITY_SALE,
    TEAM_LOCK,
    TEAM_UNLOCK,
    TEAM_JOIN,
    TEAM_CONFIRM,
    TEAM_EXTEND,
    TEAM_LEAVE,
    TEAM_DISSOLVE,
    *WAITLIST_CONTRACTS,
)


@dataclass(frozen=True)
class TeamEngine:
    """The team engine's parts: a caller names the job it asks for
    (`teams.seats.lock(...)`, `teams.activities.create_activity(...)`)."""

    activities: ActivityService  # activities; open, read and list teams
    seats: SeatService  # the hot path: lock, join, unlock, confirm, current lock
    sweeps: TeamSweeps  # the scheduled jobs: expiry, write-behind, repair
    recovery: TeamRecovery  # rebuilding what Redis lost, from SQL
    listings: Listings  # SQL pages: activities, an activity's formed or failed teams
    counts: ActivityCounts  # an activity's live counts (Redis; put back from SQL)
    dissolve: TeamDissolve  # an admin fails an open team now
    waitlist: Waitlist  # a line for the next free seat

    @classmethod
    def build(
        cls, backends: Backends, defaults: TeamSettings, outbox: TeamRecordWriter
    ) -> TeamEngine:
        """Wire the parts over one set of backends, sharing the scripts and the record writer."""
        scripts = TeamScripts(backends.scripts, backends.keys, backends.clock)
        counts = ActivityCounts(backends, scripts, defaults.join_candidates)
        copies = ActivityCopy(backends, counts)
        history = TeamHistory(backends, copies)
        recovery = TeamRecovery(backends, defaults, scripts, copies)
        seats = SeatService(scripts, outbox, defaults, copies, history, recovery)
        return cls(
            activities=ActivityService(
                backends, defaults, outbox, scripts, copies, history, recovery
            ),
            seats=seats,
            sweeps=TeamSweeps(backends, outbox, scripts, recovery),
            recovery=recovery,
            listings=Listings(backends, counts),
            counts=counts,
            dissolve=TeamDissolve(scripts, outbox, history, recovery),
            waitlist=Waitlist(scripts, seats.lock, seats.join, copies, history, recovery),
        )
