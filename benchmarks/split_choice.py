"""Shares drawn at send time (queued in Redis) versus at grab time (randomness in ARGV).

Starts a private redis-server on a free loopback port, runs both designs on it with the
same client and concurrency, prints grabs/s, p50/p99 latency, send cost and memory per
packet, and stops the server. Usage: .venv/bin/python -m benchmarks.split_choice
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from typing import Any

from groupbuy.redpacket.scripts import PacketScripts
from groupbuy.redpacket.split import double_mean
from groupbuy.settings import RedisSettings
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import Keys
from groupbuy.storage.redis_client import connect_redis
from groupbuy.storage.scripts import Scripts
from groupbuy.testing.servers import start_redis

SHARES = 10_000
PACKETS = 4
CONCURRENCY = 64

# The alternative design: the grab script draws the share itself from a uniform number
# the caller passes (drawn with secrets), applying the same double-mean rule.
GRAB_TIME_SCRIPT = """
local p = redis.call('HMGET', KEYS[1], 'remaining_count', 'remaining_cents')
local left, cents = tonumber(p[1]), tonumber(p[2])
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {3} end
if left == 0 then return {4} end
local share = cents
if left > 1 then
  local whole = math.floor((2 * cents - left) / left)
  local fraction = (2 * cents - left) % left
  local upper = whole
  if tonumber(ARGV[3]) < fraction then upper = whole + 1 end
  share = 1 + math.floor(tonumber(ARGV[2]) * upper)
end
redis.call('HSET', KEYS[2], ARGV[1], share)
redis.call('HSET', KEYS[1], 'remaining_count', left - 1, 'remaining_cents', cents - share)
redis.call('XADD', KEYS[3], '*', 'user_id', ARGV[1], 'amount_cents', share)
return {0, share, left - 1}
"""


async def timed(calls: list[Any]) -> tuple[float, list[float]]:
    gate = asyncio.Semaphore(CONCURRENCY)
    latencies: list[float] = []

    async def one(call: Any) -> None:
        async with gate:
            began = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(one(c) for c in calls))
    return time.perf_counter() - began, latencies


def describe(name: str, seconds: float, latencies: list[float]) -> str:
    cuts = statistics.quantiles(latencies, n=100)
    return (
        f"{name:<28} {len(latencies) / seconds:>9,.0f} grabs/s   p50 {cuts[49] * 1000:5.2f} ms"
        f"   p99 {cuts[98] * 1000:5.2f} ms"
    )


async def main(url: str) -> None:
    redis = connect_redis(RedisSettings(url=url))
    scripts = Scripts(redis)
    await scripts.load()
    keys = Keys("bench")
    packets = PacketScripts(scripts, keys, RedisClock())
    pre0 = keys.packet_keys("pre0")
    now = int(time.time() * 1000)

    began = time.perf_counter()
    for i in range(PACKETS):
        shares = double_mean(1_000_000, SHARES)
        await packets.create(
            f"pre{i}",
            shares,
            sender_id="s",
            amount_cents=1_000_000,
            count=SHARES,
            strategy="double_mean",
            created_ms=now,
            expires_ms=now + 3_600_000,
            retention_ms=60_000,
        )
    send_pre = (time.perf_counter() - began) / PACKETS
    memory_pre = sum([await redis.memory_usage(k) or 0 for k in (pre0.hash, pre0.shares)])

    grab_time = redis.register_script(GRAB_TIME_SCRIPT)
    began = time.perf_counter()
    for i in range(PACKETS):
        await redis.hset(
            f"bench:{{q:{i}}}:packet",
            mapping={"remaining_count": SHARES, "remaining_cents": 1_000_000},
        )
    send_draw = (time.perf_counter() - began) / PACKETS
    memory_draw = await redis.memory_usage("bench:{q:0}:packet") or 0

    def pre_call(i: int) -> Any:
        pid = f"pre{i % PACKETS}"
        return lambda: packets.grab(pid, f"u{i}", f"t{i}", 60_000)

    def draw_call(i: int) -> Any:
        tag = f"bench:{{q:{i % PACKETS}}}"
        return lambda: grab_time(
            keys=[f"{tag}:packet", f"{tag}:grabs", f"{tag}:outbox"],
            args=[f"u{i}", secrets.randbelow(2**52) / 2**52, secrets.randbelow(SHARES)],
        )

    total = SHARES * PACKETS
    pre = await timed([pre_call(i) for i in range(total)])
    draw = await timed([draw_call(i) for i in range(total)])
    print(
        f"redis-server at {url}; {PACKETS} packets x {SHARES} shares, "
        f"{CONCURRENCY} concurrent grabs"
    )
    print(describe("drawn at send (product)", *pre))
    print(describe("drawn at grab (alternative)", *draw))
    print(
        f"send: {send_pre * 1000:.1f} ms per 10k-share packet at send vs {send_draw * 1000:.2f} ms;"
        f" memory before grabs: {memory_pre / 1024:.0f} KiB vs {memory_draw / 1024:.1f} KiB"
    )
    await redis.aclose()


if __name__ == "__main__":
    server = start_redis()
    try:
        asyncio.run(main(server.url))
    finally:
        server.stop()
