"""An activity's stock under concurrency (SPEC §4.12): lock attempts racing on a real
redis-server never hold more units than the stock, at any snapshot."""

from __future__ import annotations

import asyncio

import pytest

from groupbuy import errors
from groupbuy.locks.sale import Sale
from groupbuy.services import Services
from tests.support.backends import REAL

TEAMS = 20
ATTEMPTS = 60
UNITS = 10  # left for locks once every team's leader holds one


@pytest.mark.parametrize("backend", [REAL])
async def test_racing_locks_hold_exactly_the_units_left_and_never_more(
    services: Services,
) -> None:
    activities, seats, counts = (
        services.teams.activities,
        services.teams.seats,
        services.teams.counts,
    )
    stock = TEAMS + UNITS
    await activities.create_activity("rush", team_size=3, sale=Sale(stock=stock))
    for t in range(TEAMS):
        await activities.open_team("rush", f"L{t}", team_id=f"t{t}")
    held_seen: list[int] = []
    racing = True

    async def snapshots() -> None:
        while racing:
            now = await counts.read("rush")
            held_seen.append(now["members"] + now["live_locks"])
            await asyncio.sleep(0)

    async def attempt(n: int) -> str:
        try:
            await seats.lock("rush", f"t{n % TEAMS}", f"u{n}")
        except errors.ActivitySoldOut:
            return "sold_out"
        except errors.TeamFull:
            return "team_full"
        return "locked"

    watcher = asyncio.create_task(snapshots())
    outcomes = await asyncio.gather(*(attempt(n) for n in range(ATTEMPTS)))
    racing = False
    await watcher

    assert outcomes.count("locked") == UNITS
    assert (
        outcomes.count("locked") + outcomes.count("sold_out") + outcomes.count("team_full")
        == ATTEMPTS
    )
    assert held_seen and max(held_seen) <= stock
    body = await activities.get_activity("rush")
    assert (body["stock_left"], body["stock_held_by_locks"], body["members"]) == (0, UNITS, TEAMS)
