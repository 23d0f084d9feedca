"""Per-call costs and the sizing model of docs/capacity.md, measured on this machine.

Parts: `redis` (Redis time per grab and seat-lock script from INFO commandstats, the
write-behind's CPU per record, raw SQLite rows per CPU second), `http` (CPU per request
of `groupbuy serve` with 1 and 2 workers and with its write-behind in `groupbuy worker`;
the 1 against 2 workers check), `cluster` (spread grabs on one redis-server against a
3-master Cluster; the shard of one hot packet). A full run alone rewrites the tables of
docs/capacity.md between its markers.

Usage: .venv/bin/python -m benchmarks.capacity [--quick] [--part redis ...]
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import resource
import secrets
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import redis

from benchmarks import harness
from benchmarks.engine.common import run_calls, run_grabs
from benchmarks.harness import (
    REPO,
    Bench,
    Groupbuy,
    Row,
    Trial,
    close_services,
    gather_limited,
    groupbuy,
    make_row,
    run_async,
    run_sync,
    standalone,
    wait_idle,
)
from benchmarks.http_level import (
    CpuBook,
    Layout,
    flash_grab,
    groupbuy_trial,
    roles,
    rounds_row,
    seat_locks,
    split_groupbuy,
    wrk_note,
)
from groupbuy import errors
from groupbuy.services import Services
from tests.support.redis_cluster import start_cluster

PAGE = REPO / "docs" / "capacity.md"
BEGIN, END = "<!-- capacity: begin -->", "<!-- capacity: end -->"
CORES = os.cpu_count() or 1
PACKET_SHARES = 1_000  # shares of each packet the engine storms grab (new users, all granted)
TEAM_SIZE, SEATS_USED = 50, 40  # the seat-lock storm: 40 of each team's 49 free seats
SQL_BATCH = 500  # rows per transaction of the raw driver (the write-behind's batch size)
SPREAD_PACKETS = 48  # packets the spread grabs use: the cluster's slots cover its 3 shards
UTILIZATION = 0.6  # the share of a core the sizing plans to use (room for bursts and failover)
TARGETS = (10_000, 100_000, 1_000_000)  # grabs/s and seat locks/s the page sizes for
GRAB_ROWS = 3  # SQL rows one grab record writes: the grab, its ledger entry, the balance


@dataclass(frozen=True)
class Sizes:
    """How many calls each part makes (full run or quick run)."""

    engine_calls: int  # grabs, then seat locks, of the Redis storms
    rounds: int  # alternated rounds of the HTTP and the cluster parts, after a warm-up
    round_s: int  # seconds of one HTTP round
    spread_calls: int  # grabs of one cluster round


FULL = Sizes(engine_calls=20_000, rounds=2, round_s=3, spread_calls=12_000)
QUICK = Sizes(engine_calls=4_000, rounds=1, round_s=2, spread_calls=3_000)


def say(message: str) -> None:
    """One progress line."""
    harness.say(message, "capacity")


# -- meters -------------------------------------------------------------------------------


def redis_cpu(client: redis.Redis) -> float:
    """CPU seconds a redis-server has used (user and system, all its threads)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def machine_busy() -> float:
    """CPU seconds every process on the machine has used (/proc/stat, all cores)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds of this process's ended children (wrk, after each load)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def script_stats(clients: list[redis.Redis]) -> dict[str, dict[str, float]]:
    """INFO commandstats summed over the servers: calls and usec by command."""
    found: dict[str, dict[str, float]] = {}
    for client in clients:
        for name, stats in client.info("commandstats").items():
            mine = found.setdefault(name.removeprefix("cmdstat_"), {"calls": 0, "usec": 0})
            mine["calls"] += int(stats["calls"])
            mine["usec"] += int(stats["usec"])
    return found


def scripts_of(stats: dict[str, dict[str, float]]) -> tuple[float, float]:
    """(calls, usec) of the script commands (EVALSHA, EVAL, FCALL and their _RO forms)."""
    mine = [v for k, v in stats.items() if k.startswith(("evalsha", "eval", "fcall"))]
    return sum(v["calls"] for v in mine), sum(v["usec"] for v in mine)


# -- the Redis part: a script's time, the write-behind's CPU, raw SQL ---------------------


async def send_packets(services: Services, ids: list[str], shares: int, run: str) -> None:
    """Fund a sender and send the packets (SQL rows and Redis state, as the API does)."""
    sender = f"cap-sender-{run}"
    await services.packets.accounts.deposit(sender, len(ids) * shares * 10, f"cap-{run}")
    await gather_limited(
        [partial(services.packets.sending.send, sender, shares * 10, shares, packet_id=p)
         for p in ids]
    )  # fmt: skip


def new_user_grabs(ids: list[str], calls: int, run: str) -> list[tuple[str, str]]:
    """A new user per grab, round-robin over the packets."""
    return [(ids[i % len(ids)], f"cap-{run}-u{i}") for i in range(calls)]


async def measured_calls(
    clients: list[redis.Redis], calls: Callable[[], Any]
) -> tuple[dict[str, float], Any]:
    """Run `calls` with Redis's counters reset: ops-independent figures (script calls and
    usec, Redis CPU, this process's CPU, wall seconds) and what `calls` returned."""
    for client in clients:
        client.config_resetstat()
    redis_before = sum(redis_cpu(c) for c in clients)
    cpu_before, began = time.process_time(), time.perf_counter()
    result = await calls()
    wall = time.perf_counter() - began
    script_calls, script_usec = scripts_of(script_stats(clients))
    figures = {
        "wall_s": wall,
        "client_cpu_s": time.process_time() - cpu_before,
        "redis_cpu_s": sum(redis_cpu(c) for c in clients) - redis_before,
        "script_calls": script_calls,
        "script_usec": script_usec,
    }
    return figures, result


def per_op(figures: dict[str, float], ops: int) -> dict[str, float]:
    """The figures per operation in µs (calls per operation as is)."""
    return {
        "ops": ops,
        "ops_per_s": round(ops / figures["wall_s"], 1),
        "script_calls_per_op": round(figures["script_calls"] / ops, 3),
        "script_us_per_call": round(figures["script_usec"] / max(1, figures["script_calls"]), 2),
        "redis_cpu_us": round(figures["redis_cpu_s"] * 1e6 / ops, 2),
        "client_cpu_us": round(figures["client_cpu_s"] * 1e6 / ops, 2),
    }


async def grab_costs(services: Services, stats: redis.Redis, calls: int, run: str) -> Any:
    """A grab storm by new users: the Redis figures per grab; the packets' ids."""
    ids = [f"cap-{run}-p{i}" for i in range(math.ceil(calls / PACKET_SHARES))]
    await send_packets(services, ids, PACKET_SHARES, run)
    requests = new_user_grabs(ids, calls, run)
    figures, (_s, _l, answers) = await measured_calls(
        [stats], lambda: run_grabs(services, requests)
    )
    granted = sum(a.get("status") == "grabbed" for _p, _u, a in answers)
    return {**per_op(figures, len(answers)), "granted": granted}


async def lock_costs(services: Services, stats: redis.Redis, calls: int, run: str) -> Any:
    """A seat-lock storm by new users over teams of TEAM_SIZE: the Redis figures per lock."""
    activity, teams = f"cap-{run}-a", [f"t{i}" for i in range(math.ceil(calls / SEATS_USED))]
    activities = services.teams.activities
    await activities.create_activity(activity, team_size=TEAM_SIZE, lock_ttl_s=300)
    await gather_limited(
        [partial(activities.open_team, activity, f"lead-{t}", team_id=t) for t in teams]
    )

    async def lock(team: str, user: str) -> str:
        try:
            await services.teams.seats.lock(activity, team, user)
            return "locked"
        except errors.GroupBuyError as exc:
            return exc.code

    requests = [(teams[i % len(teams)], f"cap-{run}-l{i}") for i in range(calls)]
    figures, (_s, _l, answers) = await measured_calls([stats], lambda: run_calls(lock, requests))
    return {**per_op(figures, len(answers)), "locked": sum(a == "locked" for *_, a in answers)}


async def drain_costs(services: Services, stats: redis.Redis) -> dict[str, float]:
    """flush_records run by hand until the backlog the grab storm left is written: this
    process's CPU per record (the SQLite thread included) and Redis's."""

    async def drain() -> int:
        written = 0
        while True:
            report = await services.jobs.run("flush_records")
            written += int(report["packet_records"]) + int(report["team_records"])
            if not report["backlog"]:
                return written

    figures, records = await measured_calls([stats], drain)
    return {
        "records": records,
        "records_per_s": round(records / figures["wall_s"], 1),
        "cpu_us_per_record": round(figures["client_cpu_s"] * 1e6 / max(1, records), 2),
        "redis_cpu_us_per_record": round(figures["redis_cpu_s"] * 1e6 / max(1, records), 2),
    }


def raw_sql(records: int, path: Path) -> dict[str, float]:
    """The rows of `records` grab records (grab row, ledger entry, balance upsert) written by
    sqlite3's executemany, SQL_BATCH records per transaction, WAL, synchronous=NORMAL: rows
    and records per CPU second (SQLite works in this thread: its CPU is this process's)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
        "CREATE TABLE grabs (packet_id TEXT, user_id TEXT, amount_cents INT, at INT,"
        " PRIMARY KEY (packet_id, user_id));"
        "CREATE TABLE entries (id INTEGER PRIMARY KEY, account TEXT, amount_cents INT,"
        " reference TEXT UNIQUE, at INT);"
        "CREATE TABLE balances (account TEXT PRIMARY KEY, cents INT);"
    )
    began = time.process_time()
    for start in range(0, records, SQL_BATCH):
        batch = [
            (f"p{i // PACKET_SHARES}", f"u{i}", 10, i) for i in range(start, start + SQL_BATCH)
        ]
        db.execute("BEGIN")
        db.executemany("INSERT INTO grabs VALUES (?, ?, ?, ?)", batch)
        db.executemany(
            "INSERT INTO entries (account, amount_cents, reference, at) VALUES (?, ?, ?, ?)",
            [(u, c, f"grab:{p}:{u}", t) for p, u, c, t in batch],
        )
        db.executemany(
            "INSERT INTO balances VALUES (?, ?) ON CONFLICT (account) "
            "DO UPDATE SET cents = cents + excluded.cents",
            [(u, c) for _p, u, c, _t in batch],
        )
        db.execute("COMMIT")
    cpu = time.process_time() - began
    db.close()
    return {"records": records, "records_per_core_s": round(records / cpu),
            "rows_per_core_s": round(GRAB_ROWS * records / cpu)}  # fmt: skip


async def _redis_part(bench: Bench, sizes: Sizes) -> dict[str, Any]:
    run = secrets.token_hex(3)
    services = await harness.open_services(bench.redis_url, bench.sqlite("capacity"))
    stats = redis.Redis.from_url(bench.redis_url)
    try:
        say(f"engine: {sizes.engine_calls:,} grabs by new users")
        grab = await grab_costs(services, stats, sizes.engine_calls, run)
        say("engine: the write-behind drains their records")
        drain = await drain_costs(services, stats)
        say(f"engine: {sizes.engine_calls:,} seat locks by new users")
        lock = await lock_costs(services, stats, sizes.engine_calls, run)
    finally:
        stats.close()
        await close_services(services)
    sql = raw_sql(sizes.engine_calls, bench.workdir / f"raw-{run}.db")
    return {"grab": grab, "lock": lock, "drain": drain, "raw_sql": sql}


# -- the HTTP part: CPU per request, 1 against 2 workers ----------------------------------

ONE, SPLIT, TWO, LOCK = (
    "grab, 1 worker",
    "grab, 1 worker + groupbuy worker",
    "grab, 2 workers",
    ("seat lock, 1 worker"),
)


def with_meters(target: Groupbuy | Layout, stats: redis.Redis) -> Layout:
    """The target as a Layout that also reads Redis's CPU, the load generator's (wrk, a
    child of this process), the whole machine's and the wall clock around each load."""
    worker = target.worker if isinstance(target, Layout) else None
    meters: dict[str, Callable[[], float]] = {
        "redis": partial(redis_cpu, stats),
        "generator": children_cpu,
        "machine": machine_busy,
        "wall": time.monotonic,
    }
    return Layout(target.server, target.client, target.tag, worker, meters)


@contextlib.contextmanager
def _layouts(bench: Bench, stats: redis.Redis) -> Iterator[dict[str, Layout]]:
    with (
        groupbuy(bench.redis_url, bench.workdir, 1, "c1") as one,
        split_groupbuy(bench.redis_url, bench.workdir, "c2") as split,
        groupbuy(bench.redis_url, bench.workdir, 2, "c3") as two,
    ):
        yield {ONE: with_meters(one, stats), SPLIT: with_meters(split, stats),
               TWO: with_meters(two, stats)}  # fmt: skip


def per_request(book: CpuBook, name: str) -> dict[str, float]:
    """A contender's µs per request by role, with `others`: the machine's CPU that none of
    the measured processes used (other engineers' work, this process)."""
    us = book.per_request_us(name)
    wall_us = us.pop("wall")
    measured = sum(v for k, v in us.items() if k != "machine")
    us["others"] = round(us.pop("machine") - measured, 1)
    us["cores_free"] = round(CORES - us["others"] / wall_us, 2) if wall_us else 0.0
    return us


def _http_part(bench: Bench, sizes: Sizes) -> tuple[dict[str, Any], list[Row]]:
    book = CpuBook()
    stats = redis.Redis.from_url(bench.redis_url)
    with contextlib.closing(stats), _layouts(bench, stats) as layouts:
        servers = [s for layout in layouts.values() for s in roles(layout).values()]
        contenders = {
            name: groupbuy_trial(flash_grab, layout, sizes.round_s, (book, name))
            for name, layout in layouts.items()
        }
        contenders[LOCK] = groupbuy_trial(seat_locks, layouts[ONE], sizes.round_s, (book, LOCK))
        say(f"http: {', '.join(contenders)}; {sizes.rounds} rounds")
        trials = run_sync(contenders, sizes.rounds, between=lambda: wait_idle(servers), say=say)
    figures = {
        name: {"ops_per_s": round(statistics.median(t.rate for t in trials[name]), 1),
               "cpu_us": per_request(book, name)}
        for name in contenders
    }  # fmt: skip
    how = wrk_note(sizes.round_s)
    rows = [
        rounds_row(
            f"capacity: {name}", "groupbuy", trials[name], how, cpu_us=figures[name]["cpu_us"]
        )
        for name in contenders
    ]
    return figures, rows


def predicted_rate(cpu_us: dict[str, float], processes: int, cores_free: float) -> float:
    """The closed-loop rate the model gives: each API process at most one core, and all the
    CPU a request costs (API, worker, Redis, load generator) within the free cores."""
    api = cpu_us["serve"]
    total = api + cpu_us.get("worker", 0.0) + cpu_us["redis"] + cpu_us["generator"]
    return min(processes * 1e6 / api, cores_free * 1e6 / total)


# -- the cluster part: one redis-server against 3 masters ---------------------------------


async def spread_trial(
    services: Services, clients: list[redis.Redis], calls: int, run: str
) -> tuple[Trial, dict[str, float]]:
    """New users' grabs over SPREAD_PACKETS packets: a trial and its CPU figures per grab."""
    ids = [f"spread-{run}-{i}" for i in range(SPREAD_PACKETS)]
    await send_packets(services, ids, math.ceil(calls / SPREAD_PACKETS), run)
    before = machine_busy()
    figures, (seconds, latencies, answers) = await measured_calls(
        clients, lambda: run_grabs(services, new_user_grabs(ids, calls, run))
    )
    figures["machine_s"] = machine_busy() - before
    granted = sum(a.get("status") == "grabbed" for _p, _u, a in answers)
    return Trial(len(answers), seconds, {"ok": granted == calls}, latencies), figures


async def hot_packet(services: Services, clients: list[redis.Redis], calls: int) -> list[float]:
    """One packet's grabs on the cluster: each node's share of the script calls."""
    run = secrets.token_hex(3)
    await send_packets(services, [f"hot-{run}"], calls, run)
    for client in clients:
        client.config_resetstat()
    await run_grabs(services, new_user_grabs([f"hot-{run}"], calls, run))
    counts = [scripts_of(script_stats([c]))[0] for c in clients]
    return [round(c / max(1, sum(counts)), 3) for c in counts]


async def _cluster_part(bench: Bench, sizes: Sizes) -> dict[str, Any]:
    cluster = start_cluster(3)
    single_stats = [redis.Redis.from_url(bench.redis_url)]
    cluster_stats = [cluster.client(i) for i in range(3)]
    single = await harness.open_services(bench.redis_url, bench.sqlite("cap-single"))
    spread = await harness.open_services(cluster.url, bench.sqlite("cap-cluster"), cluster=True)
    figures: dict[str, list[dict[str, float]]] = {"1 server": [], "3-master cluster": []}
    try:
        targets = {"1 server": (single, single_stats), "3-master cluster": (spread, cluster_stats)}

        def contender(name: str) -> Any:
            services, clients = targets[name]

            async def trial(index: int) -> Trial:
                run = f"{name[0]}{index}{secrets.token_hex(2)}"
                done, spent = await spread_trial(services, clients, sizes.spread_calls, run)
                if index:
                    figures[name].append({**spent, "ops": done.ops})
                return done

            return trial

        say(f"cluster: spread grabs, 1 server against 3 masters; {sizes.rounds} rounds")
        trials = await run_async({n: contender(n) for n in targets}, sizes.rounds, say=say)
        say("cluster: one hot packet")
        shares = await hot_packet(spread, cluster_stats, sizes.spread_calls // 2)
    finally:
        await close_services(single)
        await close_services(spread)
        for client in single_stats + cluster_stats:
            client.close()
        cluster.stop()
    return {"trials": trials, "figures": figures, "hot_packet_shares": shares}


def spread_costs(rounds: list[dict[str, float]]) -> dict[str, float]:
    """µs per grab over the rounds: client, Redis, others' CPU, and the free cores."""
    ops = sum(r["ops"] for r in rounds)
    wall = sum(r["wall_s"] for r in rounds)
    client = sum(r["client_cpu_s"] for r in rounds)
    server = sum(r["redis_cpu_s"] for r in rounds)
    others = sum(r["machine_s"] for r in rounds) - client - server
    calls = max(1, sum(r["script_calls"] for r in rounds))
    return {
        "client_cpu_us": round(client * 1e6 / ops, 2),
        "redis_cpu_us": round(server * 1e6 / ops, 2),
        "cores_free": round(CORES - others / wall, 2),
        "script_us_per_call": round(sum(r["script_usec"] for r in rounds) / calls, 2),
    }


# -- the model and the page ---------------------------------------------------------------


def need(rate: float, us_per_op: float) -> int:
    """Cores (processes of one core, shards) for `rate` ops/s at `us_per_op` of CPU each,
    each used to UTILIZATION."""
    return max(1, math.ceil(rate * us_per_op / (1e6 * UTILIZATION)))


def sizing(costs: dict[str, Any]) -> list[str]:
    """The sizing table: for each target rate, shards, API processes, write-behind and
    database cores, from the measured costs."""
    http = costs["http"]
    grabs, split, locks = http[ONE]["cpu_us"], http[SPLIT]["cpu_us"], http[LOCK]["cpu_us"]
    rows_per_core = costs["redis"]["raw_sql"]["rows_per_core_s"]
    lines = [
        "| per second | Redis shards | API processes | write-behind processes | "
        "database cores (raw driver, lower bound) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for rate in TARGETS:
        lines.append(f"| {rate:,} grabs | {need(rate, grabs['redis'])} | "
                     f"{need(rate, split['serve'])} | {need(rate, split['worker'])} | "
                     f"{need(rate * GRAB_ROWS, 1e6 / rows_per_core)} |")  # fmt: skip
    for rate in TARGETS:
        shards, api = need(rate, locks["redis"]), need(rate, locks["serve"])
        lines.append(f"| {rate:,} seat locks | {shards} | {api} | – | – |")
    return lines


def walls(costs: dict[str, Any]) -> list[str]:
    """What one shard, one API process and one SQLite writer carry at most (one core)."""
    grab, lock, drain = costs["redis"]["grab"], costs["redis"]["lock"], costs["redis"]["drain"]
    split = costs["http"][SPLIT]["cpu_us"]
    return [
        "| one ... | carries at most (one core at 100%) | from |",
        "| --- | ---: | --- |",
        f"| packet (its shard) | {1e6 / grab['redis_cpu_us']:,.0f} grabs/s | "
        f"Redis CPU {grab['redis_cpu_us']} µs per grab |",
        f"| activity (its shard) | {1e6 / lock['redis_cpu_us']:,.0f} seat locks/s | "
        f"Redis CPU {lock['redis_cpu_us']} µs per lock |",
        f"| packet, script time only | {1e6 / grab['script_us_per_call']:,.0f} grabs/s | "
        f"{grab['script_us_per_call']} µs per script call (commandstats) |",
        f"| API process | {1e6 / split['serve']:,.0f} grabs/s | {split['serve']} µs per grab |",
        f"| write-behind process on SQLite | {1e6 / drain['cpu_us_per_record']:,.0f} grabs/s | "
        f"{drain['cpu_us_per_record']} µs per record (engine-level drain) |",
    ]


def costs_table(costs: dict[str, Any]) -> list[str]:
    """The measured per-call costs."""
    r, http = costs["redis"], costs["http"]
    lines = ["| cost | figure | how |", "| --- | ---: | --- |"]
    for kind in ("grab", "lock"):
        f = r[kind]
        lines += [
            f"| Redis time per {kind} script call | {f['script_us_per_call']} µs | INFO "
            f"commandstats, {f['ops']:,} calls, {f['script_calls_per_op']} script calls each |",
            f"| redis-server CPU per {kind} | {f['redis_cpu_us']} µs | INFO cpu (networking "
            "included), coalesced calls |",
        ]
    for name in (ONE, SPLIT, TWO, LOCK):
        us = http[name]["cpu_us"]
        shown = ", ".join(f"{k} {v}" for k, v in us.items() if k not in ("others", "cores_free"))
        lines.append(f"| CPU µs per HTTP request, {name} | {shown} | wrk closed loop, "
                     f"{http[name]['ops_per_s']:,.0f}/s |")  # fmt: skip
    d = r["drain"]
    lines += [
        f"| CPU per write-behind record | {d['cpu_us_per_record']} µs (+ Redis "
        f"{d['redis_cpu_us_per_record']} µs) | engine-level drain of {d['records']:,} grab "
        "records into SQLite (flush_records by hand) |",
        f"| SQL rows per core second | {r['raw_sql']['rows_per_core_s']:,} | sqlite3 "
        f"executemany, {SQL_BATCH} records per transaction, WAL, synchronous=NORMAL |",
    ]
    return lines


def checks_table(costs: dict[str, Any]) -> list[str]:
    """Predicted against measured on this machine."""
    http, cl = costs["http"], costs["cluster"]
    one = http[ONE]["cpu_us"]
    lines = ["| check | predicted | measured | error |", "| --- | ---: | ---: | ---: |"]

    def row(what: str, predicted: float, measured: float) -> None:
        lines.append(f"| {what} | {predicted:,.0f}/s | {measured:,.0f}/s | "
                     f"{measured / predicted - 1:+.0%} |")  # fmt: skip

    row("HTTP grab, 1 worker (its own costs)", predicted_rate(one, 1, one["cores_free"]),
        http[ONE]["ops_per_s"])  # fmt: skip
    row(
        "HTTP grab, 2 workers (from the 1-worker costs)",
        predicted_rate(one, 2, http[TWO]["cpu_us"]["cores_free"]),
        http[TWO]["ops_per_s"],
    )
    single, spread = cl["costs"]["1 server"], cl["costs"]["3-master cluster"]
    for name, shards, free in (("1 server", 1, single["cores_free"]),
                               ("3-master cluster", 3, spread["cores_free"])):  # fmt: skip
        client, server = single["client_cpu_us"], single["redis_cpu_us"]
        predicted = min(1e6 / client, free * 1e6 / (client + server), shards * 1e6 / server)
        row(f"engine spread grabs, {name} (from the 1-server costs)", predicted,
            cl["rates"][name])  # fmt: skip
    errors_seen = [abs(float(line.rsplit("|", 2)[1].strip(" %+")) / 100) for line in lines[2:]]
    top = max(cl["hot_packet_shares"])
    lines.append(f"| one hot packet on the cluster: its node's share of the script calls | "
                 f"100% | {top:.0%} | {top - 1:+.0%} |")  # fmt: skip
    lines += ["", f"The model's error in these checks: within ±{max(errors_seen):.0%}."]
    return lines


def section(costs: dict[str, Any], quick: bool) -> str:
    """The page's generated part: the costs, the walls, the sizing and the checks."""
    load = os.getloadavg()
    head = (f"Measured by `.venv/bin/python -m benchmarks.capacity{' --quick' if quick else ''}`"
            f" on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {CORES} cores, "
            f"{sys.platform}; load average {load[0]:.1f} at the end (other work on the "
            "machine: `others` below).")  # fmt: skip
    parts = [head, "", "### Measured costs", "", *costs_table(costs), "",
             "### One of each carries at most", "", *walls(costs), "",
             f"### Sizing (each core planned at {UTILIZATION:.0%})", "", *sizing(costs), "",
             "### Predicted against measured on this machine", "",
             *checks_table(costs)]  # fmt: skip
    return "\n".join([BEGIN, *parts, END])


def write_page(text: str) -> None:
    """Replace the generated part of docs/capacity.md."""
    page = PAGE.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    PAGE.write_text(pattern.sub(lambda _m: text, page), encoding="utf-8")


# -- running ------------------------------------------------------------------------------

PARTS = ("redis", "http", "cluster")


def run_capacity(bench: Bench) -> list[Row]:
    """Every part of PARTS the bench asks for: rows of the measured calls; all three in a
    full run alone also rewrite docs/capacity.md's tables."""
    sizes = QUICK if bench.quick else FULL
    if bench.rounds:
        sizes = Sizes(sizes.engine_calls, bench.rounds, sizes.round_s, sizes.spread_calls)
    costs: dict[str, Any] = {}
    rows: list[Row] = []
    wanted = bench.parts or PARTS
    flush = redis.Redis.from_url(bench.redis_url)
    with contextlib.closing(flush):
        if "redis" in wanted:
            flush.flushall()
            costs["redis"] = asyncio.run(_redis_part(bench, sizes))
            for kind in ("grab", "lock"):
                f = costs["redis"][kind]
                ok = f.get("granted", f.get("locked")) == f["ops"]
                rows.append(make_row(f"capacity: {kind} storm", "groupbuy",
                                     f["ops"] / f["ops_per_s"], [], {"ok": ok},
                                     "new users, 256 in flight", ops=f["ops"],
                                     capacity=f))  # fmt: skip
        if "http" in wanted:
            flush.flushall()
            costs["http"], http_rows = _http_part(bench, sizes)
            rows += http_rows
        if "cluster" in wanted:
            flush.flushall()
            found = asyncio.run(_cluster_part(bench, sizes))
            costs["cluster"] = {
                "costs": {n: spread_costs(f) for n, f in found["figures"].items()},
                "rates": {
                    n: statistics.median(t.rate for t in ts) for n, ts in found["trials"].items()
                },
                "hot_packet_shares": found["hot_packet_shares"],
            }  # fmt: skip
            for name, ts in found["trials"].items():
                rows.append(harness.trials_row("capacity: spread grabs", name, ts,
                                               f"{SPREAD_PACKETS} packets, new users"))  # fmt: skip
    if set(PARTS) <= set(wanted):
        text = section(costs, bench.quick)
        print(text)
        if not bench.quick and PAGE.exists():
            write_page(text)
    return rows


if __name__ == "__main__":
    standalone(run_capacity, __doc__, PARTS)
