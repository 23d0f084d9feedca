"""`python -m benchmarks.engine.cluster [--rounds N]`: one redis-server against a 3-master
Redis Cluster, same machine, same run.

Four workloads, each measured on both in alternated rounds (benchmarks/interleave.py; a
warm-up round first, dropped), each round on fresh keys:

- flash_grab: one packet, its users and double taps (benchmarks/engine/flash_grab.py):
  every call goes to the one shard that holds the packet.
- lock_storm: one activity's teams, users locking, switching, unlocking, confirming
  (benchmarks/engine/lock_storm.py): one shard again.
- spread_grabs: grabs over many packets, which the cluster spreads over its shards.
- spread_locks: seat locks (then unlocks) over many activities, spread likewise.

The figure is the median over the rounds of the cluster's rate over one server's. The
client is one Python process with the service's coalescing on (one pipeline per primary
on the cluster), so on one machine it shows what routing by slot costs the client and
what three servers give when the client is not the limit; a cluster's capacity on real
hosts grows with its primaries, which one 2-core machine cannot show.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.engine.common import (
    QUICK,
    TEAM_SIZE,
    Sizes,
    close_services,
    groupbuy_grab,
    open_services,
    warm_up,
)
from benchmarks.engine.flash_grab import flash_grab_groupbuy, run_grabs
from benchmarks.engine.lock_storm import lock_storm_groupbuy
from benchmarks.interleave import Trial, comparison, merge_correct, run_async
from benchmarks.measure import CONCURRENCY, Meter, gather_limited
from groupbuy import errors
from groupbuy.services import Services
from tests.support.redis_cluster import start_cluster
from tests.support.servers import start_redis

SPREAD_PACKETS = 64
SPREAD_SHARES = 100  # per packet
SPREAD_ACTIVITIES = 48
SPREAD_TEAMS = 4  # per activity
SPREAD_LOCKERS = 2000


def say(message: str) -> None:
    print(f"[cluster] {message}", flush=True)


async def spread_grabs(services: Services, run: str) -> Trial:
    """SPREAD_PACKETS packets of SPREAD_SHARES shares; every share wanted by two users."""
    packets = [f"spread-{run}-{n}" for n in range(SPREAD_PACKETS)]
    sender = f"spread-sender-{run}"
    await services.packets.accounts.deposit(sender, SPREAD_PACKETS * SPREAD_SHARES * 100, sender)
    await gather_limited(
        [
            partial(
                services.packets.sending.send,
                sender,
                SPREAD_SHARES * 100,
                SPREAD_SHARES,
                packet_id=p,
            )
            for p in packets
        ]
    )
    rng = random.Random(3)
    requests = [(p, f"u{n}") for p in packets for n in range(2 * SPREAD_SHARES)]
    rng.shuffle(requests)
    seconds, latencies, answers = await run_grabs(
        lambda p, u: groupbuy_grab(services, p, u), requests
    )
    statuses = Counter(str(a.get("status", "grabbed")) for _p, _u, a in answers)
    granted = sum(int(a.get("amount_cents", 0)) for _p, _u, a in answers if "amount_cents" in a)
    correct = {
        "grabbed": statuses.get("grabbed", 0),
        "sold_out": statuses.get("sold_out", 0),
        "granted_ok": granted == SPREAD_PACKETS * SPREAD_SHARES * 100,
    }
    return Trial(len(answers), seconds, correct, latencies)


async def spread_locks(services: Services, run: str) -> Trial:
    """SPREAD_LOCKERS users each lock a seat in a random team of a random activity, then
    unlock it; no team may ever hold more locks than its free seats."""
    teams = services.teams
    activities = [f"spread-{run}-{n}" for n in range(SPREAD_ACTIVITIES)]
    await gather_limited(
        [partial(teams.activities.create_activity, a, team_size=TEAM_SIZE) for a in activities]
    )
    pairs = [(a, f"t{n}") for a in activities for n in range(SPREAD_TEAMS)]
    await gather_limited(
        [partial(teams.activities.open_team, a, f"lead-{t}", team_id=t) for a, t in pairs]
    )
    rng = random.Random(5)
    meter, outcomes = Meter(CONCURRENCY), Counter[str]()

    async def locker(user: str) -> None:
        aid, tid = rng.choice(pairs)

        async def lock_then_unlock() -> None:
            try:
                await teams.seats.lock(aid, tid, user)
            except errors.TeamFull:
                outcomes["team_full"] += 1
                return
            outcomes["locked"] += 1
            await teams.seats.unlock(aid, tid, user)
            outcomes["unlocked"] += 1

        await meter.measure(lock_then_unlock)

    began = time.perf_counter()
    await asyncio.gather(*(locker(f"u{n}") for n in range(SPREAD_LOCKERS)))
    seconds = time.perf_counter() - began
    left = [await teams.activities.get_team(a, t) for a, t in pairs]
    correct = {
        **outcomes,
        "no_locks_left": all(not team["locks"] for team in left),
        "calls": 2 * outcomes["locked"] + outcomes["team_full"],
    }
    # Two calls per locker that got a seat, one per refusal.
    return Trial(correct["calls"], seconds, correct, meter.latencies)


def row_trial(run: Callable[[], Awaitable[dict[str, Any]]]) -> Callable[[], Awaitable[Trial]]:
    """A workload of benchmarks/engine that answers a result row, as a Trial."""

    async def trial() -> Trial:
        row = await run()
        return Trial(int(row["ops"]), float(row["seconds"]), dict(row["correct"]))

    return trial


WORKLOADS: dict[str, Callable[[Services, Sizes, str], Awaitable[Trial]]] = {
    "flash_grab": lambda s, sizes, run: row_trial(lambda: flash_grab_groupbuy(s, sizes, run))(),
    "lock_storm": lambda s, sizes, run: row_trial(lambda: lock_storm_groupbuy(s, sizes, run))(),
    "spread_grabs": lambda s, _sizes, run: spread_grabs(s, run),
    "spread_locks": lambda s, _sizes, run: spread_locks(s, run),
}


async def measure(rounds: int, sizes: Sizes, workloads: list[str]) -> dict[str, Any]:
    """Every workload on one server and on the cluster, alternated; the per-round ratios."""
    server = start_redis()
    cluster = start_cluster(masters=3)
    directory = Path(tempfile.mkdtemp(prefix="groupbuy-cluster-bench-"))
    report: dict[str, Any] = {"rounds": rounds, "workloads": {}}
    try:
        one = await open_services(server.url, f"sqlite+aiosqlite:///{directory / 'one.db'}")
        many = await open_services(
            cluster.url, f"sqlite+aiosqlite:///{directory / 'cluster.db'}", cluster=True
        )
        try:
            await warm_up(one)
            await warm_up(many)
            for name in workloads:
                say(f"{name}: one redis-server vs a 3-master cluster, {rounds} rounds")
                workload = WORKLOADS[name]
                contenders: dict[str, Callable[[int], Awaitable[Trial]]] = {
                    "one server": partial(_trial, workload, one, sizes, f"{name}-one"),
                    "cluster": partial(_trial, workload, many, sizes, f"{name}-cluster"),
                }
                trials = await run_async(contenders, rounds, say=say)
                ratio = comparison(
                    f"cluster_{name}",
                    f"{name}: 3-master cluster / one redis-server",
                    trials["cluster"],
                    trials["one server"],
                    None,
                )
                report["workloads"][name] = {
                    "one_server_ops_per_s": [round(t.rate) for t in trials["one server"]],
                    "cluster_ops_per_s": [round(t.rate) for t in trials["cluster"]],
                    "ratio": ratio,
                    "correct_one_server": merge_correct([t.correct for t in trials["one server"]]),
                    "correct_cluster": merge_correct([t.correct for t in trials["cluster"]]),
                }
                say(
                    f"{name}: cluster / one server, median {ratio['median']} "
                    f"(rounds {ratio['min']}..{ratio['max']})"
                )
        finally:
            await close_services(one)
            await close_services(many)
    finally:
        cluster.stop()
        server.stop()
    return report


async def _trial(
    workload: Callable[[Services, Sizes, str], Awaitable[Trial]],
    services: Services,
    sizes: Sizes,
    prefix: str,
    round_index: int,
) -> Trial:
    return await workload(services, sizes, f"{prefix}-{round_index}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument(
        "--workload", action="append", choices=sorted(WORKLOADS), help="default: all four"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    report = asyncio.run(measure(args.rounds, QUICK, args.workload or list(WORKLOADS)))
    for name, figures in report["workloads"].items():
        ratio = figures["ratio"]
        print(
            f"{name:<13} one server {figures['one_server_ops_per_s']} ops/s; cluster "
            f"{figures['cluster_ops_per_s']} ops/s; cluster/one median {ratio['median']} "
            f"(min {ratio['min']}, max {ratio['max']})"
        )
        print(f"{'':<13} correct: one {figures['correct_one_server']}")
        print(f"{'':<13} correct: cluster {figures['correct_cluster']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
