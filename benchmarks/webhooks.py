"""Webhooks: how fast one process delivers, the CPU per POST of its HTTP client, and the
lag from an event's commit to its delivery at a steady rate, alone and beside five dead
endpoints.

The receiver (benchmarks/webhook_receiver.py) runs under uvicorn in a process of its own;
the deliverer runs in this one, on its own SQLite file. Usage, alone:

    .venv/bin/python -m benchmarks.webhooks [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import uvloop

from benchmarks.interleave import Trial, comparison
from benchmarks.measure import Row, percentile, result_row
from groupbuy.migrations import upgrade
from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.storage.events import Event, record_events
from groupbuy.webhooks.sender import Sender
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


CPU_POSTS = 3000  # POSTs per contender and round in client_cpu, MAX_IN_FLIGHT at a time


async def _aiohttp_posts(url: str, body: bytes) -> float:
    """CPU seconds this process spent on CPU_POSTS POSTs through an aiohttp session."""
    slots = asyncio.Semaphore(SETTINGS.max_in_flight)
    connector = aiohttp.TCPConnector(limit=SETTINGS.max_in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with slots, session.post(url, data=body, headers=JSON) as answer:
                await answer.read()
                answer.raise_for_status()

        began = time.process_time()
        await asyncio.gather(*(one() for _ in range(CPU_POSTS)))
        return time.process_time() - began


async def _sender_posts(url: str, body: bytes) -> float:
    """CPU seconds this process spent on CPU_POSTS POSTs through the deliveries' Sender."""
    slots = asyncio.Semaphore(SETTINGS.max_in_flight)
    sender = Sender(SETTINGS.timeout_s, SETTINGS.max_in_flight, allow_private_networks=True)

    async def one() -> None:
        async with slots:
            reply = await sender.post("bench", url, body, {"webhook-id": "evt_1"})
        if not reply.succeeded:
            raise RuntimeError(f"the receiver answered {reply}")

    try:
        began = time.process_time()
        await asyncio.gather(*(one() for _ in range(CPU_POSTS)))
        return time.process_time() - began
    finally:
        await sender.aclose()


def client_cpu(base: str, rounds: int) -> list[Row]:
    """CPU per POST of the deliveries' HTTP client against an aiohttp session, each on a
    uvloop loop of its own (as in `groupbuy serve`), in alternated rounds."""
    url, body = f"{base}/fast", orjson.dumps({"type": "bench", "data": {"data": {}}})
    contenders = {"http1": _sender_posts, "aiohttp": _aiohttp_posts}
    trials: dict[str, list[Trial]] = {name: [] for name in contenders}
    for index in range(rounds):
        names = list(contenders) if index % 2 == 0 else list(contenders)[::-1]
        for name in names:
            seconds = uvloop.run(contenders[name](url, body))
            trials[name].append(Trial(CPU_POSTS, seconds, {"posts": CPU_POSTS}))
    rows: list[Row] = []
    for name, label in (("http1", "groupbuy http1 client"), ("aiohttp", "aiohttp session")):
        cpu_us = statistics.median(1e6 * t.seconds / t.ops for t in trials[name])
        middle = sorted(trials[name], key=lambda t: t.seconds)[len(trials[name]) // 2]
        rows.append(
            result_row(
                "webhook_client_cpu",
                LEVEL,
                label,
                middle.ops,
                middle.seconds,
                (None, None, None),
                {"cpu_us_per_post": round(cpu_us, 1), "rounds": rounds},
                f"{CPU_POSTS} POSTs to the bare receiver, {SETTINGS.max_in_flight} at a time, "
                "on uvloop; ops/s: POSTs per CPU second of the sending process",
            )
        )
    rows.append(
        comparison(
            "webhook_client_cpu_http1_vs_aiohttp",
            "POSTs per CPU second: groupbuy's delivery client / an aiohttp session",
            trials["http1"],
            trials["aiohttp"],
            None,
        )
    )
    return rows


async def steady_lag(
    url: str, base: str, rate: int, seconds: float, dead: int, scenario: str | None = None
) -> Row:
    """Events committed at `rate`/s for `seconds` while one process delivers them: the lag
    from commit to the receiver, with `dead` endpoints that never answer beside it."""
    await _client().delete(f"{base}/lags")
    database = Database(url)
    await upgrade(database)
    hooks = WebhookService(database, SETTINGS)
    await hooks.create(EndpointSpec("fast", f"{base}/fast", ("*",)))
    for n in range(dead):
        await hooks.create(EndpointSpec(f"dead{n}", f"{base}/dead", ("*",)))
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
        scenario or ("webhook_lag" if not dead else "webhook_lag_dead_beside"),
        LEVEL,
        f"{rate} events/s, {dead} dead endpoints, {url.split('+')[0]}",
        len(lags),
        seconds,
        (percentile(lags, 0.5), percentile(lags, 0.95), percentile(lags, 0.99)),
        {"committed": sent, "delivered": len(set(got["seen"]))},
        "p50/p95/p99: commit to arrival at the receiver (ms); ops/s: the rate offered",
        latencies_ms=[v * 1000 for v in lags],
    )


async def dead_beside(directory: Path, base: str, rounds: int, seconds: float) -> list[Row]:
    """The lag at 200 events/s alone and beside DEAD dead endpoints, in alternated rounds
    (each on a new SQLite file): the last round's two rows, and the per-round ratio of the
    p99s (beside dead / alone) with its median and spread."""
    p99s: dict[int, list[float]] = {0: [], DEAD: []}
    last: dict[int, Row] = {}
    for index in range(rounds):
        for dead in (0, DEAD) if index % 2 == 0 else (DEAD, 0):
            url = f"sqlite+aiosqlite:///{directory}/lag-{index}-{dead}.db"
            last[dead] = await steady_lag(url, base, 200, seconds, dead)
            p99s[dead].append(float(last[dead]["p99_ms"] or 0))
    ratios = [d / a for d, a in zip(p99s[DEAD], p99s[0], strict=True) if a > 0]
    median = statistics.median(ratios) if ratios else None
    compared: Row = {
        "comparison": "webhook_lag_p99_dead_vs_alone",
        "what": f"webhook lag p99 at 200 events/s, beside {DEAD} dead endpoints / alone",
        "ratios": [round(r, 4) for r in ratios],
        "median": round(median, 4) if median is not None else None,
        "min": round(min(ratios), 4) if ratios else None,
        "max": round(max(ratios), 4) if ratios else None,
        "rounds": len(ratios),
        "target_min": None,  # the target is a bound from above: no measurable cost
        "met": None,
        "percent": False,
        "p99_ms_alone": p99s[0],
        "p99_ms_beside_dead": p99s[DEAD],
    }
    return [last[0], last[DEAD], compared]


async def postgres_vs_sqlite(directory: Path, base: str, rounds: int, seconds: float) -> list[Row]:
    """The lag at 200 events/s on PostgreSQL (a throwaway cluster, a new database per
    round) and on SQLite, in alternated rounds: the last round's PostgreSQL row, and the
    per-round ratio of the p99s (PostgreSQL / SQLite)."""
    cluster = start_postgres()
    p99s: dict[str, list[float]] = {"postgresql": [], "sqlite": []}
    last: Row = {}
    try:
        for index in range(rounds):
            for kind in ("postgresql", "sqlite") if index % 2 == 0 else ("sqlite", "postgresql"):
                if kind == "postgresql":
                    url = cluster.create_database(f"lag{index}")
                else:
                    url = f"sqlite+aiosqlite:///{directory}/lag-pg-{index}.db"
                row = await steady_lag(url, base, 200, seconds, 0, f"webhook_lag_{kind}")
                p99s[kind].append(float(row["p99_ms"] or 0))
                if kind == "postgresql":
                    last = row
    finally:
        cluster.stop()
    ratios = [p / s for p, s in zip(p99s["postgresql"], p99s["sqlite"], strict=True) if s > 0]
    compared: Row = {
        "comparison": "webhook_lag_p99_postgresql_vs_sqlite",
        "what": "webhook lag p99 at 200 events/s, PostgreSQL / SQLite",
        "ratios": [round(r, 4) for r in ratios],
        "median": round(statistics.median(ratios), 4) if ratios else None,
        "min": round(min(ratios), 4) if ratios else None,
        "max": round(max(ratios), 4) if ratios else None,
        "rounds": len(ratios),
        "target_min": None,  # the target is the p99 itself: <= 1 s (issue 22)
        "met": None,
        "percent": False,
        "p99_ms_postgresql": p99s["postgresql"],
        "p99_ms_sqlite": p99s["sqlite"],
    }
    return [last, compared]


async def run_webhooks(directory: Path, quick: bool) -> list[Row]:
    """Every webhook row, each on a SQLite file of its own in `directory`."""
    process, base = start_receiver()
    try:
        events, seconds, rounds = (1000, 3.0, 2) if quick else (5000, 10.0, 4)
        rows = [await throughput(f"sqlite+aiosqlite:///{directory}/t.db", base, events)]
        rows += await asyncio.to_thread(client_cpu, base, rounds + 1)
        rows += await dead_beside(directory, base, rounds, seconds)
        rows += await postgres_vs_sqlite(directory, base, rounds, seconds)
        return rows
    finally:
        global _http
        if _http is not None:
            await _http.aclose()
            _http = None
        process.terminate()  # the dead endpoint's requests are cut after 1 s
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
