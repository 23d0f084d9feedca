"""Webhooks: the delivery hot path (docs/benchmarking.md says how).

Guards the targets of docs/benchmarks-findings.md: lag p99 within 1 s at 200 events/s
(SQLite, PostgreSQL), delivery of at least 1,000 events/s while `groupbuy serve` answers an
open-loop grab, and the grab and seat-lock rates with three endpoints subscribed at least
0.9x those without.

Usage, alone: .venv/bin/python -m benchmarks.webhooks [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import (
    Bench,
    Groupbuy,
    Row,
    Server,
    Trial,
    comparison,
    groupbuy,
    make_row,
    plan_of,
    run_sync,
    serve,
    standalone,
    wait_idle,
)
from benchmarks.http_level import (
    FULL,
    QUICK,
    flash_grab,
    groupbuy_trial,
    load,
    open_loop,
    seat_locks,
    send_packets,
)
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


def receiver(workdir: Path) -> contextlib.AbstractContextManager[Server]:
    """The receiver under uvicorn on a free loopback port, once it answers."""
    port = free_port()
    args = [sys.executable, "-m", "uvicorn", "benchmarks.webhook_receiver:app", "--port",
            str(port), "--log-level", "critical", "--no-access-log",
            "--timeout-graceful-shutdown", "1"]  # fmt: skip
    return serve(args, dict(os.environ), port, workdir / "receiver.log")


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
    return make_row(
        scenario,
        f"{rate} events/s, 0 dead endpoints, {url.split('+')[0]}",
        seconds,
        lags,
        {"committed": sent, "delivered": len(set(got["seen"]))},
        "p50/p95/p99: commit to arrival at the receiver (ms); ops/s: the rate offered",
        level=LEVEL,
    )


# Loopback receivers over plain HTTP, as in the benchmark's own receiver.
WEBHOOK_ENV = {
    "GROUPBUY_WEBHOOKS_ALLOW_HTTP": "true",
    "GROUPBUY_WEBHOOKS_ALLOW_PRIVATE_NETWORKS": "true",
}
SUBSCRIBED = 3  # endpoints subscribed to everything, for the rows with webhooks
TARGET_RATIO = 0.9  # issue 22: within 10 % of the rows without webhooks
# The open-loop grab rate while delivering: this share of the closed loop's rate.
OPEN_LOOP_SHARE = 0.5


@contextlib.contextmanager
def _server(bench: Bench, tag: str, base: str, endpoints: int) -> Iterator[Groupbuy]:
    """A server that may deliver to the loopback receiver, with `endpoints` subscribed."""
    with groupbuy(bench.redis_url, bench.workdir, 1, tag, **WEBHOOK_ENV) as target:
        for n in range(endpoints):
            target.client.post(
                "/v1/admin/webhooks",
                json={"endpoint_id": f"hook{n}", "url": f"{base}/fast", "event_types": ["*"]},
            ).raise_for_status()
        yield target


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
    bench: Bench, base: str, events: int, seconds: int, rate: float | None, tag: str
) -> Trial:
    """`events` committed 1 s into `seconds` of flash grabs at the same server, closed loop
    (wrk, `rate` None) or open loop at `rate` grabs/s: its deliveries per second until all
    arrived or the load ended, and its grabs per second."""
    httpx.delete(f"{base}/lags", timeout=30)
    load_average = os.getloadavg()[0]
    with _server(bench, tag, base, 1) as target:
        packets = [f"pk-{tag}-{i}" for i in range(seconds * 2 + 1)]
        send_packets(target.client, tag, packets, 1_000_000, 10_000)
        driven: dict[str, Any] = {}

        def drive() -> None:
            url = target.server.url
            if rate is None:
                driven.update(load(url, seconds, "grab", *packets))
            else:
                driven.update(open_loop(url, rate, seconds, tag, "grab", *packets))

        driver = threading.Thread(target=drive)
        driver.start()
        time.sleep(1.0)  # the load is running
        began = time.perf_counter()
        asyncio.run(_commit(bench.sqlite(f"bench-{tag}"), events))
        seen = 0
        while driver.is_alive() and seen < events:
            time.sleep(0.1)
            seen = _seen(base)
        elapsed = time.perf_counter() - began
        driver.join()
        errors = target.server.log_errors()
    extra: dict[str, Any] = {}
    if rate is None:
        grabs_per_s = driven["requests"] / (driven["duration_us"] / 1e6)
        grab_5xx = int(driven.get("c5xx", 0))
    else:
        # Answers per second of the load's span (the run's own seconds include the wait
        # for the last answers, which the unanswered count says).
        grabs_per_s = driven["answered"] / seconds
        grab_5xx = sum(n for code, n in driven["statuses"].items() if str(code).startswith("5"))
        extra = {
            "grabs_offered_per_s": driven["offered_per_s"],
            "grabs_unanswered": driven["unanswered"],
            "grab_p99_ms": driven["p99_ms"],
            "generator_kept_up": driven["generator_kept_up"],
        }
    correct = {
        "committed": events,
        "delivered_while_loaded": seen,
        "grabs_per_s": round(grabs_per_s, 1),
        "grab_5xx": grab_5xx,
        "server_log_errors": errors,
        "load_average": load_average,
        **extra,
    }
    return Trial(seen, elapsed, correct)


def serving_rounds(bench: Bench, base: str, events: int, seconds: int, rounds: int) -> list[Row]:
    """Delivery while serving, the deliverer on the request loop: under the closed-loop
    flash grab at saturation, then under an open-loop one at OPEN_LOOP_SHARE of the closed
    loop's median rate."""
    closed = [
        delivery_while_serving(bench, base, events, seconds, None, f"ws{n}c") for n in range(rounds)
    ]
    rate = round(statistics.median(t.correct["grabs_per_s"] for t in closed) * OPEN_LOOP_SHARE, 1)
    opened = [
        delivery_while_serving(bench, base, events, seconds, rate, f"ws{n}o") for n in range(rounds)
    ]
    return [
        _serving_row("closed loop, request loop", closed, events, seconds),
        _serving_row("open loop, request loop", opened, events, seconds),
    ]


def _serving_row(name: str, runs: list[Trial], events: int, seconds: int) -> Row:
    """A load's rounds as one row: the median round's deliveries/s, every round's
    deliveries/s, grabs/s and load average beside it."""
    middle = sorted(runs, key=lambda t: t.rate)[len(runs) // 2]
    correct = {
        **middle.correct,
        "events_per_s_rounds": [round(t.rate, 1) for t in runs],
        "grabs_per_s_rounds": [t.correct["grabs_per_s"] for t in runs],
        "load_average_rounds": [t.correct["load_average"] for t in runs],
    }
    return make_row(
        "webhook_throughput_serving",
        f"groupbuy serve (1 worker), SQLite, max_in_flight 8, {name}",
        middle.seconds,
        [],
        correct,
        f"{events} events committed 1 s into a {seconds} s flash grab on the same server "
        f"({name}); ops/s: the median round's deliveries per second until all arrived or "
        "the load ended",
        ops=middle.ops,
        level=LEVEL,
        percentiles_ms=(None, None, None),
    )


def subscribed_vs_not(bench: Bench, base: str) -> list[Row]:
    """The flash grab and seat-lock rates on a server with SUBSCRIBED endpoints and on one
    without, in alternated rounds: per round the ratio with/without."""
    plan = plan_of(bench, FULL, QUICK)
    httpx.delete(f"{base}/lags", timeout=30)
    with _server(bench, "hk", base, SUBSCRIBED) as hooked, _server(bench, "pl", base, 0) as plain:
        servers = [hooked.server, plain.server]
        contenders = {
            "grab, webhooks": groupbuy_trial(flash_grab, hooked, plan.round_s),
            "grab, none": groupbuy_trial(flash_grab, plain, plan.round_s),
            "locks, webhooks": groupbuy_trial(seat_locks, hooked, plan.round_s),
            "locks, none": groupbuy_trial(seat_locks, plain, plan.round_s),
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


def run_webhooks(bench: Bench) -> list[Row]:
    """Every row of this module, against one receiver."""
    postgres = start_postgres()
    try:
        with receiver(bench.workdir) as running:
            base = running.url
            seconds = 3.0 if bench.quick else 10.0
            rows = asyncio.run(_lags(bench, base, postgres.create_database("lag"), seconds))
            events, load_s = (3000, 6) if bench.quick else (10_000, 15)
            rounds = bench.rounds or (2 if bench.quick else 3)
            rows += serving_rounds(bench, base, events, load_s, rounds)
            return rows + subscribed_vs_not(bench, base)
    finally:
        postgres.stop()


async def _lags(bench: Bench, base: str, postgres_url: str, seconds: float) -> list[Row]:
    # One client for the questions to the receiver: a new httpx client builds an SSL
    # context (slow, and the deliverer's loop stalls meanwhile).
    async with httpx.AsyncClient(verify=False) as http:
        return [
            await steady_lag(http, bench.sqlite("lag"), base, 200, seconds, "webhook_lag"),
            await steady_lag(http, postgres_url, base, 200, seconds, "webhook_lag_postgresql"),
        ]


if __name__ == "__main__":
    standalone(run_webhooks, __doc__)
