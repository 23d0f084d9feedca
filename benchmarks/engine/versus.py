"""Interleaved engine comparisons at 64 concurrent callers (benchmarks/harness.py).

- flash grab: the engine (RedPacketService.grab, auto_pipeline on), the same engine with
  auto_pipeline off, and the seed-style Lua peer (benchmarks/seed_peer.py), each round a
  fresh packet and the same requests for all three;
- seat locks: SeatService.lock (on and off) and the peer's lock script, each round fresh
  teams and the same (user, team) requests for all three;
- fresh grabs: the engine against redis-benchmark running EVALSHA of lua/packet_grab.lua
  (-c 50 -P 1), a new user every call for both.

Every trial is graded: winners, over capacity, duplicates, spurious failures.
"""

from __future__ import annotations

import asyncio
import gc
import random
import re
import shutil
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import urlparse

from benchmarks.engine.common import (
    TEAM_SIZE,
    GroupbuyTeams,
    Sizes,
    flash_requests,
    grade_grabs,
    open_teams,
    run_calls,
    run_grabs,
    say,
)
from benchmarks.harness import Row, Trial, comparison, gather_limited, run_async, trials_row
from benchmarks.seed_peer import SeedPeer
from groupbuy.redpacket.grab import PACKET_GRAB
from groupbuy.redpacket.send import packet_create
from groupbuy.redpacket.specs import PacketScripts
from groupbuy.services import Services
from groupbuy.storage.scripts import script_source

CALLERS = 64  # concurrent callers, like a small service's request handlers
SEATS = TEAM_SIZE - 1  # a team of 5 opens with its leader: 4 seats to lock
ON = f"groupbuy ({CALLERS} callers)"
OFF = f"groupbuy, auto_pipeline off ({CALLERS} callers)"
PEER = f"seed-style lua ({CALLERS} callers)"
BENCH_CLIENTS = 50


async def idle() -> None:
    """No collection left over from one contender's garbage in the next trial."""
    gc.collect()


async def alternate(
    contenders: dict[str, Callable[[int], Awaitable[Trial]]], rounds: int, what: str
) -> dict[str, list[Trial]]:
    """The contenders' trials in alternated rounds, announced."""
    say(f"{what}: {' / '.join(contenders)}, {rounds} rounds")
    return await run_async(contenders, rounds, between=idle, say=say)


# -- flash grab -----------------------------------------------------------------------


def _flash(sizes: Sizes, index: int) -> list[str]:
    return flash_requests(sizes.versus_users, random.Random(index))


def grab_engine(
    services: Services, sizes: Sizes, run: str, label: str
) -> Callable[[int], Awaitable[Trial]]:
    """A round: one fresh packet of `versus_shares`, the flash requests, through the service."""

    async def trial(index: int) -> Trial:
        packet_id, amount = f"vs-{run}-{label}-{index}", sizes.versus_shares * 100
        sender = f"vs-sender-{run}-{label}"
        await services.packets.accounts.deposit(sender, amount, f"vs-{run}-{label}-{index}")
        await services.packets.sending.send(
            sender, amount, sizes.versus_shares, packet_id=packet_id
        )
        requests = [(packet_id, u) for u in _flash(sizes, index)]
        seconds, latencies, answers = await run_grabs(services, requests, CALLERS)
        correct = grade_grabs([(u, a) for _p, u, a in answers], sizes.versus_shares)
        recorded = await services.redis.hlen(services.keys.packet_keys(packet_id).grabs)
        correct["sum_ok"] = correct["granted_cents"] == amount and recorded == correct["winners"]
        return Trial(len(answers), seconds, correct, latencies)

    return trial


def grab_peer(peer: SeedPeer, sizes: Sizes, run: str) -> Callable[[int], Awaitable[Trial]]:
    """The same round on the seed-style peer (its packet pre-split into equal amounts)."""

    async def trial(index: int) -> Trial:
        packet_id, amount = f"vs-{run}-{index}", sizes.versus_shares * 100
        await peer.create_packet(packet_id, [100] * sizes.versus_shares)
        requests = [(packet_id, u) for u in _flash(sizes, index)]
        seconds, latencies, answers = await run_calls(peer.grab, requests, CALLERS)
        outcomes = [(u, a) for _p, u, a in answers]
        correct = grade_grabs(outcomes, sizes.versus_shares, repeat_amount=False)
        recorded = await peer.redis.hlen(peer.packet_keys(packet_id)[0])
        correct["sum_ok"] = correct["granted_cents"] == amount and recorded == correct["winners"]
        return Trial(len(answers), seconds, correct, latencies)

    return trial


# -- seat locks -----------------------------------------------------------------------


def _lock_requests(sizes: Sizes, index: int) -> list[tuple[str, str]]:
    """(team, user): distinct users, each on a random team; twice as many as there are seats."""
    rng = random.Random(1000 + index)
    teams = [f"t{i}" for i in range(sizes.versus_teams)]
    return [(rng.choice(teams), f"u{i}") for i in range(2 * SEATS * sizes.versus_teams)]


def grade_locks(
    answers: list[tuple[str, str, str]], held: dict[str, list[str]], seats: int
) -> dict[str, Any]:
    """Final-state checks of a lock round (no lock expires or is released during it):
    teams holding more than `seats` locks, users locked in two teams, `locked` answers
    missing from their team, and refusals that were not due (team_full although the team
    ended with a free seat, or any other answer)."""
    holders = Counter(user for users in held.values() for user in users)
    outcomes = Counter(answer for _t, _u, answer in answers)
    lost = sum(1 for tid, user, answer in answers if answer == "locked" and user not in held[tid])
    spurious = sum(
        1
        for tid, _user, answer in answers
        if answer not in ("locked", "team_full")
        or (answer == "team_full" and len(held[tid]) < seats)
    )
    return {
        "winners": outcomes["locked"],
        "over_capacity": sum(len(users) > seats for users in held.values()),
        "duplicates": sum(n > 1 for n in holders.values()),
        "lost_locks": lost,
        "spurious_failures": spurious,
        "outcomes": dict(outcomes),
    }


def lock_engine(
    services: Services, sizes: Sizes, run: str, label: str
) -> Callable[[int], Awaitable[Trial]]:
    """A round: an activity with fresh teams of 5 (leader + 4 seats), the lock requests."""
    engine = GroupbuyTeams(services)

    async def trial(index: int) -> Trial:
        aid, teams = f"vs-{run}-{label}-{index}", [f"t{i}" for i in range(sizes.versus_teams)]
        await open_teams(services, aid, teams, TEAM_SIZE)
        requests = _lock_requests(sizes, index)
        seconds, latencies, answers = await run_calls(partial(engine.lock, aid), requests, CALLERS)
        keys = services.keys
        pipe = services.redis.pipeline(transaction=False)
        for tid in teams:
            pipe.zrange(keys.team_locks(aid, tid), 0, -1)
            pipe.hget(keys.team(aid, tid), "member_count")
        replies = await pipe.execute()
        held = {tid: list(replies[2 * i]) for i, tid in enumerate(teams)}
        correct = grade_locks(answers, held, SEATS)
        correct["members_ok"] = all(int(replies[2 * i + 1]) == 1 for i in range(len(teams)))
        return Trial(len(answers), seconds, correct, latencies)

    return trial


def lock_peer(peer: SeedPeer, sizes: Sizes, run: str) -> Callable[[int], Awaitable[Trial]]:
    """The same round on the seed-style peer's lock script (4 seats a team)."""

    async def trial(index: int) -> Trial:
        aid = f"vs-{run}-{index}"
        teams = [f"t{i}" for i in range(sizes.versus_teams)]
        requests = _lock_requests(sizes, index)
        seconds, latencies, answers = await run_calls(
            lambda tid, user: peer.lock(aid, tid, user, SEATS), requests, CALLERS
        )
        pipe = peer.redis.pipeline(transaction=False)
        for tid in teams:
            pipe.zrange(peer.team_key(aid, tid), 0, -1)
        replies = await pipe.execute()
        held = {tid: list(replies[i]) for i, tid in enumerate(teams)}
        return Trial(len(answers), seconds, grade_locks(answers, held, SEATS), latencies)

    return trial


# -- fresh grabs against redis-benchmark ------------------------------------------------


def redis_benchmark_binary() -> str | None:
    """redis-benchmark on PATH, or None."""
    return shutil.which("redis-benchmark")


async def redis_benchmark(binary: str, port: int, requests: int, *cmd: str) -> dict[str, Any]:
    """redis-benchmark -q -P 1 on one command; its requests/s and p50 (ms)."""
    args = [binary, "-h", "127.0.0.1", "-p", str(port), "-c", str(BENCH_CLIENTS)]
    args += ["-n", str(requests), "-r", "100000000", "-P", "1", "-q", *cmd]
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    text = (await process.communicate())[0].decode(errors="replace")
    rates = re.findall(r"([\d.]+) requests per second", text)
    p50 = re.findall(r"p50=([\d.]+) msec", text)
    if process.returncode != 0 or not rates:
        raise RuntimeError(f"redis-benchmark failed: {text.strip()[-300:]}")
    return {"rps": float(rates[-1]), "p50_ms": float(p50[-1]) if p50 else None}


async def prepare_bench_packet(services: Services, packet_id: str, shares: int) -> None:
    """A packet of `shares` one-cent shares, straight through packet_create."""
    now = await services.clock.now_ms(services.redis)
    packets = PacketScripts(services.scripts, services.keys, services.clock)
    await packet_create(
        packets, packet_id, [1] * shares, sender_id="bench", amount_cents=shares, count=shares,
        strategy="equal", created_ms=now, expires_ms=now + 3_600_000, retention_ms=60_000,
    )  # fmt: skip


def fresh_grab_engine(services: Services, sizes: Sizes) -> Callable[[int], Awaitable[Trial]]:
    """A round: `versus_fresh` grabs by new users of one big packet, through the service."""

    async def trial(index: int) -> Trial:
        packet_id, count = f"vf{index}", sizes.versus_fresh
        await prepare_bench_packet(services, packet_id, count)
        requests = [(packet_id, f"f{index}-{i}") for i in range(count)]
        seconds, latencies, answers = await run_grabs(services, requests, CALLERS)
        correct = grade_grabs([(u, a) for _p, u, a in answers], count)
        correct["all_grabbed"] = correct["winners"] == count
        return Trial(len(answers), seconds, correct, latencies)

    return trial


def fresh_grab_bench(
    services: Services, sizes: Sizes, binary: str, port: int
) -> Callable[[int], Awaitable[Trial]]:
    """A round: redis-benchmark -c 50 -P 1, EVALSHA of packet_grab, a new user each call."""

    async def trial(index: int) -> Trial:
        packet_id, n = f"vb{index}", sizes.versus_bench_requests
        sha = await services.redis.script_load(script_source("packet_grab"))
        await prepare_bench_packet(services, packet_id, n + n // 5)
        packet = services.keys.packet_keys(packet_id)
        keys = PACKET_GRAB.key_list(packet)
        cmd = ["EVALSHA", sha, str(len(keys)), *keys, packet_id, "0", "user:__rand_int__"]
        result = await redis_benchmark(binary, port, n, *cmd, "token", "60000")
        winners = await services.redis.hlen(packet.grabs)
        left = int(await services.redis.hget(packet.hash, "remaining_count"))
        # -r draws users at random: a few repeat (already_grabbed); a hash cannot hold a
        # user twice, so the check is that shares taken and grabs recorded agree.
        correct = {
            "winners": winners,
            "over_capacity": max(0, winners - (n + n // 5)),
            "shares_match_grabs": winners + left == n + n // 5,
        }
        return Trial(n, n / result["rps"], correct, percentiles_ms=(result["p50_ms"], None, None))

    return trial


# -- the comparisons ----------------------------------------------------------------------


async def versus_rows(
    services: Services, services_off: Services, redis_url: str, sizes: Sizes, run: str
) -> list[Row]:
    """The interleaved comparisons: rows for every contender and one comparison row each."""
    rows: list[Row] = []
    rounds = sizes.versus_rounds
    peer = SeedPeer(redis_url)
    try:
        await gather_limited([peer.redis.ping for _ in range(CALLERS)], limit=CALLERS)
        grabs = await alternate(
            {ON: grab_engine(services, sizes, run, "on"),
             OFF: grab_engine(services_off, sizes, run, "off"), PEER: grab_peer(peer, sizes, run)},
            rounds, "flash grab",
        )  # fmt: skip
        locks = await alternate(
            {ON: lock_engine(services, sizes, run, "on"),
             OFF: lock_engine(services_off, sizes, run, "off"), PEER: lock_peer(peer, sizes, run)},
            rounds, "seat locks",
        )  # fmt: skip
    finally:
        await peer.aclose()
    how = f"{CALLERS} concurrent callers; {rounds} rounds, contenders in rotating order"
    flash = (
        f"each round 1 packet x {sizes.versus_shares} shares, {sizes.versus_users} users + 60% "
        f"double taps; {how}"
    )
    seats = (
        f"each round {sizes.versus_teams} fresh teams of {SEATS} free seats, "
        f"{2 * SEATS * sizes.versus_teams} distinct users each locking a random team; {how}"
    )
    grab_notes = {
        ON: "RedPacketService.grab (packet_grab.lua, outbox entry), calls coalesced",
        OFF: "RedPacketService.grab with [redis] auto_pipeline = false: one EVALSHA per call",
        PEER: "one EVALSHA per grab through register_script (HEXISTS, RPOP, HSET, LPUSH), "
        "default pool; a repeat answers without its amount",
    }
    lock_notes = {
        ON: "TeamService.lock (team_lock.lua), calls coalesced",
        OFF: "TeamService.lock with [redis] auto_pipeline = false",
        PEER: "one EVALSHA per lock through register_script (ZREMRANGEBYSCORE, ZCARD, ZADD), "
        "time from the caller's clock, no user-lock key",
    }
    for name in (ON, OFF, PEER):
        rows.append(trials_row("flash_grab", name, grabs[name], f"{grab_notes[name]}; {flash}"))
    for name in (ON, OFF, PEER):
        rows.append(trials_row("seat_locks", name, locks[name], f"{lock_notes[name]}; {seats}"))
    for key, what, mine, base, target in (
        ("engine_grab_vs_seed", f"engine grab / seed-style Lua peer (flash grab, {CALLERS} "
         "callers, interleaved)", grabs[ON], grabs[PEER], 2.0),
        ("engine_lock_vs_seed", f"engine seat lock / seed-style Lua peer ({CALLERS} callers, "
         "interleaved)", locks[ON], locks[PEER], 2.0),
        ("engine_grab_pipeline", "engine grab, auto_pipeline on / off (interleaved)",
         grabs[ON], grabs[OFF], None),
        ("engine_lock_pipeline", "engine seat lock, auto_pipeline on / off (interleaved)",
         locks[ON], locks[OFF], None),
        ("engine_lock_off_vs_seed", "engine seat lock with auto_pipeline off / seed-style Lua "
         "peer (interleaved)", locks[OFF], locks[PEER], None),
    ):  # fmt: skip
        rows.append(comparison(key, what, mine, base, target))
    rows += await _versus_redis_benchmark(services, redis_url, sizes)
    return rows


async def _versus_redis_benchmark(services: Services, redis_url: str, sizes: Sizes) -> list[Row]:
    binary = redis_benchmark_binary()
    if binary is None:
        say("redis-benchmark not found: engine grab / redis-benchmark skipped")
        return []
    rounds, bench = sizes.versus_rounds, "redis-benchmark evalsha"
    port = urlparse(redis_url).port or 6379
    trials = await alternate(
        {ON: fresh_grab_engine(services, sizes),
         bench: fresh_grab_bench(services, sizes, binary, port)},
        rounds, "fresh grabs",
    )  # fmt: skip
    how = f"{rounds} rounds, in rotating order with the other"
    engine = trials_row(
        "evalsha_grab",
        ON,
        trials[ON],
        f"RedPacketService.grab, {sizes.versus_fresh} new users per round on a packet with a "
        f"share for each, {CALLERS} concurrent callers; {how}",
    )
    bench_trials = trials[bench]
    base = trials_row(
        "evalsha_grab", bench, bench_trials,
        f"redis-benchmark -c {BENCH_CLIENTS} -n {sizes.versus_bench_requests} -P 1 per "
        f"round: EVALSHA of lua/packet_grab.lua, a new user each call (p50: median of the "
        f"rounds); {how}", level="redis-benchmark", pipeline=1,
    )  # fmt: skip
    return [
        engine,
        base,
        comparison(
            "engine_grab_vs_redis_benchmark",
            f"engine grab ({CALLERS} callers) / redis-benchmark EVALSHA of packet_grab.lua, "
            f"-c {BENCH_CLIENTS} -P 1 (fresh users, interleaved)",
            trials[ON],
            bench_trials,
            0.5,
            percent=True,
        ),
    ]
