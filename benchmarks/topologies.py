"""topologies: the write-behind on PostgreSQL beside SQLite (same redis-server, same run).

Each round a flash grab (PACKETS packets, every share taken, 60% double taps) while the
writer waits, then the write-behind drains the backlog as `flush_records` does; rows/s is
grab rows (each with its ledger credit) per second of draining. Rounds alternate the two
databases; the ratio is taken per round. Then, once per database, the lag under a flash
grab with the scheduler running every job at its interval (benchmarks/engine/background.py
credit_latency): from a grab's answer to its credit in SQL (SPEC: within 2 s).

`python -m benchmarks.topologies [--quick]` runs it alone (starting its own redis-server
and PostgreSQL); benchmarks/run.py runs it in the full run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlalchemy import func, select

from benchmarks.engine.background import credit_latency
from benchmarks.engine.common import (
    close_services,
    flash_requests,
    groupbuy_grab,
    open_services,
    say,
    warm_up,
)
from benchmarks.engine.flash_grab import run_grabs
from benchmarks.engine.versus import trials_row
from benchmarks.interleave import Trial, comparison, run_async
from benchmarks.measure import Row
from groupbuy.redpacket.models import GrabRow
from groupbuy.services import Services

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
        _seconds, _latencies, answers = await run_grabs(
            lambda p, u: groupbuy_grab(services, p, u), requests
        )
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


async def write_behind_rows(
    redis_url: str, databases: dict[str, str], rounds: int, run: str
) -> list[Row]:
    """(a): the drain rate alternated over the databases, then the lag once on each."""
    # One key prefix per database: each writer drains only what its own database records.
    opened = {
        name: await open_services(redis_url, url, key_prefix=f"wb{i}")
        for i, (name, url) in enumerate(databases.items())
    }
    try:
        for services in opened.values():
            await warm_up(services)
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
        names = list(databases)
        if len(names) == 2:
            rows.append(
                comparison(
                    "write_behind_postgresql_vs_sqlite",
                    "write-behind rows/s, PostgreSQL / SQLite (flash grab backlog drained)",
                    trials[names[1]],
                    trials[names[0]],
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


async def run_topologies(
    redis_url: str, postgres_url: str, workdir: Path, quick: bool
) -> list[Row]:
    """The write-behind rows on the caller's redis-server, SQLite and PostgreSQL."""
    rounds = 3 if quick else 5
    databases = {
        "SQLite": f"sqlite+aiosqlite:///{workdir}/write-behind.db",
        "PostgreSQL": postgres_url,
    }
    return await write_behind_rows(redis_url, databases, rounds, secrets.token_hex(3))


def main() -> None:
    """Start a redis-server and a PostgreSQL; run; print the comparison."""
    from tests.support.postgres import start_postgres
    from tests.support.servers import start_redis

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds and small loads")
    args = parser.parse_args()
    server, postgres = start_redis(), start_postgres()
    try:
        postgres_url = postgres.create_database("bench")
        with tempfile.TemporaryDirectory(prefix="groupbuy-bench-") as workdir:
            rows = asyncio.run(run_topologies(server.url, postgres_url, Path(workdir), args.quick))
    finally:
        postgres.stop()
        server.stop()
    for row in rows:
        if "comparison" in row:
            print(f"{row['what']}: median {row['median']} ({row['min']}-{row['max']}, "
                  f"{row['rounds']} rounds)")  # fmt: skip


if __name__ == "__main__":
    main()
