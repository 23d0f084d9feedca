"""A stock storm on a real redis-server and a 3-master Cluster (SPEC §4.12): 200 shoppers
race for 50 units across many teams with 1 s locks, extensions, unlocks, payments, leaves
and expiries. At every snapshot members + live locks stay within the stock; at the end the
activity's stock_left is the stock less what is held, and SQL's members agree."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from sqlalchemy import func, select

from groupbuy import errors
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.locks.sale import Sale
from groupbuy.services import Services
from tests.support.backends import CLUSTER, REAL

pytestmark = [pytest.mark.parametrize("backend", [REAL, CLUSTER])]

SHOPPERS = 200
TEAMS = 30
STOCK = 50
STORM_S = 2.5  # the locks last 1 s: every lock taken early expires or is paid inside it
# What a shopper's turn may end in: each a refusal the storm expects, never another error.
EXPECTED = (
    errors.ActivitySoldOut,
    errors.TeamFull,
    errors.TeamFormed,
    errors.AlreadyMember,
    errors.LockRequired,
    errors.UserLimitReached,
    errors.Conflict,
)


async def test_units_held_never_pass_the_stock_and_come_back(
    services: Services, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    teams, seats, counts = services.teams.activities, services.teams.seats, services.teams.counts
    await teams.create_activity(
        "storm", team_size=4, lock_ttl_s=1, sale=Sale(stock=STOCK, max_hold_s=3)
    )
    for t in range(TEAMS):
        await teams.open_team("storm", f"L{t}", team_id=f"t{t}", order_id=f"oL{t}")
    rng = random.Random(37)
    held_seen: list[int] = []
    stop_at = time.monotonic() + STORM_S
    done: dict[str, int] = {}

    async def snapshots() -> None:
        while time.monotonic() < stop_at:
            now = await counts.read("storm")
            held_seen.append(now["members"] + now["live_locks"])
            await asyncio.sleep(0.005)

    async def shopper(n: int) -> None:
        user, tid = f"u{n}", f"t{rng.randrange(TEAMS)}"
        while time.monotonic() < stop_at:
            try:
                await seats.lock("storm", tid, user)
                roll = rng.random()
                if roll < 0.2:
                    await seats.extend("storm", tid, user, 2)
                if roll < 0.5:
                    await seats.confirm("storm", tid, user, f"o{n}")
                    if rng.random() < 0.3:
                        await seats.leave("storm", tid, user, f"o{n}", "refund")
                        kind = "left"
                    else:
                        kind = "paid"
                elif roll < 0.7:
                    await seats.unlock("storm", tid, user)
                    kind = "unlocked"
                else:
                    kind = "expires"  # the lock runs out by itself
                done[kind] = done.get(kind, 0) + 1
                return
            except EXPECTED:
                tid = f"t{rng.randrange(TEAMS)}"
                await asyncio.sleep(0.01)

    watcher = asyncio.create_task(snapshots())
    await asyncio.gather(*(shopper(n) for n in range(SHOPPERS)))
    await watcher
    assert held_seen and max(held_seen) <= STOCK, max(held_seen)
    assert done.get("paid") and done.get("left") and done.get("expires"), done

    await asyncio.sleep(3.2)  # every lock, extended ones too, has run out
    body = await teams.get_activity("storm")
    assert body["stock_held_by_locks"] == 0
    assert body["stock_left"] == STOCK - body["members"]
    await services.team_writer.drain_all()
    async with services.database.sessions() as session:
        live = (
            select(func.count())
            .select_from(MemberRow)
            .join(
                TeamRow,
                (TeamRow.activity_id == MemberRow.activity_id)
                & (TeamRow.team_id == MemberRow.team_id),
            )
        )
        members = await session.scalar(
            live.where(
                MemberRow.activity_id == "storm",
                TeamRow.status.in_(("open", "formed")),
                MemberRow.left_at.is_(None),
                MemberRow.refunded_at.is_(None),
            )
        )
    assert members == body["members"]
    with capsys.disabled():
        print(
            f"\n[figures] stock storm on {backend}: {SHOPPERS} shoppers, stock {STOCK}, "
            f"{len(held_seen)} snapshots, most held {max(held_seen)}; ends {done}; "
            f"{body['members']} members hold the stock at the end, {body['stock_left']} left"
        )
