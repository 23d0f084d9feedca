"""join_flash: one activity of T open teams of 3 (the leader alone in each), U shoppers tapping
"join any team" at once, 256 in flight: every free seat granted exactly once, no team
over-filled, no no_team_available while a seat was free."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

from benchmarks.engine.common import Sizes
from benchmarks.engine.lock_storm import groupbuy_snapshot
from benchmarks.harness import CONCURRENCY, Meter, gather_limited, make_row
from groupbuy import errors
from groupbuy.services import Services
from tests.support.joins import Tap, grade_joins

JOIN_TEAM_SIZE = 3


async def join_flash_groupbuy(services: Services, sizes: Sizes, run: str) -> dict[str, Any]:
    """T teams of 3 with their leader, U shoppers each joining once through SeatService.join."""
    aid = f"join-{run}"
    teams = services.teams
    await teams.activities.create_activity(aid, team_size=JOIN_TEAM_SIZE)
    team_ids = [f"t{i}" for i in range(sizes.join_teams)]
    await gather_limited(
        [partial(teams.activities.open_team, aid, f"lead-{t}", team_id=t) for t in team_ids]
    )
    free = sizes.join_teams * (JOIN_TEAM_SIZE - 1)
    meter, taps = Meter(CONCURRENCY), list[Tap]()

    async def join(user: str) -> Any:
        try:
            return await teams.seats.join(aid, user)
        except errors.GroupBuyError as exc:
            return exc.code

    async def shopper(user: str) -> None:
        began = time.perf_counter()
        answer = await meter.measure(partial(join, user))
        ended = time.perf_counter()
        if isinstance(answer, str):
            taps.append(Tap(user, answer, None, began, ended))
        else:
            outcome = "locked" if answer.created else "existing"
            taps.append(Tap(user, outcome, answer.body["team_id"], began, ended))

    began = time.perf_counter()
    await asyncio.gather(*(shopper(f"u{i}") for i in range(sizes.join_users)))
    seconds = time.perf_counter() - began
    correct = grade_joins(taps, free, JOIN_TEAM_SIZE - 1)
    over, doubled = await groupbuy_snapshot(services, [(aid, t) for t in team_ids])
    correct["over_capacity"] += over  # what Redis holds at the end, checked atomically
    correct["double_locks"] = doubled
    correct["winners_ok"] = correct["winners"] == min(free, sizes.join_users)
    note = (
        f"1 activity, {sizes.join_teams} open teams of {JOIN_TEAM_SIZE} (leader only) = {free} "
        f"free seats, {sizes.join_users} shoppers each tapping join once, {CONCURRENCY} "
        "concurrent; TeamService.join (one EVALSHA of team_join.lua each); a no_team_available "
        "is wrong if a join that began after it ended still got a seat; over_capacity from "
        "the answers and one MULTI snapshot at the end"
    )
    return make_row("join_flash", "groupbuy", seconds, meter.latencies, correct, note)
