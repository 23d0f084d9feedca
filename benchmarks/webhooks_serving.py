"""Webhooks in a process that also serves: how fast `groupbuy serve` delivers while wrk
drives flash grabs at it, and the flash grab and seat-lock rows with three endpoints
subscribed to everything against the same rows without webhooks (alternated rounds,
median ratio with its spread).

The receiver (benchmarks/webhook_receiver.py) and each server run in processes of their
own; the events to deliver are committed to the server's SQLite file from this process,
as the server's own write-behind would. Usage, alone:

    .venv/bin/python -m benchmarks.webhooks_serving [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.http_level import (
    FULL,
    QUICK,
    Groupbuy,
    Plan,
    _ensure_wrk,
    _flash_grab,
    _groupbuy,
    _groupbuy_trial,
    _load,
    _seat_locks,
    _send_packets,
)
from benchmarks.interleave import comparison, run_sync
from benchmarks.measure import Row, result_row
from benchmarks.servers import wait_idle
from benchmarks.webhooks import LEVEL, bench_events, start_receiver
from groupbuy.storage.db import Database
from groupbuy.storage.events import record_events
from groupbuy.testing.servers import start_redis

# Loopback receivers over plain HTTP, as in the benchmark's own receiver.
WEBHOOK_ENV = {
    "GROUPBUY_WEBHOOKS_ALLOW_HTTP": "true",
    "GROUPBUY_WEBHOOKS_ALLOW_PRIVATE_NETWORKS": "true",
}
SUBSCRIBED = 3  # endpoints subscribed to everything, for the rows with webhooks
TARGET_RATIO = 0.9  # issue 22: within 10 % of the rows without webhooks


@contextlib.contextmanager
def _server(redis_url: str, workdir: Path, tag: str) -> Iterator[Groupbuy]:
    with _groupbuy("uvicorn", redis_url, workdir, 1, tag, **WEBHOOK_ENV) as target:
        yield target


def _subscribe(target: Groupbuy, base: str, count: int) -> None:
    for n in range(count):
        target.client.post(
            "/v1/admin/webhooks",
            json={"endpoint_id": f"hook{n}", "url": f"{base}/fast", "event_types": ["*"]},
        ).raise_for_status()


def _seen(base: str) -> int:
    return int(httpx.get(f"{base}/count", timeout=30).json()["seen"])


async def _commit(url: str, events: int) -> None:
    database = Database(url)
    try:
        for first in range(0, events, 1000):
            async with database.transaction() as session:
                await record_events(session, bench_events(first, min(1000, events - first)))
    finally:
        await database.dispose()


def delivery_while_serving(
    redis_url: str, workdir: Path, base: str, wrk: str | None, events: int, seconds: int
) -> Row:
    """`events` committed while wrk drives flash grabs at the same server for `seconds`:
    the server's deliveries per second until all arrived or the load ended."""
    httpx.delete(f"{base}/lags", timeout=30)
    with _server(redis_url, workdir, "ws") as target:
        _subscribe(target, base, 1)
        packets = [f"pk-ws-{i}" for i in range(seconds * 2 + 1)]
        _send_packets(target.client, "ws", packets, 1_000_000, 10_000)
        load: dict[str, Any] = {}

        def drive() -> None:
            load.update(_load(wrk, target.server.url, seconds, "grab", *packets))

        driver = threading.Thread(target=drive)
        driver.start()
        time.sleep(1.0)  # the load is running
        began = time.perf_counter()
        asyncio.run(_commit(f"sqlite+aiosqlite:///{workdir}/bench-ws.db", events))
        seen = 0
        while driver.is_alive() and seen < events:
            time.sleep(0.1)
            seen = _seen(base)
        elapsed = time.perf_counter() - began
        driver.join()
        errors = target.server.log_errors()
    grabs_per_s = load["requests"] / (load["duration_us"] / 1e6)
    return result_row(
        "webhook_throughput_serving",
        LEVEL,
        "groupbuy serve (1 worker), SQLite, max_in_flight 8, while serving flash grabs",
        seen,
        elapsed,
        (None, None, None),
        {
            "committed": events,
            "delivered_while_loaded": seen,
            "grabs_per_s": round(grabs_per_s, 1),
            "grab_5xx": int(load.get("c5xx", 0)),
            "server_log_errors": errors,
        },
        f"{events} events committed 1 s into a {seconds} s wrk flash grab on the same "
        "server; ops/s: deliveries per second until all arrived or the load ended",
    )


def subscribed_vs_not(
    redis_url: str, workdir: Path, base: str, wrk: str | None, plan: Plan
) -> list[Row]:
    """The flash grab and seat-lock rows on a server with SUBSCRIBED endpoints and on one
    without, in alternated rounds: per round the ratio with/without."""
    httpx.delete(f"{base}/lags", timeout=30)
    with _server(redis_url, workdir, "hk") as hooked, _server(redis_url, workdir, "pl") as plain:
        _subscribe(hooked, base, SUBSCRIBED)
        servers = [hooked.server, plain.server]
        contenders = {
            "grab, webhooks": _groupbuy_trial(_flash_grab, hooked, wrk, plan.round_s),
            "grab, none": _groupbuy_trial(_flash_grab, plain, wrk, plan.round_s),
            "locks, webhooks": _groupbuy_trial(_seat_locks, hooked, wrk, plan.round_s),
            "locks, none": _groupbuy_trial(_seat_locks, plain, wrk, plan.round_s),
        }
        trials = run_sync(contenders, plan.rounds, between=lambda: wait_idle(servers))
        delivered = _seen(base)
    return [
        {
            **comparison(
                f"http_{scenario}_webhooks_vs_none",
                f"http {scenario} ops/s, {SUBSCRIBED} endpoints subscribed to everything / none",
                trials[f"{scenario}, webhooks"],
                trials[f"{scenario}, none"],
                TARGET_RATIO,
            ),
            "deliveries_during_rounds": delivered,
        }
        for scenario in ("grab", "locks")
    ]


def run_serving(redis_url: str, workdir: Path, quick: bool) -> list[Row]:
    """Every row of this module, against one receiver."""
    wrk = _ensure_wrk()
    process, base = start_receiver()
    try:
        events, seconds = (3000, 6) if quick else (10_000, 15)
        rows = [delivery_while_serving(redis_url, workdir, base, wrk, events, seconds)]
        rows += subscribed_vs_not(redis_url, workdir, base, wrk, QUICK if quick else FULL)
        return rows
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    server = start_redis()
    try:
        with tempfile.TemporaryDirectory(prefix="groupbuy-hooks-serving-") as directory:
            rows = run_serving(server.url, Path(directory), args.quick)
    finally:
        server.stop()
    for row in rows:
        print({k: v for k, v in row.items() if k != "latencies_ms"})


if __name__ == "__main__":
    main()
