"""What every benchmark scenario shares, so that a scenario is only what it measures: rows,
alternated trials, servers, running alone (docs/benchmarking.md, "The harness").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from groupbuy import migrations
from groupbuy.services import Services, build_services, settle_heap
from groupbuy.settings import Settings
from groupbuy.storage.db import Database
from groupbuy.storage.redis_client import connect_redis
from tests.support.servers import free_port, start_redis

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = 256  # operations in flight at once, unless a scenario says otherwise
LATENCY_SAMPLE = 2000  # latencies kept per row for the plot
ADMIN_KEY, SERVICE_KEY = "bench-admin-key-0123456789", "bench-service-key-0123456789"
IDLE_WINDOW_S, IDLE_CPU_SHARE, IDLE_TIMEOUT_S = 0.5, 0.1, 15.0
# The storms' synthetic users act hundreds of times a second each, a pace no shopper has:
# the per-user rate limits would refuse most of it. The per-key limits stay at their
# defaults.
BENCHMARK_USERS = {
    f"GROUPBUY_RATELIMIT_{route_class.upper()}_USER_QUOTA": "1000000"
    for route_class in ("seat", "grab", "send", "read")
}

Row = dict[str, Any]
"""One measured row, or a comparison row (it carries "comparison"; tables skip it)."""


@dataclass(frozen=True)
class Bench:
    """Where a scenario runs: the private Redis, a working directory, a quick or full run,
    and what its command line asked for (more rounds; only some parts)."""

    redis_url: str
    workdir: Path
    quick: bool = False
    rounds: int | None = None
    parts: tuple[str, ...] = ()

    def sqlite(self, name: str) -> str:
        """The URL of a SQLite file of the working directory."""
        return f"sqlite+aiosqlite:///{self.workdir / name}.db"


@dataclass(frozen=True)
class Plan:
    """How long a scenario's alternated rounds run (full run or quick run)."""

    rounds: int  # interleaved rounds, after a 1 s warm-up round
    round_s: int  # seconds of one round
    open_loop_s: int = 0  # seconds of an open-loop run, where there is one


def plan_of(bench: Bench, full: Plan, quick: Plan) -> Plan:
    """The full or quick plan, with the rounds the command line asked for."""
    plan = quick if bench.quick else full
    return dataclasses.replace(plan, rounds=bench.rounds) if bench.rounds else plan


def say(message: str, level: str = "bench") -> None:
    """One progress line."""
    print(f"[{level}] {message}", flush=True)


# -- measuring --------------------------------------------------------------------------


class Meter:
    """Bounds concurrency with a semaphore and records each operation's latency."""

    def __init__(self, concurrency: int = CONCURRENCY) -> None:
        self.gate = asyncio.Semaphore(concurrency)
        self.latencies: list[float] = []
        self.by_label: dict[str, list[float]] = defaultdict(list)

    async def measure(self, operation: Callable[[], Awaitable[Any]], label: str = "") -> Any:
        """Run one operation when a slot is free; its latency excludes the wait for the slot."""
        async with self.gate:
            began = time.perf_counter()
            try:
                return await operation()
            finally:
                elapsed = time.perf_counter() - began
                self.latencies.append(elapsed)
                if label:
                    self.by_label[label].append(elapsed)

    def breakdown(self) -> dict[str, dict[str, Any]]:
        """Count, p50 and p99 (ms) of each labelled kind of operation."""
        return {
            label: {"ops": len(v), "p50_ms": percentile(sorted(v), 0.5),
                    "p99_ms": percentile(sorted(v), 0.99)}
            for label, v in sorted(self.by_label.items())
        }  # fmt: skip


def percentile(ordered: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of sorted seconds, in ms."""
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return round(ordered[index] * 1000, 3)


async def gather_limited(calls: list[Callable[[], Awaitable[Any]]], limit: int = 32) -> list[Any]:
    """Run set-up calls with at most `limit` in flight (not measured)."""
    meter = Meter(limit)  # one gate for all calls: a Meter per call would bound nothing
    return await asyncio.gather(*(meter.measure(c) for c in calls))


def make_row(
    scenario: str,
    implementation: str,
    seconds: float,
    latencies: list[float],
    correct: dict[str, Any],
    note: str,
    ops: int | None = None,
    level: str = "engine",
    percentiles_ms: tuple[float | None, float | None, float | None] | None = None,
    **extra: Any,
) -> Row:
    """One result row in the shape benchmarks/run.py expects (extra keys allowed), from
    measured latencies (seconds; a sample kept for the plot), announced; `percentiles_ms`
    when the load generator reported only those."""
    ordered = sorted(latencies)
    sample = ordered if len(ordered) <= LATENCY_SAMPLE else random.sample(ordered, LATENCY_SAMPLE)
    if percentiles_ms is None:
        p = [percentile(ordered, f) for f in (0.5, 0.95, 0.99)]
        percentiles_ms = (p[0], p[1], p[2])
    ops = len(latencies) if ops is None else ops
    row = {
        "scenario": scenario,
        "level": level,
        "implementation": implementation,
        "ops": ops,
        "seconds": round(seconds, 4),
        "ops_per_s": round(ops / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": percentiles_ms[0],
        "p95_ms": percentiles_ms[1],
        "p99_ms": percentiles_ms[2],
        "correct": correct,
        "latencies_ms": [round(s * 1000, 3) for s in sample],
        "note": note,
        **extra,
    }
    say(f"{scenario:<14} {implementation:<34} {row['ops_per_s']:>10,.0f} ops/s  "
        f"p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms", level)  # fmt: skip
    return row


# -- alternated trials -------------------------------------------------------------------


@dataclass
class Trial:
    """One contender's measurement in one round."""

    ops: int
    seconds: float
    correct: dict[str, Any]
    latencies: list[float] = field(default_factory=list)  # seconds, when each call was timed
    percentiles_ms: tuple[float | None, float | None, float | None] | None = None  # else

    @property
    def rate(self) -> float:
        """Operations per second."""
        return self.ops / self.seconds if self.seconds > 0 else 0.0


def rotation(names: Sequence[str], round_index: int) -> list[str]:
    """The order of one round: the names rotated by the round's index (AB, BA, AB, ...)."""
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def _schedule(names: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, contender) of every trial: round 0 a warm-up, each round in rotating order."""
    for index in range(rounds + 1):
        for name in rotation(names, index):
            yield index, name


def _keep(trials: dict[str, list[Trial]], index: int, name: str, trial: Trial) -> str:
    """Keep a trial unless it is the warm-up; its progress line."""
    if index:
        trials[name].append(trial)
    what = "warm-up" if index == 0 else f"round {index}"
    return f"  {what:<8} {name:<34} {trial.rate:>10,.0f} ops/s"


def run_sync(
    contenders: Mapping[str, Callable[[int], Trial]],
    rounds: int,
    between: Callable[[], Any] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, list[Trial]]:
    """Every contender once per round (round 0 a dropped warm-up), in rotating order;
    `between` runs before each trial (e.g. waits for the servers to be idle)."""
    trials: dict[str, list[Trial]] = {name: [] for name in contenders}
    for index, name in _schedule(list(contenders), rounds):
        if between is not None:
            between()
        say(_keep(trials, index, name, contenders[name](index)))
    return trials


async def run_async(
    contenders: Mapping[str, Callable[[int], Awaitable[Trial]]],
    rounds: int,
    between: Callable[[], Awaitable[Any]] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, list[Trial]]:
    """run_sync for coroutine trials."""
    trials: dict[str, list[Trial]] = {name: [] for name in contenders}
    for index, name in _schedule(list(contenders), rounds):
        if between is not None:
            await between()
        say(_keep(trials, index, name, await contenders[name](index)))
    return trials


def comparison(
    key: str,
    what: str,
    mine: list[Trial],
    base: list[Trial],
    target: float | None,
    percent: bool = False,
) -> Row:
    """The per-round ratios of two contenders' rates, as a row the ratios table reads:
    median, lowest and highest round, and whether the median meets `target` (a minimum).
    Rows carrying "comparison" are not measurements: the tables and the plot skip them."""
    ratios = [a.rate / b.rate for a, b in zip(mine, base, strict=True) if b.rate > 0]
    median = statistics.median(ratios) if ratios else None
    return {
        "comparison": key,
        "what": what,
        "ratios": [round(r, 4) for r in ratios],
        "median": round(median, 4) if median is not None else None,
        "min": round(min(ratios), 4) if ratios else None,
        "max": round(max(ratios), 4) if ratios else None,
        "rounds": len(ratios),
        "target_min": target,
        "met": None if target is None or median is None else median >= target,
        "percent": percent,  # shown as a percentage rather than a multiple
    }


def merge_correct(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The correctness counts of several rounds as one: numbers summed, dicts merged by
    key, flags true only when true in every round."""
    merged: dict[str, Any] = {}
    for part in parts:
        for name, value in part.items():
            if isinstance(value, bool):
                merged[name] = merged.get(name, True) and value
            elif isinstance(value, int | float):
                merged[name] = merged.get(name, 0) + value
            elif isinstance(value, dict):
                merged[name] = merge_correct([merged.get(name, {}), value])
            else:
                merged[name] = value
    return merged


def trials_row(
    scenario: str,
    implementation: str,
    trials: list[Trial],
    note: str,
    level: str = "engine",
    **extra: Any,
) -> Row:
    """One row for a contender's rounds: ops and seconds summed, correctness merged,
    latencies pooled (or, when the trials kept only percentiles, each the rounds' median)."""
    latencies = [s for t in trials for s in t.latencies]
    percentiles = None
    if not latencies:
        found = [[t.percentiles_ms[i] for t in trials if t.percentiles_ms] for i in range(3)]
        m = [statistics.median([v for v in vs if v is not None] or [0]) for vs in found]
        percentiles = (m[0] or None, m[1] or None, m[2] or None)
    return make_row(
        scenario, implementation, sum(t.seconds for t in trials), latencies,
        merge_correct([t.correct for t in trials]), note, ops=sum(t.ops for t in trials),
        level=level, percentiles_ms=percentiles,
        rounds_ops_per_s=[round(t.rate, 1) for t in trials], **extra,
    )  # fmt: skip


# -- servers ------------------------------------------------------------------------------


@dataclass
class Server:
    """A running server: its URL, process and log."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_errors(self) -> int:
        """Tracebacks and ERROR lines in the log so far."""
        text = self.log.read_text(errors="replace")
        return text.count("Traceback") + text.count(" ERROR ")


@contextlib.contextmanager
def serve(args: list[str], env: dict[str, str], port: int, log: Path) -> Iterator[Server]:
    """Run a server in its own process group from the checkout; yield it once /healthz
    answers; SIGTERM it (then SIGKILL its group) at the end, even on error."""
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{args} exited with {process.returncode}; see {log}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args} did not answer /healthz in 30 s; see {log}")
                time.sleep(0.1)
            yield Server(url, process, log)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # workers left behind, if any


def create_schema(url: str) -> None:
    """Migrate the schema first, as `groupbuy db upgrade` does."""

    async def create() -> None:
        database = Database(url)
        try:
            await migrations.upgrade(database)
        finally:
            await database.dispose()

    asyncio.run(create())


def groupbuy_command(
    redis_url: str, workdir: Path, workers: int, tag: str, **settings: str
) -> tuple[list[str], dict[str, str], int]:
    """(argv, environment, port) of `groupbuy serve` with a key prefix and a SQLite file of
    its own; with no `redis_url`, it runs the embedded engine on a data directory of its
    own. `settings` are more GROUPBUY_* variables."""
    database = workdir / f"bench-{tag}.db"
    database.unlink(missing_ok=True)
    create_schema(f"sqlite+aiosqlite:///{database}")
    env = {
        **os.environ,
        "GROUPBUY_REDIS_URL": redis_url,
        "GROUPBUY_REDIS_KEY_PREFIX": f"gb{tag}",
        "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
        "GROUPBUY_API_KEYS": f"admin:{ADMIN_KEY},service:{SERVICE_KEY}",
        "GROUPBUY_SCHEDULER_ENABLED": "true",
        "GROUPBUY_EMBEDDED_DATA_DIR": str(workdir / f"embedded-{tag}"),
        **BENCHMARK_USERS,
        **settings,
    }
    port = free_port()
    args = [sys.executable, "-m", "groupbuy.cli", "serve", "--host", "127.0.0.1"]
    return [*args, "--port", str(port), "--workers", str(workers)], env, port


def bare_command(redis_url: str, workers: int) -> tuple[list[str], dict[str, str], int]:
    """(argv, environment, port) of benchmarks/bare_app.py under uvicorn."""
    port = free_port()
    env = {**os.environ, "BARE_REDIS_URL": redis_url}
    args = [sys.executable, "-m", "benchmarks.bare_app", "--host", "127.0.0.1"]
    return [*args, "--port", str(port), "--workers", str(workers)], env, port


@dataclass
class Groupbuy:
    """A `groupbuy serve` under test and an admin client for set-up and checks."""

    server: Server
    client: httpx.Client
    tag: str

    def settle(self) -> float:
        """Wait until the server has answered what the load left in flight (and written
        behind), so the checks read a state no request is still changing; the seconds
        that took (-1: the server never went idle)."""
        return round(wait_idle([self.server]), 2)


def admin_client(url: str) -> httpx.Client:
    """An HTTP client of a benchmark's service, with the admin key."""
    return httpx.Client(
        base_url=url,
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=60,
        limits=httpx.Limits(max_connections=16),
    )


@contextlib.contextmanager
def groupbuy(
    redis_url: str, workdir: Path, workers: int, tag: str, **settings: str
) -> Iterator[Groupbuy]:
    """A `groupbuy serve` of its own (groupbuy_command) with an admin client."""
    args, env, port = groupbuy_command(redis_url, workdir, workers, tag, **settings)
    with (
        serve(args, env, port, workdir / f"groupbuy-{tag}.log") as running,
        admin_client(running.url) as client,
    ):
        yield Groupbuy(running, client, tag)


def _tree(pid: int) -> list[int]:
    """The process and its descendants (Linux /proc)."""
    pids, index = [pid], 0
    while index < len(pids):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pids[index]}/task").iterdir():
                pids.extend(int(c) for c in (task / "children").read_text().split())
        index += 1
    return pids


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def wait_idle(servers: list[Server]) -> float:
    """Wait until the servers together use under 10% of a core over 0.5 s (at most 15 s);
    the seconds waited, or -1 when they never went idle."""
    began = time.monotonic()
    while time.monotonic() - began < IDLE_TIMEOUT_S:
        pids = [p for s in servers for p in _tree(s.process.pid)]
        before = _cpu_seconds(pids)
        time.sleep(IDLE_WINDOW_S)
        if _cpu_seconds(pids) - before < IDLE_CPU_SHARE * IDLE_WINDOW_S:
            return time.monotonic() - began
    return -1.0


async def open_services(
    redis_url: str, database_url: str, auto_pipeline: bool = True, **redis: Any
) -> Services:
    """The production wiring on the given Redis and database, the schema migrated, scripts
    loaded, connections open; script calls coalesced ([redis] auto_pipeline, the default)
    or not; `redis`: other [redis] settings (e.g. key_prefix)."""
    settings = Settings().replace(
        "redis", url=redis_url, max_connections=512, auto_pipeline=auto_pipeline, **redis
    )
    settings = settings.replace("database", url=database_url)
    database = Database(database_url)
    await migrations.upgrade(database)
    services = build_services(settings, redis=connect_redis(settings.redis), database=database)
    await services.scripts.load()
    settle_heap()  # as the service does at the end of its start-up
    await warm_up(services)
    return services


async def warm_up(services: Services) -> None:
    """Open the client's connections before measuring (a running service has them)."""
    await asyncio.gather(*(services.redis.ping() for _ in range(CONCURRENCY * 2)))


async def close_services(services: Services) -> None:
    """Let coalesced batches finish, then close the Redis client and the database."""
    await services.scripts.aclose()
    await services.redis.aclose()
    await services.database.dispose()


# -- printing and running alone ------------------------------------------------------------


def print_rows(rows: list[Row]) -> None:
    """The key figures of each row and comparison."""
    for r in rows:
        if "comparison" in r:
            target = r["target_min"]
            met = "" if target is None else f"; target >= {target}: {'met' if r['met'] else 'no'}"
            print(f"  {r['what']}: median {r['median']} ({r['min']}-{r['max']}, "
                  f"{r['rounds']} rounds{met})")  # fmt: skip
            continue
        ok = r["correct"].get("ok", "")
        print(f"{r['scenario']:<28} {r['implementation']:<44} {r['ops_per_s'] or 0:>9,.0f}/s  "
              f"p50 {r.get('p50_ms')}  p99 {r.get('p99_ms')}  {ok}")  # fmt: skip


def standalone(
    run: Callable[[Bench], list[Row]], doc: str | None, parts: Sequence[str] = ()
) -> None:
    """A scenario's command line: `--quick`, `--rounds N`, `--part P` (when it has parts);
    it runs on a private redis-server and prints its rows."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small loads, fewer rounds")
    parser.add_argument("--rounds", type=int, help="alternated rounds of each contender")
    if parts:
        parser.add_argument("--part", choices=parts, action="append", help="only these parts")
    args = parser.parse_args()
    server = start_redis()
    workdir = Path(tempfile.mkdtemp(prefix="groupbuy-bench-"))
    began = time.monotonic()
    try:
        chosen = tuple(getattr(args, "part", None) or parts)
        bench = Bench(server.url, workdir, args.quick, args.rounds, chosen)
        rows = run(bench)
    finally:
        server.stop()
    print_rows(rows)
    print(f"{time.monotonic() - began:.0f} s; logs in {workdir}")
