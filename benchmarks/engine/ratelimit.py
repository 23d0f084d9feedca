"""The cost of rate limits on the grab path at engine level: RedPacketService.grab alone
against RateLimitService.take (the key's and the user's bucket: decided in the process and
counted behind, or with `local_share = 0` one script call first) followed by the grab, as
an HTTP request does, 64 callers, in alternation round after round
(benchmarks/interleave.py). Each round grabs a fresh packet, a new user per call. Besides
grabs per second, each contender's CPU time in this process per grab (Redis runs apart).

    .venv/bin/python -m benchmarks.engine.ratelimit [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.engine.common import close_services, groupbuy_grab, open_services, warm_up
from benchmarks.interleave import Trial, comparison, merge_correct, run_async
from benchmarks.measure import Meter, Row
from groupbuy import errors
from groupbuy.services import Services
from groupbuy.storage.ratelimit import RateLimitService
from groupbuy.testing.servers import start_redis

CALLERS = 64
GRABS = 5_000  # per round and contender
ALONE, LIMITED = "grab alone", "rate limit + grab"
EXACT = "exact rate limit + grab"
KEY_ID = "bench-key"

Grab = Callable[[str, str], Awaitable[dict[str, Any]]]


async def limited_grab(
    services: Services, packet_id: str, user: str, limiter: RateLimitService | None = None
) -> dict[str, Any]:
    """What a grab request does with limits on: take from the buckets, then grab."""
    decision = await (limiter or services.ratelimit).take("grab", KEY_ID, user)
    if decision is not None and not decision.allowed:
        return {"status": errors.RateLimited.code}
    return await groupbuy_grab(services, packet_id, user)


def grab_trial(services: Services, name: str, grab: Grab) -> Callable[[int], Awaitable[Trial]]:
    """One round: a fresh packet of GRABS shares, GRABS new users grabbing it, CALLERS at once."""

    async def trial(index: int) -> Trial:
        packet_id = f"rl-{name.replace(' ', '-')}-{index}"
        amount = GRABS * 10
        await services.packets.accounts.deposit("rl-sender", amount, packet_id)
        await services.packets.sending.send("rl-sender", amount, GRABS, packet_id=packet_id)
        meter = Meter(CALLERS)
        users = [f"{packet_id}-u{i}" for i in range(GRABS)]
        loop = asyncio.get_running_loop()
        began, cpu = loop.time(), time.process_time()
        answers = await asyncio.gather(
            *(meter.measure(functools.partial(grab, packet_id, u)) for u in users)
        )
        seconds, cpu = loop.time() - began, time.process_time() - cpu
        statuses: dict[str, int] = {}
        for answer in answers:
            statuses[answer["status"]] = statuses.get(answer["status"], 0) + 1
        correct = {"statuses": statuses, "ok": statuses == {"grabbed": GRABS}, "cpu_s": cpu}
        return Trial(GRABS, seconds, correct, latencies=meter.latencies)

    return trial


async def compare(services: Services, rounds: int, extra: dict[str, Grab] | None = None) -> Any:
    """Every contender's trials (the grab alone, with our limits, and `extra`)."""
    exact = RateLimitService(
        services.settings.ratelimit.model_copy(update={"local_share": 0}),
        services.scripts,
        services.keys,
        services.clock,
    )
    contenders = {
        ALONE: grab_trial(services, ALONE, lambda p, u: groupbuy_grab(services, p, u)),
        LIMITED: grab_trial(services, LIMITED, lambda p, u: limited_grab(services, p, u)),
        EXACT: grab_trial(services, EXACT, lambda p, u: limited_grab(services, p, u, exact)),
    }
    for name, grab in (extra or {}).items():
        contenders[name] = grab_trial(services, name, grab)
    return await run_async(contenders, rounds)


def rows_of(trials: dict[str, list[Trial]]) -> list[Row]:
    """A summary line per contender and the on/off comparison."""
    rows: list[Row] = []
    for name, mine in trials.items():
        latencies = sorted(s for t in mine for s in t.latencies)
        ops = sum(t.ops for t in mine)
        rows.append(
            {
                "implementation": name,
                "ops_per_s": round(ops / sum(t.seconds for t in mine), 1),
                "cpu_us_per_op": round(sum(t.correct["cpu_s"] for t in mine) / ops * 1e6, 1),
                "p50_ms": round(latencies[len(latencies) // 2] * 1000, 3),
                "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
                "correct": merge_correct([t.correct for t in mine]),
            }
        )
    for name in trials:
        if name != ALONE:
            rows.append(
                comparison(
                    f"engine_grab_{name}",
                    f"engine grab: {name} / grab alone (interleaved)",
                    trials[name],
                    trials[ALONE],
                    None,  # the 10% target is the HTTP grab's: here a grab is one call
                    percent=True,
                )
            )
    return rows


def print_rows(rows: list[Row]) -> None:
    """The figures, one line each."""
    for row in rows:
        if "comparison" in row:
            print(f"{row['what']}: median {row['median']:.1%} ({row['min']:.1%}-{row['max']:.1%})")
        else:
            print(
                f"{row['implementation']:<40} {row['ops_per_s']:>9,.0f}/s  p50 {row['p50_ms']} ms"
                f"  p99 {row['p99_ms']} ms  this process's CPU {row['cpu_us_per_op']} µs/grab"
                f"  ok {row['correct']['ok']}"
            )


async def run(redis_url: str, database_url: str, rounds: int) -> list[Row]:
    """The engine pair on this Redis."""
    services = await open_services(redis_url, database_url)
    try:
        await warm_up(services)
        return rows_of(await compare(services, rounds))
    finally:
        await close_services(services)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    server = start_redis()
    try:
        database = Path(tempfile.mkdtemp(prefix="groupbuy-rl-")) / "engine.db"
        print_rows(asyncio.run(run(server.url, f"sqlite+aiosqlite:///{database}", args.rounds)))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
