"""What `[redis] wait_replicas = 1` costs: the engine's flash grab and seat locks on a primary
with one replica, every mutating call followed by WAIT 1 (one per coalesced batch) against
the same calls answered at once, side by side on the same two servers.

Both contenders are the production wiring (RedPacketService / the team engine, calls
coalesced) on the same primary, with their own key prefixes; they are measured in
alternation, round after round (benchmarks/harness.py), and the figure is the median of
the same-round ratios of their rates, wait / no wait. The replica is on the same machine
(loopback), so the figure is the cost of the extra round of acknowledgements and of the
replica's share of the two cores, not of a network hop.

    .venv/bin/python -m benchmarks.replica_wait           # 5 rounds each (~1 min)
    .venv/bin/python -m benchmarks.replica_wait --quick   # 3 smaller rounds
    .venv/bin/python -m benchmarks.replica_wait --rounds 11  # a steadier median
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time

import redis

from benchmarks.engine.common import FULL, QUICK, Sizes
from benchmarks.engine.versus import CALLERS, SEATS, alternate, grab_engine, lock_engine
from benchmarks.harness import (
    Bench,
    Row,
    close_services,
    comparison,
    open_services,
    standalone,
    trials_row,
)
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


def run_replica_wait(bench: Bench) -> list[Row]:
    """The flash grab and the seat locks with and without WAIT 1, interleaved (`rounds` of
    each, by default the engine's versus_rounds); their rows and the two ratios."""
    sizes: Sizes = QUICK if bench.quick else FULL
    if bench.rounds:
        sizes = dataclasses.replace(sizes, versus_rounds=bench.rounds)
    return asyncio.run(_measure(bench.sqlite("replicas"), sizes))


async def _measure(database_url: str, sizes: Sizes) -> list[Row]:
    primary, replica = start_pair()
    run, rounds = secrets.token_hex(3), sizes.versus_rounds
    try:
        waiting = await open_services(primary.url, database_url, key_prefix="gbw1", wait_replicas=1)
        plain = await open_services(primary.url, database_url, key_prefix="gbw0", wait_replicas=0)
        try:
            grabs = await alternate(
                {WAIT: grab_engine(waiting, sizes, run, "w1"),
                 NO_WAIT: grab_engine(plain, sizes, run, "w0")},
                rounds, "replica wait: flash grab",
            )  # fmt: skip
            locks = await alternate(
                {WAIT: lock_engine(waiting, sizes, run, "w1"),
                 NO_WAIT: lock_engine(plain, sizes, run, "w0")},
                rounds, "replica wait: seat locks",
            )  # fmt: skip
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


if __name__ == "__main__":
    standalone(run_replica_wait, __doc__)
