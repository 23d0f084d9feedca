"""Interleaved engine comparisons at 64 concurrent callers (docs/benchmarking.md says how);
they guard the grab and the seat lock against the seed-style peer (target 2x) and the
coalesced round trips (auto_pipeline on / off, quoted in docs/architecture.md).
"""

from __future__ import annotations

import gc
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

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
from groupbuy.services import Services

CALLERS = 64  # concurrent callers, like a small service's request handlers
SEATS = TEAM_SIZE - 1  # a team of 5 opens with its leader: 4 seats to lock
ON = f"groupbuy ({CALLERS} callers)"
OFF = f"groupbuy, auto_pipeline off ({CALLERS} callers)"
PEER = f"seed-style lua ({CALLERS} callers)"


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
    flash = f"{sizes.versus_shares} shares, {sizes.versus_users} users; {rounds} rounds"
    seats = f"{sizes.versus_teams} teams, {2 * SEATS * sizes.versus_teams} users; {rounds} rounds"
    for name in (ON, OFF, PEER):
        rows.append(trials_row("flash_grab", name, grabs[name], flash))
    for name in (ON, OFF, PEER):
        rows.append(trials_row("seat_locks", name, locks[name], seats))
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
    return rows
