"""`python -m benchmarks.cluster_layout`: what the Redis Cluster key layout costs, measured
on one private redis-server (the layout, not the cluster: the same server and process run
both layouts, so the difference is the layout's own).

1. The hot path: grabs on random packets and seat locks on random teams with the keys of
   one Redis server (`[redis] cluster = false`) and with the per-slot keys of cluster mode
   (the indexes and the blocked users' copy of the entity's slot), in interleaved rounds.
2. A job round with nothing to do, as the directory of slots in use grows: the pending
   reads of the write-behind and the due reads of the sweeps and the packet expiry.
3. The blocklist copies: a block's duration and the memory of one blocked user in every
   slot's copy.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from benchmarks.engine.common import (
    QUICK,
    close_services,
    private_redis_and_sqlite,
    used_memory,
    warm_up,
)
from benchmarks.engine.scaling import scaling_grabs, scaling_locks
from groupbuy import migrations
from groupbuy.services import Services, build_services, settle_heap
from groupbuy.settings import Settings
from groupbuy.storage.db import Database
from groupbuy.storage.layout import SLOTS
from groupbuy.storage.redis_client import connect_redis
from groupbuy.storage.slots import SlotDirectory

ROUNDS = 3
LIVE = 1000
DIRECTORY_SIZES = (1, 1000, SLOTS)
IDLE_REPEATS = 5
BLOCKED_USERS = 100


async def open_layout(redis_url: str, database_url: str, cluster: bool) -> Services:
    """The production wiring with one layout on a standalone server."""
    plain = Settings().replace("redis", url=redis_url, max_connections=512)
    settings = plain.replace("redis", cluster=cluster).replace("database", url=database_url)
    database = Database(database_url)
    await migrations.upgrade(database)
    # The client of one server either way: the layout is what is measured.
    client = connect_redis(plain.redis)
    services = build_services(settings, redis=client, database=database)
    await services.scripts.load()
    settle_heap()
    return services


async def hot_path(layouts: dict[str, Services]) -> dict[str, dict[str, list[float]]]:
    """ops/s of grabs and locks per layout, ROUNDS interleaved rounds each."""
    rates: dict[str, dict[str, list[float]]] = {name: {"grab": [], "lock": []} for name in layouts}
    for round_number in range(ROUNDS):
        for name, services in layouts.items():
            await services.redis.flushall()
            await warm_up(services)
            grabs = await scaling_grabs(services, LIVE, QUICK)
            locks = await scaling_locks(services, LIVE, QUICK, f"{name}{round_number}")
            rates[name]["grab"].append(grabs["ops_per_s"])
            rates[name]["lock"].append(locks["ops_per_s"])
    return rates


async def timed(call: Any) -> float:
    """Median ms of IDLE_REPEATS runs of `call()`."""
    runs = []
    for _ in range(IDLE_REPEATS):
        began = time.perf_counter()
        await call()
        runs.append((time.perf_counter() - began) * 1000)
    return statistics.median(runs)


async def idle_rounds(services: Services) -> dict[int, dict[str, float]]:
    """ms of each idle read as the directory holds more slots (nothing is due anywhere)."""
    redis, keys = services.redis, services.keys
    await redis.flushall()
    figures: dict[int, dict[str, float]] = {}
    for size in DIRECTORY_SIZES:
        await redis.delete(keys.slot_directory())
        await redis.sadd(keys.slot_directory(), *range(size))
        figures[size] = {
            "write-behind (both pending reads)": await timed(
                lambda: asyncio.gather(
                    services.team_writer.pending(), services.packets.writer.pending()
                )
            ),
            "sweep_locks": await timed(lambda: services.teams.sweeps.expire_locks(200)),
            "expire_packets": await timed(lambda: services.packets.sweeps.expire_due()),
            "backlog gauges": await timed(lambda: services.packets.writer.measure_backlog()),
        }
    return figures


async def blocklist_copies(services: Services) -> dict[str, float]:
    """A block's ms with every slot in the directory, and bytes per blocked user per slot."""
    redis, keys = services.redis, services.keys
    await redis.flushall()
    await SlotDirectory(redis, keys).join(*range(SLOTS))
    before = await used_memory(redis)
    durations = []
    for n in range(BLOCKED_USERS):
        began = time.perf_counter()
        await services.blocklist.block(f"user-{n:06d}", "benchmark")
        durations.append((time.perf_counter() - began) * 1000)
    after = await used_memory(redis)
    return {
        "block_ms_median": statistics.median(durations),
        "bytes_per_blocked_user_per_slot": (after - before) / (BLOCKED_USERS * SLOTS),
        "copies": float(len(await SlotDirectory(redis, keys).in_use())),
    }


async def run(redis_url: str, database_url: str) -> None:
    """Every measurement, printed."""
    layouts = {
        "one server": await open_layout(redis_url, database_url, cluster=False),
        "cluster layout": await open_layout(redis_url, database_url, cluster=True),
    }
    try:
        rates = await hot_path(layouts)
        cluster = layouts["cluster layout"]
        idle = await idle_rounds(cluster)
        one = layouts["one server"]
        idle_one = await idle_rounds(one)
        copies = await blocklist_copies(cluster)
    finally:
        for services in layouts.values():
            await services.redis.flushall()
            await close_services(services)
    print(f"\nhot path, {LIVE:,} live packets / teams, {ROUNDS} interleaved rounds (ops/s):")
    for name, by_kind in rates.items():
        for kind, values in by_kind.items():
            shown = ", ".join(f"{v:,.0f}" for v in values)
            print(f"  {name:<15} {kind}: median {statistics.median(values):,.0f} ({shown})")
    print(f"\nidle job reads, ms (median of {IDLE_REPEATS}); one server: one index each")
    for what, ms in idle_one[1].items():
        print(f"  one server      {what}: {ms:.2f}")
    for size, by_what in idle.items():
        for what, ms in by_what.items():
            print(f"  {size:>6} slots   {what}: {ms:.2f}")
    print(
        f"\nblocklist with {copies['copies']:,.0f} slots in use: a block takes "
        f"{copies['block_ms_median']:.1f} ms (median of {BLOCKED_USERS}); "
        f"{copies['bytes_per_blocked_user_per_slot']:.1f} B per blocked user per slot"
    )


def main() -> None:
    """On a private redis-server and SQLite file."""
    with private_redis_and_sqlite() as (redis_url, database_url):
        asyncio.run(run(redis_url, database_url))


if __name__ == "__main__":
    main()
