"""run_engine: every engine scenario in order on one set of services; `python -m
benchmarks.engine [--quick]` runs it alone on a private redis-server."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from benchmarks.engine.background import background
from benchmarks.engine.common import FULL, QUICK, say
from benchmarks.engine.scaling import offered, rate_label, rate_of, scaling
from benchmarks.engine.storms import flash_grab, join_flash, lock_storm
from benchmarks.engine.versus import versus_rows
from benchmarks.harness import Bench, Row, close_services, open_services, standalone, warm_up


def run_engine(bench: Bench) -> list[Row]:
    """Run every engine-level scenario; one dict per measured row."""
    return asyncio.run(_run(bench.redis_url, bench.sqlite("engine"), bench.quick))


async def _run(redis_url: str, database_url: str, quick: bool) -> list[Row]:
    sizes = QUICK if quick else FULL
    run = secrets.token_hex(3)  # ids unique in a reused SQLite file
    services = await open_services(redis_url, database_url)
    services_off = await open_services(redis_url, database_url, auto_pipeline=False)
    rows: list[Row] = []
    began = time.perf_counter()
    steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        (name, partial(step, services, sizes, run))
        for name, step in (("flash_grab", flash_grab), ("lock_storm", lock_storm),
                           ("join_flash", join_flash))
    ]  # fmt: skip
    versus = partial(versus_rows, services, services_off, redis_url, sizes, run)
    steps.append(("interleaved comparisons", versus))
    steps += [
        (f"scaling {kind} {live}", partial(scaling, services, kind, live, sizes, run))
        for live in sizes.scaling_live
        for kind in ("grab", "lock")
    ]

    async def open_loop(kind: str, fraction: float) -> Row:
        # A new user's grab (lock) on one of 1,000 live packets (open teams), as the first
        # scaling rows: not the flash grab, whose calls are mostly cheap repeats.
        return await offered(services, kind, rate_of(rows, kind), quick, run, fraction)

    steps += [
        (f"{kind} at {rate_label(fraction)} the max rate", partial(open_loop, kind, fraction))
        for fraction in (0.5, 0.8)
        for kind in ("grab", "lock")
    ]
    # Idle live packets and activities, then flash grabs under the running scheduler.
    idle = (10_000, 1_000, 10, 200, 300) if quick else (100_000, 10_000, 20, 1000, 1500)
    steps.append(("background jobs", partial(background, services, run, *idle)))
    try:
        for name, step in steps:
            await services.redis.flushall()
            await warm_up(services)
            say(f"{name} ... ({time.perf_counter() - began:.1f} s so far)")
            result = await step()
            rows.extend(result if isinstance(result, list) else [result])
    finally:
        await services.redis.flushall()
        await close_services(services_off)
        await close_services(services)
    say(f"done in {time.perf_counter() - began:.1f} s, {len(rows)} rows")
    return rows


def main() -> None:
    """The engine level alone, on a private redis-server."""
    standalone(run_engine, __doc__)
