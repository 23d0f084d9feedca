"""`python -m benchmarks.blocklist_cluster`: what the blocked users' per-slot copies cost on a
real 3-master Redis Cluster with every slot in use, and what cheaper layouts would cost.

1. The production path: `BlocklistService.block` with all 16,384 slots in the directory:
   the time of one block, and the memory one blocked user adds (used_memory summed over
   the three primaries, and MEMORY USAGE of one slot's copy).
2. Other values in the same per-slot hash (the time of the block, "1" as the copies hold,
   an empty value) and a per-slot set instead, written directly, for their memory per
   user per slot.
3. The same per-slot writes sent as one plain pipeline per primary, concurrently, instead
   of through redis-py's cluster pipeline: how much of a block's time is the client's.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import LockNotOwnedError

from groupbuy import migrations
from groupbuy.services import Services, build_services
from groupbuy.settings import Settings
from groupbuy.storage.db import Database
from groupbuy.storage.layout import SLOTS
from groupbuy.storage.redis_client import connect_redis
from groupbuy.storage.slots import SlotDirectory, each_slot
from groupbuy.testing.cluster import start_cluster

USERS = 20
# The copies' user ids: as long as a typical id of the service's clients.
USER_ID = "user-{n:06d}"


async def memory(redis: Any) -> int:
    """used_memory summed over every primary."""
    replies = await redis.info("memory", target_nodes=redis.PRIMARIES)
    return sum(int(reply["used_memory"]) for reply in replies.values())


async def per_user_per_slot(
    redis: Any, keys: list[str], write: Callable[..., Any]
) -> tuple[float, float]:
    """(bytes per user per slot, ms per user) of writing USERS users into every key."""
    await each_slot(redis, keys, lambda pipe, key: pipe.delete(key))
    before = await memory(redis)
    durations = []
    for n in range(USERS):
        user = USER_ID.format(n=n)
        began = time.perf_counter()
        await each_slot(redis, keys, partial(write, user=user))
        durations.append((time.perf_counter() - began) * 1000)
    after = await memory(redis)
    await each_slot(redis, keys, lambda pipe, key: pipe.delete(key))
    return (after - before) / (USERS * len(keys)), statistics.median(durations)


async def per_node_pipelines(redis: Any, keys: list[str]) -> float:
    """ms per user of HSET into every key by one plain pipeline per primary, concurrently."""
    by_node: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        by_node[redis.get_node_from_key(key).name].append(key)
    clients = {
        name: aioredis.Redis(host=name.rsplit(":", 1)[0], port=int(name.rsplit(":", 1)[1]))
        for name in by_node
    }

    async def on(name: str, user: str) -> None:
        async with clients[name].pipeline(transaction=False) as pipe:
            for key in by_node[name]:
                pipe.hset(key, user, "1")
            await pipe.execute()

    durations = []
    try:
        for n in range(USERS):
            user = USER_ID.format(n=n)
            began = time.perf_counter()
            await asyncio.gather(*(on(name, user) for name in by_node))
            durations.append((time.perf_counter() - began) * 1000)
    finally:
        for client in clients.values():
            await client.aclose()
    await each_slot(redis, keys, lambda pipe, key: pipe.delete(key))
    return statistics.median(durations)


async def production(services: Services) -> dict[str, float]:
    """A block's ms and bytes per blocked user, all slots in the directory."""
    redis, keys = services.redis, services.keys
    await SlotDirectory(redis, keys).join(*range(SLOTS))
    copy = keys.blocked_users(0)
    empty_copy = int(await redis.memory_usage(copy) or 0)
    before = await memory(redis)
    durations = []
    lost = 0
    for n in range(USERS):
        began = time.perf_counter()
        try:
            await services.blocklist.block(USER_ID.format(n=n), "benchmark")
        except LockNotOwnedError:
            lost += 1  # the block outlasted the blocklist lock (slots.LOCK_TIMEOUT_S)
        durations.append((time.perf_counter() - began) * 1000)
    after = await memory(redis)
    full_copy = int(await redis.memory_usage(copy) or 0)
    unblock = []
    for n in range(USERS):
        began = time.perf_counter()
        await services.blocklist.unblock(USER_ID.format(n=n))
        unblock.append((time.perf_counter() - began) * 1000)
    return {
        "slots": float(len(await SlotDirectory(redis, keys).in_use())),
        "block_ms": statistics.median(durations),
        "block_ms_max": max(durations),
        "lock_lost": float(lost),
        "unblock_ms": statistics.median(unblock),
        "bytes_per_user": (after - before) / USERS,
        "memory_usage_per_user_per_slot": (full_copy - empty_copy) / USERS,
    }


async def run(url: str, database_url: str) -> None:
    """Every measurement, printed."""
    settings = (
        Settings()
        .replace("redis", url=url, cluster=True, max_connections=512)
        .replace("database", url=database_url)
    )
    database = Database(database_url)
    await migrations.upgrade(database)
    services = build_services(settings, redis=connect_redis(settings.redis), database=database)
    try:
        await services.scripts.load()
        found = await production(services)
        redis, keys = services.redis, services.keys
        copies = [keys.blocked_users(slot) for slot in range(SLOTS)]
        ms_value = str(time.time_ns() // 1_000_000)
        layouts = {
            "hash, value blocked_at_ms": await per_user_per_slot(
                redis, copies, lambda pipe, key, user: pipe.hset(key, user, ms_value)
            ),
            'hash, value "1" (slots.COPY_VALUE)': await per_user_per_slot(
                redis, copies, lambda pipe, key, user: pipe.hset(key, user, "1")
            ),
            'hash, value ""': await per_user_per_slot(
                redis, copies, lambda pipe, key, user: pipe.hset(key, user, "")
            ),
            "set": await per_user_per_slot(
                redis, copies, lambda pipe, key, user: pipe.sadd(key, user)
            ),
        }
        per_node_ms = await per_node_pipelines(redis, copies)
        version = (await redis.info("server", target_nodes=redis.RANDOM))["redis_version"]
    finally:
        await services.scripts.aclose()
        await services.redis.aclose()
        await database.dispose()
    print(f"server {version}, 3 primaries, {found['slots']:,.0f} slots in use, {USERS} users")
    print(
        f"production: a block {found['block_ms']:.0f} ms (max {found['block_ms_max']:.0f}, "
        f"{found['lock_lost']:.0f} outlasted the lock), an unblock {found['unblock_ms']:.0f}"
        f" ms (medians); {found['bytes_per_user'] / 1000:,.0f} kB per blocked user "
        f"({found['bytes_per_user'] / SLOTS:.1f} B per slot); MEMORY USAGE of one copy: "
        f"{found['memory_usage_per_user_per_slot']:.1f} B per user"
    )
    for name, (per_slot, ms) in layouts.items():
        print(
            f"  {name:<36} {per_slot:5.1f} B per user per slot "
            f"({per_slot * SLOTS / 1000:,.0f} kB per user), {ms:.0f} ms per user"
        )
    print(f"  hash, one plain pipeline per primary: {per_node_ms:.0f} ms per user")


def main() -> None:
    """On a 3-master cluster of private servers and a SQLite file."""
    cluster = start_cluster(3)
    directory = Path(tempfile.mkdtemp(prefix="groupbuy-bench-"))
    try:
        asyncio.run(run(cluster.url, f"sqlite+aiosqlite:///{directory / 'bench.db'}"))
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
