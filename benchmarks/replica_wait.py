"""What `[redis] wait_replicas = 1` costs: the engine's flash grab and seat locks on a primary
with one replica, every mutating call followed by WAIT 1 (one per coalesced batch) against
the same calls answered at once, side by side on the same two servers.

Both contenders are the production wiring (RedPacketService / the team engine, calls
coalesced) on the same primary, with their own key prefixes; they are measured in
alternation, round after round (benchmarks/interleave.py), and the figure is the median of
the same-round ratios of their rates, wait / no wait. The replica is on the same machine
(loopback), so the figure is the cost of the extra round of acknowledgements and of the
replica's share of the two cores, not of a network hop.

    .venv/bin/python -m benchmarks.replica_wait           # 5 rounds each (~1 min)
    .venv/bin/python -m benchmarks.replica_wait --quick   # 3 smaller rounds
    .venv/bin/python -m benchmarks.replica_wait --rounds 11  # a steadier median
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from benchmarks.engine.common import (
    FULL,
    QUICK,
    Sizes,
    close_services,
    open_services,
    say,
)
from benchmarks.engine.versus import CALLERS, SEATS, _idle, grab_engine, lock_engine, trials_row
from benchmarks.interleave import comparison, run_async
from benchmarks.measure import Row, gather_limited
from groupbuy.services import Services
from tests.support.servers import RedisProcess, start_redis

WAIT = "groupbuy, wait_replicas 1"
NO_WAIT = "groupbuy, wait_replicas 0"
# The same engine answering every write only once a replica holds it does at least half
# the work per second of the one that does not wait.
TARGET = 0.5


def start_pair() -> tuple[RedisProcess, RedisProcess]:
    """A primary (no persistence, as the rest of the benchmark) and its replica, in sync."""
    primary = start_redis("--repl-diskless-sync-delay", "0")
    try:
        replica = start_redis("--replicaof", "127.0.0.1", str(primary.port))
    except BaseException:
        primary.stop()
        raise
    client = redis.Redis(port=primary.port, decode_responses=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            info = client.info("replication")
            link = info.get("slave0")
            if isinstance(link, dict) and link.get("state") == "online":
                return primary, replica
            if time.monotonic() > deadline:
                replica.stop()
                primary.stop()
                raise TimeoutError(f"the replica did not come online: {info}")
            time.sleep(0.05)
    finally:
        client.close()


async def _services(url: str, database_url: str, prefix: str, wait_replicas: int) -> Services:
    """The production wiring on the primary, under its own key prefix, connections open."""
    services = await open_services(
        url, database_url, key_prefix=prefix, wait_replicas=wait_replicas
    )
    await gather_limited([services.redis.ping for _ in range(CALLERS * 2)], limit=CALLERS)
    return services


async def run_replica_wait(database_url: str, quick: bool, rounds: int | None = None) -> list[Row]:
    """The flash grab and the seat locks with and without WAIT 1, interleaved (`rounds` of
    each, by default the engine's versus_rounds); their rows and the two ratios."""
    sizes: Sizes = QUICK if quick else FULL
    if rounds:
        sizes = dataclasses.replace(sizes, versus_rounds=rounds)
    primary, replica = start_pair()
    run = secrets.token_hex(3)
    rounds = sizes.versus_rounds
    try:
        waiting = await _services(primary.url, database_url, "gbw1", 1)
        plain = await _services(primary.url, database_url, "gbw0", 0)
        try:
            say(f"replica wait: flash grab, {WAIT} / {NO_WAIT}, {rounds} rounds")
            grabs = await run_async(
                {
                    WAIT: grab_engine(waiting, sizes, run, "w1"),
                    NO_WAIT: grab_engine(plain, sizes, run, "w0"),
                },
                rounds,
                between=_idle,
                say=say,
            )
            say(f"replica wait: seat locks, {WAIT} / {NO_WAIT}, {rounds} rounds")
            locks = await run_async(
                {
                    WAIT: lock_engine(waiting, sizes, run, "w1"),
                    NO_WAIT: lock_engine(plain, sizes, run, "w0"),
                },
                rounds,
                between=_idle,
                say=say,
            )
            waits = int((await waiting.redis.info("commandstats"))["cmdstat_wait"]["calls"])
        finally:
            await close_services(plain)
            await close_services(waiting)
    finally:
        replica.stop()
        primary.stop()
    how = (
        f"primary + 1 replica on loopback, no persistence; {CALLERS} concurrent callers; "
        f"{rounds} rounds, contenders in rotating order"
    )
    flash = (
        f"each round 1 packet x {sizes.versus_shares} shares, {sizes.versus_users} users + 60% "
        f"double taps; {how}"
    )
    seats = (
        f"each round {sizes.versus_teams} fresh teams of {SEATS} free seats, "
        f"{2 * SEATS * sizes.versus_teams} distinct users; {how}"
    )
    notes = {
        WAIT: f"calls coalesced, each batch ended by WAIT 1 1000 ({waits} WAITs in the run)",
        NO_WAIT: "calls coalesced, answered without waiting for the replica",
    }
    rows = [trials_row("flash_grab_replicated", n, grabs[n], f"{notes[n]}; {flash}") for n in notes]
    rows += [
        trials_row("seat_locks_replicated", n, locks[n], f"{notes[n]}; {seats}") for n in notes
    ]
    rows += [
        comparison(
            "engine_grab_wait_replicas",
            f"engine grab, wait_replicas 1 / 0 (primary + replica, {CALLERS} callers, interleaved)",
            grabs[WAIT],
            grabs[NO_WAIT],
            TARGET,
            percent=True,
        ),
        comparison(
            "engine_lock_wait_replicas",
            f"engine seat lock, wait_replicas 1 / 0 (primary + replica, {CALLERS} callers, "
            "interleaved)",
            locks[WAIT],
            locks[NO_WAIT],
            TARGET,
            percent=True,
        ),
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 smaller rounds")
    parser.add_argument("--rounds", type=int, help="rounds of each contender (default 5)")
    args = parser.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="groupbuy-replica-wait-") as workdir:
        database = f"sqlite+aiosqlite:///{Path(workdir) / 'engine.db'}"
        rows = asyncio.run(run_replica_wait(database, args.quick, args.rounds))
    for row in rows:
        shown: dict[str, Any] = {k: v for k, v in row.items() if k != "latencies_ms"}
        print(json.dumps(shown, default=str))
    print()
    for r in rows:
        if "comparison" in r:
            print(f"{r['what']}: median {r['median']:.1%} (rounds {r['min']:.1%}-{r['max']:.1%})")
        else:
            print(
                f"{r['scenario']:<22} {r['implementation']:<28} {r['ops_per_s']:>9,.0f}/s  "
                f"p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms"
            )
    print(f"total {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
