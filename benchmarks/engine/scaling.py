"""scaling: the grab and lock rates with 10^3..10^5 live packets / teams, and the Redis memory
per live packet, team, grab and lock. Then the same kinds of call offered open loop at half
and 80% of the rate measured among 1,000: p50/p95/p99 from when each call was due, and
whether the generator (in the service's process) kept up.

Guards the engine's p99 targets (open loop) and the memory figures of docs/deploy.md.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from benchmarks.engine.common import (
    GroupbuyTeams,
    Sizes,
    create_packets,
    groupbuy_grab,
    open_teams,
    pipelined,
    run_calls,
    run_grabs,
    used_memory,
)
from benchmarks.harness import Row, make_row, percentile
from groupbuy.locks.scripts import TEAM_OPEN
from groupbuy.services import Services

SHARES, TEAM_SIZE = 10, 50
KEPT_UP = 0.95  # of the rate asked, issued


async def create_teams(services: Services, aid: str, count: int) -> list[str]:
    """`count` open teams of one activity through team_open (pipelined)."""
    keys, ids = services.keys, [f"t{i}" for i in range(count)]
    await services.teams.activities.create_activity(aid, team_size=TEAM_SIZE)

    def team_open(tid: str) -> tuple[list[str], list[Any]]:
        team_keys = TEAM_OPEN.key_list(keys.team_keys(aid, tid), keys.activity_keys(aid))
        args = TEAM_OPEN.arg_list(
            {"activity_id": aid, "team_id": tid, "shift_ms": 0, "leader_id": f"lead-{tid}",
             "user_key_prefix": keys.user_key_prefix(aid), "leader_order_id": "",
             "retention_ms": 60_000}
        )  # fmt: skip
        return team_keys, args

    await pipelined(services, "team_open", [team_open(tid) for tid in ids])
    return ids


async def scaling(services: Services, kind: str, live: int, sizes: Sizes, run: str) -> Row:
    """The rate of `kind` (grab, lock) by new users on random ones among `live` live packets
    (open teams); bytes per packet (team) and per grab (lock)."""
    redis = services.redis
    await redis.flushall()
    before, began = await used_memory(redis), time.perf_counter()
    rng = random.Random(live)
    if kind == "grab":
        ids = [f"s{i}" for i in range(live)]
        await create_packets(services, ids, SHARES, "bench")
    else:
        aid = f"scale{live}-{run}"
        ids = await create_teams(services, aid, live)
    create_s, created = time.perf_counter() - began, await used_memory(redis)
    if kind == "grab":
        requests = [(rng.choice(ids), f"g{i}") for i in range(sizes.scaling_ops)]
        seconds, latencies, answers = await run_grabs(services, requests)
        statuses = Counter(str(a["status"]) for _p, _u, a in answers)
    else:
        requests = [(rng.choice(ids), f"l{i}") for i in range(sizes.scaling_ops)]
        seconds, latencies, answers = await run_calls(
            partial(GroupbuyTeams(services).lock, aid), requests
        )
        statuses = Counter(str(a) for _t, _u, a in answers)
    won = statuses["grabbed" if kind == "grab" else "locked"]
    unit = "packet" if kind == "grab" else "team"
    grown = await used_memory(redis) - created
    memory = {f"bytes_per_live_{unit}": round((created - before) / live, 1),
              f"bytes_per_{kind}": round(grown / max(won, 1), 1)}  # fmt: skip
    correct = {"winners": won, "over_capacity": 0, "duplicates": 0,
               "spurious_failures": statuses.total() - won - statuses["sold_out"],
               "outcomes": dict(statuses)}  # fmt: skip
    per = f"{(created - before) / live:.0f} B/{unit}, {grown / max(won, 1):.0f} B/{kind}"
    note = f"among {live:,} live {unit}s, created in {create_s:.2f} s; {per}"
    return make_row("scaling", "groupbuy", seconds, latencies, correct, note,
                    operation=kind, live=live, memory=memory)  # fmt: skip


# -- open loop ----------------------------------------------------------------------------


async def open_loop(
    call: Callable[[int], Awaitable[str]], rate: float, seconds: float
) -> tuple[list[float], list[float], float, Counter[str]]:
    """Issue call(i) at a fixed rate whatever the answers do; (latencies from when each call
    was due, how late each was issued, the seconds of issuing, the outcomes)."""
    total = max(1, int(rate * seconds))
    latencies: list[float] = []
    late: list[float] = []
    outcomes: Counter[str] = Counter()
    # Only the calls in flight are held: keeping every finished task until the end grew
    # the heap by a task per call, and the collector's pauses with it, which the calls due
    # meanwhile then counted as latency.
    in_flight: set[asyncio.Task[None]] = set()

    async def one(i: int, due: float) -> None:
        outcomes[await call(i)] += 1
        latencies.append(time.perf_counter() - due)

    start = time.perf_counter()
    for i in range(total):
        due = start + i / rate
        if (delay := due - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        late.append(max(0.0, time.perf_counter() - due))
        task = asyncio.create_task(one(i, due))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    issue_seconds = max(time.perf_counter() - start, (total - 1) / rate)
    while in_flight:
        await asyncio.gather(*list(in_flight))
    return latencies, late, issue_seconds, outcomes


def rate_label(fraction: float) -> str:
    """'half' for 0.5, else a percentage: the scenario name says which load it was."""
    return "half" if fraction == 0.5 else f"{fraction:.0%}"


async def offered(
    services: Services, kind: str, max_rate: float, quick: bool, run: str, fraction: float
) -> Row:
    """p50/p95/p99 of grabs or locks by new users offered at `fraction` of `max_rate`."""
    rate, seconds = max_rate * fraction, 2.0 if quick else 5.0
    total, tag = max(1, int(rate * seconds)), f"{run}-{int(fraction * 100)}"
    call: Callable[[int], Awaitable[str]]
    if kind == "grab":
        # enough packets of at most 5,000 shares (the config caps a packet at 10,000)
        packets = [f"half-{tag}-{p}" for p in range(total // 5000 + 1)]
        await services.packets.accounts.deposit(f"hs-{tag}", len(packets) * 10_000, f"half-{tag}")
        for packet_id in packets:
            await services.packets.sending.send(f"hs-{tag}", 10_000, 5000, packet_id=packet_id)

        async def call(i: int) -> str:
            answer = await groupbuy_grab(services, packets[i % len(packets)], f"h{i}")
            return str(answer["status"])
    else:
        aid, teams = f"half-{tag}", [f"t{t}" for t in range(max(1, total // 40 + 1))]
        await open_teams(services, aid, teams, TEAM_SIZE)
        lock = GroupbuyTeams(services).lock

        async def call(i: int) -> str:
            return await lock(aid, teams[i % len(teams)], f"h{i}")

    latencies, late, issue_seconds, outcomes = await open_loop(call, rate, seconds)
    late.sort()
    issued = len(late) / issue_seconds if issue_seconds > 0 else 0.0
    generator = {"offered_per_s": round(rate, 1), "issued_per_s": round(issued, 1),
                 "issue_late_p50_ms": percentile(late, 0.5),
                 "issue_late_p99_ms": percentile(late, 0.99),
                 "generator_kept_up": issued >= KEPT_UP * rate}  # fmt: skip
    label = rate_label(fraction)
    note = (
        f"offered at {rate:,.0f}/s ({label} of {max_rate:,.0f}/s) for {seconds:.0f} s; issued "
        f"at {issued:,.0f}/s, issue delay p99 {generator['issue_late_p99_ms']} ms"
    )
    if not generator["generator_kept_up"]:
        note += "; THE GENERATOR FELL BEHIND"
    # Every call is a new user on a packet (team) with a share (seat) left for it.
    won = outcomes["grabbed" if kind == "grab" else "locked"]
    correct = {
        "winners": won,
        "spurious_failures": outcomes.total() - won,
        "outcomes": dict(outcomes),
        "generator_kept_up": issued >= KEPT_UP * rate,
    }
    return make_row(f"{kind} @ {label} max rate", "groupbuy", seconds, latencies, correct, note,
                    offered_fraction=fraction, generator=generator)  # fmt: skip


def rate_of(rows: list[Row], kind: str) -> float:
    """The scaling row's rate of `kind` among the fewest live packets (teams)."""
    found = [r for r in rows if r.get("scenario") == "scaling" and r.get("operation") == kind]
    return float(found[0]["ops_per_s"]) if found else 1000.0
