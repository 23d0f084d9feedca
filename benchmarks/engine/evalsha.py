"""evalsha_grab / evalsha_lock: redis-benchmark running the project's own scripts by
EVALSHA (the ceiling without any Python): the lock plain and pipelined (-P 16), the grab
pipelined (its plain run alternates with the engine's in benchmarks/engine/versus.py)."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from benchmarks.engine.common import Sizes, say
from groupbuy.locks.lock import TEAM_LOCK
from groupbuy.locks.scripts import TeamScripts
from groupbuy.redpacket.scripts import PACKET_GRAB, PacketScripts
from groupbuy.services import Services
from groupbuy.storage.scripts import script_source


def redis_benchmark_binary() -> str | None:
    """redis-benchmark on PATH, or Debian's, or None."""
    found = shutil.which("redis-benchmark")
    if found:
        return found
    return "/usr/bin/redis-benchmark" if Path("/usr/bin/redis-benchmark").exists() else None


async def redis_benchmark(
    binary: str, port: int, requests: int, pipeline: int, *cmd: str
) -> dict[str, Any]:
    """Run redis-benchmark -q on one command; its requests/s and p50 (ms)."""
    args = [binary, "-h", "127.0.0.1", "-p", str(port), "-c", "50", "-n", str(requests)]
    args += ["-r", "100000000", "-P", str(pipeline), "-q", *cmd]
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    text = out.decode(errors="replace") + err.decode(errors="replace")
    rates = re.findall(r"([\d.]+) requests per second", text)
    p50 = re.findall(r"p50=([\d.]+) msec", text)
    if process.returncode != 0 or not rates:
        raise RuntimeError(f"redis-benchmark failed: {text.strip()[-300:]}")
    return {"rps": float(rates[-1]), "p50_ms": float(p50[-1]) if p50 else None}


async def prepare_bench_packet(services: Services, packet_id: str, shares: int) -> None:
    """A packet of `shares` one-cent shares, straight through packet_create."""
    now = await services.clock.now_ms(services.redis)
    await PacketScripts(services.scripts, services.keys, services.clock).create(
        packet_id,
        [1] * shares,
        sender_id="bench",
        amount_cents=shares,
        count=shares,
        strategy="equal",
        created_ms=now,
        expires_ms=now + 3_600_000,
        retention_ms=60_000,
    )


async def prepare_bench_team(services: Services, aid: str, tid: str) -> None:
    """An activity with a huge team size and one open team of it (Redis only)."""
    keys = services.keys
    await services.redis.hset(
        keys.activity(aid),
        mapping={"team_size": 10**9, "lock_ttl_ms": 3_600_000, "team_deadline_ms": 86_400_000},
    )
    await TeamScripts(services.scripts, keys, services.clock).open(aid, tid, "lead", "", 0)


def bench_row(
    script: str, pipeline: int, requests: int, result: dict[str, Any], winners: int
) -> dict[str, Any]:
    """A redis-benchmark result as a row (only p50 is known)."""
    rps = result["rps"]
    row = {
        "scenario": f"evalsha_{script}",
        "level": "redis-benchmark",
        "implementation": "redis-benchmark evalsha",
        "ops": requests,
        "seconds": round(requests / rps, 4),
        "ops_per_s": rps,
        "p50_ms": result["p50_ms"],
        "p95_ms": None,
        "p99_ms": None,
        "correct": {"winners": winners, "over_capacity": 0, "duplicates": 0},
        "latencies_ms": [],
        "note": f"redis-benchmark -c 50 -n {requests} -P {pipeline}: EVALSHA of "
        f"lua/{'packet_grab' if script == 'grab' else 'team_lock'}.lua, a new user each call",
        "pipeline": pipeline,
    }
    say(f"evalsha_{script:<5} -P {pipeline:<2} {rps:>10,.0f} req/s  p50 {result['p50_ms']} ms")
    return row


async def redis_benchmark_rows(
    services: Services, redis_url: str, sizes: Sizes
) -> list[dict[str, Any]]:
    """redis-benchmark on the grab script with -P 16, on the lock script plain and -P 16."""
    binary = redis_benchmark_binary()
    if binary is None:
        say("redis-benchmark not found: skipped")
        return []
    port = urlparse(redis_url).port or 6379
    redis, keys, n = services.redis, services.keys, sizes.bench_requests
    grab_sha = await redis.script_load(script_source("packet_grab"))
    lock_sha = await redis.script_load(script_source("team_lock"))
    rows = []
    # The grab at -P 1 is measured in alternation with the engine (benchmarks/engine/versus.py).
    for pipeline in (16,):
        pid = f"rb{pipeline}"
        await prepare_bench_packet(services, pid, n + n // 5)
        packet_keys = PACKET_GRAB.key_list(keys.packet_keys(pid))
        cmd = ["EVALSHA", grab_sha, str(len(packet_keys)), *packet_keys]
        cmd += PACKET_GRAB.arg_list(
            {
                "packet_id": pid,
                "shift_ms": "0",
                "user_id": "user:__rand_int__",
                "request_token": "token",
                "resend_window_ms": "60000",
            }
        )
        result = await redis_benchmark(binary, port, n, pipeline, *cmd)
        winners = await redis.hlen(keys.packet_keys(pid).grabs)
        rows.append(bench_row("grab", pipeline, n, result, winners))
    for pipeline in (1, 16):
        aid, tid = f"rb{pipeline}", "t0"
        await prepare_bench_team(services, aid, tid)
        user_key = keys.user_lock(aid, "__rand_int__")
        lock_keys = TEAM_LOCK.key_list(
            keys.team_keys(aid, tid),
            keys.activity_keys(aid),
            user_lock=user_key,
            blocklist=keys.activity_blocklist(aid),
            activity_hash=keys.activity(aid),
        )
        cmd = ["EVALSHA", lock_sha, str(len(lock_keys)), *lock_keys]
        cmd += TEAM_LOCK.arg_list(
            {
                "activity_id": aid,
                "team_id": tid,
                "shift_ms": "0",
                "user_key_prefix": keys.user_key_prefix(aid),
                "user_id": "user:__rand_int__",
                "other_team_id": "",
            }
        )
        result = await redis_benchmark(binary, port, n, pipeline, *cmd)
        winners = await redis.zcard(keys.team_locks(aid, tid))
        rows.append(bench_row("lock", pipeline, n, result, winners))
    return rows
