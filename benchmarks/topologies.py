"""topologies: the write-behind on PostgreSQL beside SQLite (same redis-server, same run;
docs/benchmarking.md says how).

Guards the write-behind drain: PostgreSQL against SQLite, quoted in docs/deploy.md.

`python -m benchmarks.topologies [--quick]` runs it alone, on a PostgreSQL of its own.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections.abc import Awaitable, Callable

from sqlalchemy import func, select

from benchmarks.engine.background import credit_latency
from benchmarks.engine.common import flash_requests, run_grabs, say
from benchmarks.harness import (
    Bench,
    Row,
    Trial,
    close_services,
    comparison,
    open_services,
    run_async,
    standalone,
    trials_row,
)
from groupbuy.redpacket.models import GrabRow
from groupbuy.services import Services
from tests.support.postgres import start_postgres

PACKETS, SHARES, USERS = 4, 500, 750  # per write-behind round: 2,000 grab rows


def write_behind_trial(services: Services, run: str) -> Callable[[int], Awaitable[Trial]]:
    """A flash grab with the writer idle, then the drain timed: rows/s of the write-behind."""

    async def trial(index: int) -> Trial:
        sender, tag = f"wb-{run}", f"wb-{run}-{index}"
        await services.packets.accounts.deposit(sender, PACKETS * SHARES * 100, tag)
        requests = []
        for p in range(PACKETS):
            packet_id = f"{tag}-{p}"
            await services.packets.sending.send(sender, SHARES * 100, SHARES, packet_id=packet_id)
            requests += [(packet_id, u) for u in flash_requests(USERS, random.Random(p))]
        random.Random(index).shuffle(requests)
        _seconds, _latencies, answers = await run_grabs(services, requests)
        grabbed = sum(a["status"] == "grabbed" for _p, _u, a in answers)
        began = time.perf_counter()
        latencies, rows = [], 0
        while True:  # what flush_records does, round after round, until nothing is left
            round_began = time.perf_counter()
            applied = await services.packets.writer.drain_all()
            if not applied:
                break
            rows += applied
            latencies.append(time.perf_counter() - round_began)
        seconds = time.perf_counter() - began
        async with services.database.sessions() as session:
            stored = await session.scalar(
                select(func.count()).select_from(GrabRow).where(GrabRow.packet_id.like(f"{tag}-%"))
            )
        correct = {"grabbed": grabbed, "grab_rows": int(stored or 0)}
        correct["all_recorded"] = correct["grab_rows"] == grabbed
        return Trial(int(stored or 0), seconds, correct, latencies)

    return trial


def run_topologies(bench: Bench) -> list[Row]:
    """The drain rate alternated over SQLite and a PostgreSQL of its own, then the lag
    once on each."""
    postgres = start_postgres()
    try:
        databases = {"SQLite": bench.sqlite("write-behind"),
                     "PostgreSQL": postgres.create_database("bench")}  # fmt: skip
        rounds = bench.rounds or (3 if bench.quick else 5)
        return asyncio.run(_measure(bench.redis_url, databases, rounds, secrets.token_hex(3)))
    finally:
        postgres.stop()


async def _measure(redis_url: str, databases: dict[str, str], rounds: int, run: str) -> list[Row]:
    # One key prefix per database: each writer drains only what its own database records.
    opened = {
        name: await open_services(redis_url, url, key_prefix=f"wb{i}")
        for i, (name, url) in enumerate(databases.items())
    }
    try:
        trials = await run_async(
            {name: write_behind_trial(s, run) for name, s in opened.items()},
            rounds,
            say=lambda line: say(f"write-behind {line.strip()}"),
        )
        note = (
            f"{PACKETS} packets x {SHARES} shares grabbed by {USERS} users + 60% double taps "
            "each with the writer idle, then the backlog drained as flush_records does; ops = "
            "grab rows (each with its ledger credit), latency = one write-behind round"
        )
        rows = [trials_row("write_behind", f"groupbuy on {n}", t, note) for n, t in trials.items()]
        rows.append(
            comparison(
                "write_behind_postgresql_vs_sqlite",
                "write-behind rows/s, PostgreSQL / SQLite (flash grab backlog drained)",
                trials["PostgreSQL"],
                trials["SQLite"],
                None,
                percent=True,
            )
        )
        for name, services in opened.items():
            row = await credit_latency(services, SHARES, USERS, f"{run}-{name}", 0, 0)
            row["implementation"] = f"groupbuy write-behind on {name}"
            rows.append(row)
        return rows
    finally:
        for services in opened.values():
            await close_services(services)


if __name__ == "__main__":
    standalone(run_topologies, __doc__)
