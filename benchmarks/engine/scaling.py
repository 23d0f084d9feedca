"""scaling: the grab and lock rates with 10^3..10^5 live packets / teams, and the Redis
memory per live packet, team, grab and lock."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from functools import partial
from typing import Any

from benchmarks.engine.common import Sizes, groupbuy_grab, run_grabs, used_memory
from benchmarks.engine.lock_storm import GroupbuyTeams
from benchmarks.harness import Meter, gather_limited, make_row
from groupbuy.locks.scripts import TEAM_OPEN
from groupbuy.redpacket.scripts import PACKET_CREATE
from groupbuy.services import Services
from groupbuy.storage.scripts import script_source

SCALING_SHARES, SCALING_TEAM_SIZE, BATCH = 10, 50, 2000


async def create_packets_pipelined(services: Services, count: int) -> list[str]:
    """`count` small packets through packet_create, pipelined in batches."""
    sha = await services.redis.script_load(script_source("packet_create"))
    now = await services.clock.now_ms(services.redis)
    shares = [10] * SCALING_SHARES  # 10 cents each
    ids = [f"s{i}" for i in range(count)]

    async def batch(start: int) -> None:
        pipe = services.redis.pipeline(transaction=False)
        for pid in ids[start : start + BATCH]:
            args = [pid, 0, "bench", sum(shares), SCALING_SHARES, "equal", now]
            args += [now + 3_600_000, 60_000, *shares]
            keys = PACKET_CREATE.key_list(services.keys.packet_keys(pid))
            pipe.evalsha(sha, len(keys), *keys, *args)
        await pipe.execute()

    await gather_limited([partial(batch, s) for s in range(0, count, BATCH)], limit=3)
    return ids


async def create_teams_pipelined(services: Services, aid: str, count: int) -> list[str]:
    """`count` open teams of one activity through team_open, pipelined in batches."""
    keys = services.keys
    await services.teams.activities.create_activity(aid, team_size=SCALING_TEAM_SIZE)
    sha = await services.redis.script_load(script_source("team_open"))
    ids = [f"t{i}" for i in range(count)]

    async def batch(start: int) -> None:
        pipe = services.redis.pipeline(transaction=False)
        for tid in ids[start : start + BATCH]:
            team_keys = TEAM_OPEN.key_list(
                keys.team_keys(aid, tid),
                keys.activity_keys(aid),
                activity_hash=keys.activity(aid),
                blocklist=keys.activity_blocklist(aid),
            )
            args = TEAM_OPEN.arg_list(
                {
                    "activity_id": aid,
                    "team_id": tid,
                    "shift_ms": 0,
                    "user_key_prefix": keys.user_key_prefix(aid),
                    "leader_id": f"lead-{tid}",
                    "leader_order_id": "",
                    "retention_ms": 60_000,
                }
            )
            pipe.evalsha(sha, len(team_keys), *team_keys, *args)
        await pipe.execute()

    await gather_limited([partial(batch, s) for s in range(0, count, BATCH)], limit=3)
    return ids


async def scaling_grabs(services: Services, live: int, sizes: Sizes) -> dict[str, Any]:
    """Grab rate on random packets among `live` live ones; bytes per packet and per grab."""
    redis = services.redis
    await redis.flushall()
    before = await used_memory(redis)
    began = time.perf_counter()
    ids = await create_packets_pipelined(services, live)
    create_s = time.perf_counter() - began
    created = await used_memory(redis)
    rng = random.Random(live)
    requests = [(rng.choice(ids), f"g{i}") for i in range(sizes.scaling_ops)]
    seconds, latencies, answers = await run_grabs(
        lambda p, u: groupbuy_grab(services, p, u), requests
    )
    after = await used_memory(redis)
    statuses = Counter(a["status"] for _p, _u, a in answers)
    grabbed = statuses["grabbed"]
    memory = {
        "bytes_per_live_packet": round((created - before) / live, 1),
        "bytes_per_grab": round((after - created) / max(grabbed, 1), 1),
    }
    correct = {
        "winners": grabbed,
        "over_capacity": 0,
        "duplicates": 0,
        "spurious_failures": statuses.total() - grabbed - statuses["sold_out"],
        "outcomes": dict(statuses),
    }
    note = (
        f"grab on random packets among {live:,} live ({SCALING_SHARES} shares each, created "
        f"in {create_s:.2f} s pipelined); {memory['bytes_per_live_packet']:.0f} B/packet, "
        f"{memory['bytes_per_grab']:.0f} B/grab (incl. its outbox entry; a packet's first grab "
        "also creates its grabs hash and first stream node, so sparse grabs cost more)"
    )
    return make_row(
        "scaling", "groupbuy", seconds, latencies, correct, note,
        operation="grab", live=live, memory=memory,
    )  # fmt: skip


async def scaling_locks(services: Services, live: int, sizes: Sizes, run: str) -> dict[str, Any]:
    """Lock rate on random teams among `live` open ones; bytes per team and per lock."""
    redis = services.redis
    await redis.flushall()
    aid = f"scale{live}-{run}"
    before = await used_memory(redis)
    began = time.perf_counter()
    ids = await create_teams_pipelined(services, aid, live)
    create_s = time.perf_counter() - began
    created = await used_memory(redis)
    engine, meter, rng = GroupbuyTeams(services), Meter(), random.Random(live)
    calls = [(rng.choice(ids), f"l{i}") for i in range(sizes.scaling_ops)]
    began = time.perf_counter()
    results = await asyncio.gather(
        *(meter.measure(partial(engine.lock, aid, t, u)) for t, u in calls)
    )
    seconds = time.perf_counter() - began
    after = await used_memory(redis)
    statuses = Counter(results)
    locked = statuses["locked"]
    memory = {
        "bytes_per_live_team": round((created - before) / live, 1),
        "bytes_per_lock": round((after - created) / max(locked, 1), 1),
    }
    correct = {
        "winners": locked,
        "over_capacity": 0,
        "duplicates": 0,
        "spurious_failures": statuses.total() - locked,
        "outcomes": dict(statuses),
    }
    note = (
        f"lock on random teams among {live:,} open (size {SCALING_TEAM_SIZE}, created in "
        f"{create_s:.2f} s pipelined), a new user each; "
        f"{memory['bytes_per_live_team']:.0f} B/team, {memory['bytes_per_lock']:.0f} B/lock"
    )
    return make_row(
        "scaling", "groupbuy", seconds, meter.latencies, correct, note,
        operation="lock", live=live, memory=memory,
    )  # fmt: skip
