"""What the journal of acknowledged grabs costs the flash grab: alternated rounds with it
on (each answer noted, written to SQLite every 0.5 s in the background, as `groupbuy
serve` runs it) and off (noting disabled), same services, same packet sizes.

    .venv/bin/python -m benchmarks.engine.ack_journal [rounds]
"""

from __future__ import annotations

import asyncio
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.engine.common import (
    QUICK,
    close_services,
    flash_requests,
    groupbuy_grab,
    make_row,
    open_services,
    say,
    warm_up,
)
from benchmarks.engine.flash_grab import run_grabs
from groupbuy.redpacket.acks import AckJournal
from groupbuy.services import Services
from groupbuy.testing.servers import start_redis


async def _round(services: Services, journal: bool, run: str, shares: int, users: int) -> Any:
    packets = services.packets
    packet_id, amount = f"ack-{run}", shares * 100
    await packets.accounts.deposit(f"s-{run}", amount, f"ack-{run}")
    await packets.sending.send(f"s-{run}", amount, shares, packet_id=packet_id)
    requests = [(packet_id, u) for u in flash_requests(users, random.Random(run))]
    real_note = AckJournal.note
    if journal:
        packets.acks.start()
    else:
        packets.acks.note = lambda *args: None  # type: ignore[method-assign]
    try:
        seconds, latencies, answers = await run_grabs(
            lambda p, u: groupbuy_grab(services, p, u), requests
        )
        began = time.perf_counter()
        await packets.acks.stop()  # the last write belongs to this round's cost
        seconds += time.perf_counter() - began
    finally:
        packets.acks.note = real_note.__get__(packets.acks)  # type: ignore[method-assign]
    winners = sum(1 for _p, _u, a in answers if a["status"] == "grabbed")
    name = "journal on" if journal else "journal off"
    note = f"1 packet x {shares} shares, {users} users + 60% double taps"
    return make_row("ack_journal", name, seconds, latencies, {"winners": winners}, note)


async def main(rounds: int) -> None:
    """Alternate on/off rounds and print the median throughput ratio."""
    server = start_redis()
    directory = Path(tempfile.mkdtemp(prefix="groupbuy-ackbench-"))
    services = await open_services(server.url, f"sqlite+aiosqlite:///{directory}/bench.db")
    ratios: list[float] = []
    try:
        await warm_up(services)
        await _round(services, True, "warm", QUICK.shares, QUICK.users)
        for i in range(rounds):
            pair = {}
            for journal in (i % 2 == 0, i % 2 != 0):  # alternate which goes first
                run = f"{i}-{int(journal)}-{secrets.token_hex(2)}"
                pair[journal] = await _round(services, journal, run, 3000, 15000)
            ratios.append(pair[True]["ops_per_s"] / pair[False]["ops_per_s"])
    finally:
        await close_services(services)
        server.stop()
    say(
        f"journal on / off: median {statistics.median(ratios):.2f}x over {rounds} rounds "
        f"({', '.join(f'{r:.2f}' for r in ratios)})"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
