"""Webhooks: how fast one process delivers, and the lag from an event's commit to its
delivery at a steady rate, on SQLite and on PostgreSQL.

The receiver (benchmarks/webhook_receiver.py) runs under uvicorn in a process of its own;
the deliverer runs in this one, on its own database. Usage, alone:

    .venv/bin/python -m benchmarks.webhooks [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import httpx

from benchmarks.harness import Bench, Row, percentile, result_row, standalone
from groupbuy.migrations import upgrade
from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.storage.events import Event, record_events
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.postgres import start_postgres
from tests.support.servers import free_port

LEVEL = "webhooks"
SETTINGS = WebhookSettings(allow_http=True, allow_private_networks=True)


def start_receiver() -> tuple[subprocess.Popen[bytes], str]:
    """The receiver on a free loopback port, once it answers."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "benchmarks.webhook_receiver:app",
            "--port",
            str(port),
            "--log-level",
            "critical",
            "--no-access-log",
            "--timeout-graceful-shutdown",
            "1",
        ],
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{base}/lags", timeout=1).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise RuntimeError("the webhook receiver did not start")
        time.sleep(0.05)


def bench_events(first: int, count: int) -> list[Event]:
    """`count` team events numbered from `first`, stamped now (the receiver's lag clock)."""
    now = time.time_ns() // 1_000_000
    return [
        Event(
            "team.opened",
            now,
            f"bench:{n}",
            {"activity_id": "bench", "team_id": f"t{n}", "version": 1, "sent_at_ms": now},
        )
        for n in range(first, first + count)
    ]


@contextlib.asynccontextmanager
async def _deliverer(url: str, base: str) -> AsyncIterator[tuple[Database, WebhookService]]:
    """A migrated database with one endpoint on the receiver, and its deliverer (stopped
    and disposed at the end)."""
    database = Database(url)
    await upgrade(database)
    hooks = WebhookService(database, SETTINGS)
    await hooks.create(EndpointSpec("fast", f"{base}/fast", ("*",)))
    try:
        yield database, hooks
    finally:
        await hooks.stop_delivering()
        await database.dispose()


async def _until_received(http: httpx.AsyncClient, base: str, count: int, timeout_s: float) -> None:
    """Wait until the receiver has seen `count` distinct deliveries (or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while (await http.get(f"{base}/count")).json()["seen"] < count:
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(0.1)


async def throughput(http: httpx.AsyncClient, url: str, base: str, events: int) -> Row:
    """`events` committed first, then one process delivers them all to the fast receiver."""
    async with _deliverer(url, base) as (database, hooks):
        for first in range(0, events, 1000):
            async with database.transaction() as session:
                await record_events(session, bench_events(first, min(1000, events - first)))
        began = time.perf_counter()
        hooks.start_delivering()
        await _until_received(http, base, events, timeout_s=300)
        seconds = time.perf_counter() - began
    seen = (await http.get(f"{base}/lags")).json()["seen"]
    return result_row(
        "webhook_throughput",
        LEVEL,
        f"groupbuy http1 client, SQLite, max_in_flight {SETTINGS.max_in_flight}",
        events,
        seconds,
        (None, None, None),
        {"delivered": len(set(seen)), "attempts": len(seen)},
        "events committed first, then delivered by one process to a bare uvicorn receiver",
    )


async def steady_lag(
    http: httpx.AsyncClient, url: str, base: str, rate: int, seconds: float, scenario: str
) -> Row:
    """Events committed at `rate`/s for `seconds` while one process delivers them: the lag
    from commit to the receiver."""
    await http.delete(f"{base}/lags")
    sent = 0
    async with _deliverer(url, base) as (database, hooks):
        hooks.start_delivering()
        began = time.perf_counter()
        while (elapsed := time.perf_counter() - began) < seconds:
            due = int(elapsed * rate) - sent
            if due > 0:
                async with database.transaction() as session:
                    await record_events(session, bench_events(sent, due))
                sent += due
            await asyncio.sleep(0.05)
        await _until_received(http, base, sent, timeout_s=30)
    got = (await http.get(f"{base}/lags")).json()
    lags = sorted(v / 1000 for v in got["lags_ms"])
    return result_row(
        scenario,
        LEVEL,
        f"{rate} events/s, 0 dead endpoints, {url.split('+')[0]}",
        len(lags),
        seconds,
        (percentile(lags, 0.5), percentile(lags, 0.95), percentile(lags, 0.99)),
        {"committed": sent, "delivered": len(set(got["seen"]))},
        "p50/p95/p99: commit to arrival at the receiver (ms); ops/s: the rate offered",
        latencies_ms=[v * 1000 for v in lags],
    )


def run_webhooks(bench: Bench) -> list[Row]:
    """Every webhook row, each on a database of its own."""
    process, base = start_receiver()
    postgres = start_postgres()
    try:
        return asyncio.run(_measure(bench, base, postgres.create_database("lag")))
    finally:
        postgres.stop()
        process.terminate()
        process.wait(timeout=30)


async def _measure(bench: Bench, base: str, postgres_url: str) -> list[Row]:
    events, seconds = (1000, 3.0) if bench.quick else (5000, 10.0)
    # One client for the questions to the receiver: a new httpx client builds an SSL
    # context (slow, and the deliverer's loop stalls meanwhile).
    async with httpx.AsyncClient(verify=False) as http:
        return [
            await throughput(http, bench.sqlite("throughput"), base, events),
            await steady_lag(http, bench.sqlite("lag"), base, 200, seconds, "webhook_lag"),
            await steady_lag(http, postgres_url, base, 200, seconds, "webhook_lag_postgresql"),
        ]


if __name__ == "__main__":
    standalone(run_webhooks, __doc__)
