"""Webhooks: how fast one process delivers, and the lag from an event's commit to its
delivery at a steady rate, on SQLite and on PostgreSQL.

The receiver (benchmarks/webhook_receiver.py) runs under uvicorn in a process of its own;
the deliverer runs in this one, on its own SQLite file. Usage, alone:

    .venv/bin/python -m benchmarks.webhooks [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.measure import Row, percentile, result_row
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
DEAD = 5  # endpoints that never answer, beside the healthy one
JSON = {"content-type": "application/json"}


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


# One client for the benchmark's own questions to the receiver: a new httpx client builds an
# SSL context (slow, and the deliverer's loop stalls meanwhile).
_http: httpx.AsyncClient | None = None


def _client() -> httpx.AsyncClient:
    global _http
    if _http is None:
        _http = httpx.AsyncClient(verify=False)
    return _http


async def _received(base: str) -> dict[str, Any]:
    answer: dict[str, Any] = (await _client().get(f"{base}/lags")).json()
    return answer


async def _until_received(base: str, count: int, timeout_s: float) -> None:
    """Wait until the receiver has seen `count` distinct deliveries (or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = (await _client().get(f"{base}/count")).json()["seen"]
        if seen >= count or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.1)


async def throughput(url: str, base: str, events: int) -> Row:
    """`events` committed first, then one process delivers them all to the fast receiver."""
    database = Database(url)
    await upgrade(database)
    hooks = WebhookService(database, SETTINGS)
    await hooks.create(EndpointSpec("fast", f"{base}/fast", ("*",)))
    for first in range(0, events, 1000):
        async with database.transaction() as session:
            await record_events(session, bench_events(first, min(1000, events - first)))
    began = time.perf_counter()
    hooks.start_delivering()
    try:
        await _until_received(base, events, timeout_s=300)
        seconds = time.perf_counter() - began
    finally:
        await hooks.stop_delivering()
        await database.dispose()
    seen = (await _received(base))["seen"]
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


async def steady_lag(url: str, base: str, rate: int, seconds: float, scenario: str) -> Row:
    """Events committed at `rate`/s for `seconds` while one process delivers them: the lag
    from commit to the receiver."""
    await _client().delete(f"{base}/lags")
    database = Database(url)
    await upgrade(database)
    hooks = WebhookService(database, SETTINGS)
    await hooks.create(EndpointSpec("fast", f"{base}/fast", ("*",)))
    hooks.start_delivering()
    sent = 0
    tick = 0.05
    began = time.perf_counter()
    try:
        while (elapsed := time.perf_counter() - began) < seconds:
            due = int(elapsed * rate) - sent
            if due > 0:
                async with database.transaction() as session:
                    await record_events(session, bench_events(sent, due))
                sent += due
            await asyncio.sleep(tick)
        await _until_received(base, sent, timeout_s=30)
    finally:
        await hooks.stop_delivering()
        await database.dispose()
    got = await _received(base)
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


async def run_webhooks(directory: Path, quick: bool) -> list[Row]:
    """Every webhook row, each on a SQLite file of its own in `directory`."""
    process, base = start_receiver()
    try:
        events, seconds = (1000, 3.0) if quick else (5000, 10.0)
        rows = [await throughput(f"sqlite+aiosqlite:///{directory}/t.db", base, events)]
        lag = f"sqlite+aiosqlite:///{directory}/lag.db"
        rows.append(await steady_lag(lag, base, 200, seconds, "webhook_lag"))
        postgres = start_postgres()
        try:
            lag = postgres.create_database("lag")
            rows.append(await steady_lag(lag, base, 200, seconds, "webhook_lag_postgresql"))
        finally:
            postgres.stop()
        return rows
    finally:
        global _http
        if _http is not None:
            await _http.aclose()
            _http = None
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="groupbuy-hooks-") as directory:
        rows = asyncio.run(run_webhooks(Path(directory), args.quick))
    for row in rows:
        shown = {k: v for k, v in row.items() if k != "latencies_ms"}
        print(shown)


if __name__ == "__main__":
    main()
