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
from benchmarks.engine.common import FULL, QUICK, Sizes, say
from benchmarks.engine.evalsha import redis_benchmark_rows
from benchmarks.engine.flash_grab import flash_grab_groupbuy, flash_grab_naive
from benchmarks.engine.half_rate import _rate_of, half_rate, rate_label
from benchmarks.engine.join_flash import join_flash_groupbuy
from benchmarks.engine.lock_storm import lock_storm_groupbuy, lock_storm_naive
from benchmarks.engine.scaling import scaling_grabs, scaling_locks
from benchmarks.engine.versus import versus_rows
from benchmarks.harness import Bench, Row, close_services, open_services, standalone, warm_up
from groupbuy.services import Services


def run_engine(bench: Bench) -> list[Row]:
    """Run every engine-level scenario; one dict per measured row."""
    return asyncio.run(_run(bench.redis_url, bench.sqlite("engine"), bench.quick))


async def _run(redis_url: str, database_url: str, quick: bool) -> list[Row]:
    sizes = QUICK if quick else FULL
    run = secrets.token_hex(3)  # ids unique in a reused SQLite file
    services = await open_services(redis_url, database_url)
    services_off = await open_services(redis_url, database_url, auto_pipeline=False)
    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    try:
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("flash_grab groupbuy", lambda: flash_grab_groupbuy(services, sizes, run)),
            ("flash_grab naive", lambda: flash_grab_naive(services, sizes, run)),
            ("lock_storm groupbuy", lambda: lock_storm_groupbuy(services, sizes, run)),
            ("lock_storm naive", lambda: lock_storm_naive(services, sizes, run)),
            ("join_flash groupbuy", lambda: join_flash_groupbuy(services, sizes, run)),
            ("redis-benchmark", lambda: redis_benchmark_rows(services, redis_url, sizes)),
            (
                "interleaved comparisons",
                lambda: versus_rows(services, services_off, redis_url, sizes, run),
            ),
        ]
        for live in sizes.scaling_live:
            steps.append((f"scaling grab {live}", partial(scaling_grabs, services, live, sizes)))
            steps.append(
                (f"scaling lock {live}", partial(scaling_locks, services, live, sizes, run))
            )
        for fraction in (0.5, 0.8):
            label = rate_label(fraction)
            steps.append(
                (
                    f"grab at {label} the max rate",
                    partial(_open_loop_step, services, rows, "grab", sizes, run, fraction),
                )
            )
            steps.append(
                (
                    f"lock at {label} the max rate",
                    partial(_open_loop_step, services, rows, "lock", sizes, run, fraction),
                )
            )
        # Idle live packets and activities, then flash grabs under the running scheduler.
        idle = (10_000, 1_000, 10, 200, 300) if quick else (100_000, 10_000, 20, 1000, 1500)
        steps.append(
            ("background jobs, idle and under grabs", partial(background, services, run, *idle))
        )
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


async def _open_loop_step(
    services: Services,
    rows: list[dict[str, Any]],
    kind: str,
    sizes: Sizes,
    run: str,
    fraction: float,
) -> dict[str, Any]:
    """An open-loop row at `fraction` of the rate measured earlier in this run for the same
    kind of call: a new user's grab (lock) on one of 1,000 live packets (open teams). The
    flash grab's rate is not that: most of its calls are cheap repeats and sold-out
    answers, while every open-loop grab takes a share."""
    if kind == "grab":
        max_rate = _rate_of(rows, "scaling", "grab on random packets")
    else:
        max_rate = _rate_of(rows, "scaling", "lock on random teams")
    return await half_rate(services, kind, max_rate, sizes, run, fraction)


def main() -> None:
    """The engine level alone, on a private redis-server."""
    standalone(run_engine, __doc__)
