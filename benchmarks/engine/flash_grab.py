"""flash_grab: one red packet, thousands of users (60% tap twice), 256 at once;
groupbuy (one EVALSHA per grab) against the naive SETNX-mutex baseline."""

from __future__ import annotations

import random
from typing import Any

from benchmarks.engine.common import Sizes, flash_requests, grade_grabs, groupbuy_grab, run_grabs
from benchmarks.harness import CONCURRENCY, make_row
from benchmarks.naive import NaivePackets
from groupbuy.services import Services


async def flash_grab_groupbuy(services: Services, sizes: Sizes, run: str) -> dict[str, Any]:
    """One packet of K shares, U users plus double taps, through RedPacketService.grab."""
    packet_id, amount = f"flash-{run}", sizes.shares * 100
    await services.packets.accounts.deposit(f"sender-{run}", amount, f"flash-{run}")
    await services.packets.sending.send(f"sender-{run}", amount, sizes.shares, packet_id=packet_id)
    requests = [(packet_id, u) for u in flash_requests(sizes.users, random.Random(1))]
    seconds, latencies, answers = await run_grabs(
        lambda p, u: groupbuy_grab(services, p, u), requests
    )
    correct = grade_grabs([(u, a) for _p, u, a in answers], sizes.shares)
    recorded = await services.redis.hlen(services.keys.packet_keys(packet_id).grabs)
    correct["sum_ok"] = correct["granted_cents"] == amount and recorded == correct["winners"]
    correct["winners_ok"] = correct["winners"] == sizes.shares
    note = (
        f"1 packet x {sizes.shares} shares, {sizes.users} users + 60% double taps, "
        f"{CONCURRENCY} concurrent; RedPacketService.grab (one EVALSHA)"
    )
    return make_row("flash_grab", "groupbuy", seconds, latencies, correct, note)


async def flash_grab_naive(services: Services, sizes: Sizes, run: str) -> dict[str, Any]:
    """The same load on the SETNX-mutex baseline."""
    naive = NaivePackets(services.redis)
    packet_id, amount = f"flash-{run}", sizes.shares * 100
    shares = [amount // sizes.shares] * sizes.shares
    await naive.create(packet_id, shares)
    requests = [(packet_id, u) for u in flash_requests(sizes.users, random.Random(1))]
    seconds, latencies, answers = await run_grabs(naive.grab, requests)
    correct = grade_grabs([(u, a) for _p, u, a in answers], sizes.shares)
    grabs, left = await naive.state(packet_id)
    correct["sum_ok"] = correct["granted_cents"] + sum(left) == amount
    correct["winners_ok"] = correct["winners"] == sizes.shares
    correct["shares_left"] = len(left)
    correct["too_many_people"] = correct["outcomes"].get("too_many_people", 0)
    note = (
        "naive: SET NX PX 100 mutex per packet, up to 10 tries 1 ms apart, then HEXISTS, "
        "LLEN, LPOP, HSET, DEL (6+ round trips); 'too many people' counted as spurious"
    )
    return make_row("flash_grab", "naive", seconds, latencies, correct, note)
