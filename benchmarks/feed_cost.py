"""What the events feed's positions cost (groupbuy/storage/events.py), on SQLite and on a
throwaway PostgreSQL: an event write with and without the position indexes, a feed read
with nothing waiting for a position beside a read by id as the feed did before positions,
and a write followed by the read that positions it. One client, the variants' calls
taking turns, over tables of `--rows` events. Usage:

    .venv/bin/python -m benchmarks.feed_cost [--rows 50000] [--calls 2000] [--only sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlalchemy import select, text

from groupbuy import migrations
from groupbuy.storage.db import Database
from groupbuy.storage.events import (
    Event,
    EventRow,
    assign_positions,
    read_feed,
    record_event,
    record_events,
)
from groupbuy.testing.postgres import start_postgres

PAGE = 100
_keys = itertools.count()


def _event() -> Event:
    return Event("bench.event", 1_000, f"b{next(_keys)}", {"packet_id": "p", "version": 1})


async def _interleaved(
    calls: int, variants: dict[str, Callable[[], Awaitable[object]]]
) -> dict[str, tuple[float, float]]:
    """Median and p99 of each variant in microseconds, the variants taking turns call by
    call (in a rotating order) so that a busy machine weighs on each of them alike."""
    took: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(calls):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            started = time.perf_counter()
            await variants[name]()
            took[name].append((time.perf_counter() - started) * 1e6)
    figures = {}
    for name, times in took.items():
        times.sort()
        figures[name] = (statistics.median(times), times[int(len(times) * 0.99) - 1])
    return figures


async def _write_one(database: Database) -> None:
    async with database.transaction() as session:
        await record_event(session, _event())


async def _read_by_id(database: Database, after: int) -> None:
    async with database.sessions() as session:
        rows = await session.scalars(
            select(EventRow).where(EventRow.id > after).order_by(EventRow.id).limit(PAGE)
        )
        [json.loads(row.data) for row in rows]


async def _filled(url: str, rows: int, positions: bool) -> Database:
    """A database holding `rows` events, all positioned; without the position indexes
    (the schema before positions) unless `positions`."""
    database = Database(url)
    await migrations.upgrade(database)
    for _ in range(0, rows, 5000):
        async with database.transaction() as session:
            await record_events(session, [_event() for _ in range(5000)])
    while await assign_positions(database):
        pass
    if not positions:
        async with database.transaction() as session:
            await session.execute(text("DROP INDEX uq_events_position"))
            await session.execute(text("DROP INDEX ix_events_unpositioned"))
    return database


async def _measure(name: str, urls: tuple[str, str, str], rows: int, calls: int) -> None:
    before = await _filled(urls[0], rows, positions=False)
    after_ = await _filled(urls[1], rows, positions=True)
    # Plain writes go to a table of their own: on `after_`, the read that finds nothing
    # waiting must find nothing waiting.
    writes = await _filled(urls[2], rows, positions=True)
    cursor = rows - PAGE // 2  # a page of half the usual size: a reader near the head

    async def write_then_read() -> None:
        await _write_one(after_)
        await read_feed(after_, cursor, PAGE)

    figures = await _interleaved(
        calls,
        {
            "event write, before positions": lambda: _write_one(before),
            "event write, with positions": lambda: _write_one(writes),
            "feed read by id, before positions": lambda: _read_by_id(before, cursor),
            "feed read, nothing waiting": lambda: read_feed(after_, cursor, PAGE),
            "event write + feed read positioning it": write_then_read,
        },
    )
    await before.dispose()
    await after_.dispose()
    await writes.dispose()
    print(f"\n{name}: {rows} events in each table, {calls} calls of each variant, interleaved")
    for what, (median, p99) in figures.items():
        print(f"  {what:<40} median {median:8.0f} us   p99 {p99:8.0f} us")


async def _main(rows: int, calls: int, only: str | None) -> None:
    if only in (None, "sqlite"):
        with tempfile.TemporaryDirectory() as directory:
            a, b, c = (f"sqlite+aiosqlite:///{Path(directory) / n}" for n in ("a", "b", "c"))
            await _measure("SQLite", (a, b, c), rows, calls)
    if only in (None, "postgresql"):
        cluster = start_postgres()
        try:
            a, b, c = (cluster.create_database(n) for n in ("before", "after", "writes"))
            await _measure("PostgreSQL", (a, b, c), rows, calls)
        finally:
            cluster.stop()


def main() -> None:
    """Parse the sizes and measure on each database."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--only", choices=["sqlite", "postgresql"])
    args = parser.parse_args()
    asyncio.run(_main(args.rows, args.calls, args.only))


if __name__ == "__main__":
    main()
