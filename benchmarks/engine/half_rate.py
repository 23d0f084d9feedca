"""Grabs and locks offered open-loop at half the rate measured earlier in the run: p50/p95/p99."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from benchmarks.engine.common import QUICK, Sizes, groupbuy_grab, make_row
from benchmarks.measure import gather_limited
from groupbuy import errors
from groupbuy.services import Services


async def open_loop(
    call: Callable[[int], Awaitable[Any]], rate: float, seconds: float
) -> list[float]:
    """Issue call(i) at a fixed rate whatever the answers do (an open loop) and return each
    latency measured from the moment it was due, so waiting in a queue counts too."""
    total = max(1, int(rate * seconds))
    latencies: list[float] = []
    tasks = []

    async def one(i: int, due: float) -> None:
        await call(i)
        latencies.append(time.perf_counter() - due)

    start = time.perf_counter()
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    return latencies


async def half_rate(
    services: Services, kind: str, max_rate: float, sizes: Sizes, run: str
) -> dict[str, Any]:
    """p50/p95/p99 of grabs or locks offered at half the rate measured earlier in this run."""
    rate = max_rate / 2
    seconds = 2.0 if sizes is QUICK else 5.0
    total = max(1, int(rate * seconds))
    if kind == "grab":
        # enough packets of at most 5,000 shares (the config caps a packet at 10,000)
        packets = [f"half-{run}-{p}" for p in range(total // 5000 + 1)]
        await services.packets.deposit(f"hs-{run}", len(packets) * 10_000, f"half-{run}")
        for packet_id in packets:
            await services.packets.send(f"hs-{run}", 10_000, 5000, packet_id=packet_id)

        async def call(i: int) -> Any:
            return await groupbuy_grab(services, packets[i % len(packets)], f"h{i}")
    else:
        aid = f"half-{run}"
        await services.teams.create_activity(aid, team_size=50)
        teams = [f"t{t}" for t in range(max(1, total // 40 + 1))]
        await gather_limited(
            [partial(services.teams.open_team, aid, f"L{t}", team_id=t) for t in teams]
        )

        async def call(i: int) -> Any:
            try:
                return await services.teams.lock(aid, teams[i % len(teams)], f"h{i}")
            except errors.GroupBuyError as exc:
                return exc.code

    latencies = await open_loop(call, rate, seconds)
    note = (
        f"{kind}s offered at {rate:,.0f}/s (half of the {max_rate:,.0f}/s measured above) "
        f"for {seconds:.0f} s, open loop; latency from when each call was due"
    )
    return make_row(f"{kind} @ half max rate", "groupbuy", seconds, latencies, {}, note)


def _rate_of(rows: list[dict[str, Any]], scenario: str, note_part: str = "") -> float:
    for row in rows:
        if (
            row["scenario"] == scenario
            and row["implementation"] == "groupbuy"
            and note_part in row.get("note", "")
        ):
            return float(row["ops_per_s"])
    return 1000.0
