"""HTTP-level benchmark: `groupbuy serve` (1 and 2 workers) against bare Starlette + 1 Redis call.

wrk (Debian package; installed with apt-get when missing) drives POSTs through
benchmarks/wrk/post.lua, which counts answers by status (and "grabbed" bodies) and prints
latency percentiles. Scenarios: flash_grab (distinct users grabbing shares of big packets,
5 % double taps) and lock_storm (random users locking seats in random teams of 50). The
baseline, benchmarks/bare_app.py, runs under the same uvicorn options and the same wrk
settings. Without wrk an in-process httpx load generator is used (said in each row's note).

The Redis at `redis_url` is FLUSHALLed before each server; servers run as subprocesses on
free loopback ports and are stopped (SIGTERM, then SIGKILL) even on error.
Usage: .venv/bin/python -m benchmarks.http_level  (quick run on a private redis-server)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import redis

from tests.redis_server import free_port, start_redis

REPO = Path(__file__).resolve().parents[1]
LUA = REPO / "benchmarks" / "wrk" / "post.lua"
THREADS = 2
CONNECTIONS = 64
WORKER_COUNTS = (1, 2)
ADMIN_KEY, SERVICE_KEY = "a", "s"
SHARES, PACKET_CENTS = 10_000, 1_000_000  # the default limits of one packet
EXPECTED_MAX_GRABS_PER_S = 8_000  # enough packets that none should sell out at this rate
TEAMS, TEAM_SIZE, LOCK_TTL_S, LOCK_USERS = 200, 50, 2, 20_000
SETUP_THREADS = 16
# With several workers both servers go through groupbuy.cli.run_workers, which sets
# TCP_NODELAY on the shared socket (plain uvicorn.run leaves Nagle on there).
NAGLE_NOTE = "; workers share one socket with TCP_NODELAY (groupbuy.cli.run_workers)"
STATUS_NAMES = ("c200", "c201", "c404", "c409", "c410", "c4xx", "c5xx", "cother")


# -- processes ------------------------------------------------------------------------


@contextlib.contextmanager
def _server(args: list[str], env: dict[str, str], port: int, log: Path) -> Iterator[str]:
    """Run a server in its own process group; yield its URL once /healthz answers."""
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
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args} did not answer /healthz in 30 s; see {log}")
                time.sleep(0.1)
            yield url
        finally:
            _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # workers left behind in our group, if any


def _log_errors(log: Path) -> int:
    text = log.read_text(errors="replace")
    return text.count("Traceback") + text.count(" ERROR ")


def _ensure_wrk() -> str | None:
    found = shutil.which("wrk")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "timeout": 300}
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(["apt-get", "install", "-y", "wrk"], check=False, **quiet)
            if shutil.which("wrk") is None:
                subprocess.run(["apt-get", "update"], check=False, **quiet)
                subprocess.run(["apt-get", "install", "-y", "wrk"], check=False, **quiet)
        found = shutil.which("wrk")
    return found


# -- load -----------------------------------------------------------------------------


def _load(wrk: str | None, url: str, seconds: int, mode: str, *params: str) -> dict[str, Any]:
    """Drive POSTs for `seconds`; the counts by status and latency percentiles (µs)."""
    if wrk is None:
        return asyncio.run(_httpx_load(url, seconds, mode, params))
    args = [wrk, f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{seconds}s", "-s", str(LUA), url]
    done = subprocess.run(
        [*args, "--", mode, SERVICE_KEY, *params],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    )
    result: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        if line.startswith(("wrk_result ", "wrk_status ")):
            for part in line.split()[1:]:
                name, value = part.split("=")
                result[name] = float(value) if "." in value else int(value)
    if "requests" not in result or "c200" not in result:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    return result


async def _httpx_load(url: str, seconds: int, mode: str, params: tuple[str, ...]) -> dict[str, Any]:
    """The fallback load generator: CONNECTIONS tasks in this process (slower than wrk)."""
    counts = dict.fromkeys((*STATUS_NAMES, "grabbed", "already"), 0)
    latencies: list[float] = []
    errors = 0
    headers = {"Authorization": f"Bearer {SERVICE_KEY}"}
    limits = httpx.Limits(max_connections=CONNECTIONS)

    def next_request(task: int, n: int, last: tuple[str, str] | None) -> tuple[str, str]:
        if mode == "lock":
            team = random.randint(1, int(params[1]))
            user = random.randint(1, int(params[2]))
            return f"/v1/activities/{params[0]}/teams/t{team}/locks", f'{{"user_id":"u{user}"}}'
        if n % 20 == 0 and last:
            return last
        body = f'{{"user_id":"u{task}-{n}"}}'
        if mode == "grab":
            return f"/v1/redpackets/{params[n % len(params)]}/grab", body
        return "/grab", body

    async def worker(client: httpx.AsyncClient, task: int, stop_at: float) -> None:
        nonlocal errors
        n, last = 0, None
        while time.monotonic() < stop_at:
            n += 1
            last = next_request(task, n, last)
            began = time.perf_counter()
            try:
                answer = await client.post(last[0], content=last[1], headers=headers)
            except httpx.HTTPError:
                errors += 1
                continue
            latencies.append((time.perf_counter() - began) * 1e6)
            code = answer.status_code
            name = f"c{code}" if f"c{code}" in counts else "c5xx" if code >= 500 else "c4xx"
            counts[name if code >= 200 else "cother"] += 1
            if code == 200 and '"grabbed"' in answer.text:
                counts["grabbed"] += 1
            elif code == 200 and '"already_grabbed"' in answer.text:
                counts["already"] += 1

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=10) as client:
        began = time.perf_counter()
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*(worker(client, t, stop_at) for t in range(CONNECTIONS)))
        elapsed = time.perf_counter() - began
    latencies.sort()

    def cut(q: float) -> int:
        return int(latencies[min(len(latencies) - 1, int(q * len(latencies)))]) if latencies else 0

    return {
        "requests": len(latencies),
        "duration_us": int(elapsed * 1e6),
        "p50_us": cut(0.50),
        "p95_us": cut(0.95),
        "p99_us": cut(0.99),
        "err_read": errors,
        **counts,
    }


def _row(
    scenario: str, implementation: str, result: dict[str, Any], correct: dict[str, Any], note: str
) -> dict[str, Any]:
    seconds = result["duration_us"] / 1e6
    return {
        "scenario": scenario,
        "level": "http",
        "implementation": implementation,
        "ops": int(result["requests"]),
        "seconds": round(seconds, 3),
        "ops_per_s": round(result["requests"] / seconds, 1) if seconds else 0.0,
        "p50_ms": result["p50_us"] / 1000 if result["requests"] else None,
        "p95_ms": result["p95_us"] / 1000 if result["requests"] else None,
        "p99_ms": result["p99_us"] / 1000 if result["requests"] else None,
        "correct": correct,
        "latencies_ms": [],
        "note": note,
    }


def _answers(result: dict[str, Any]) -> dict[str, int]:
    answers = {name[1:]: int(result.get(name, 0)) for name in STATUS_NAMES}
    answers["socket_errors"] = sum(
        int(result.get(f"err_{e}", 0)) for e in ("connect", "read", "write", "timeout")
    )
    return {k: v for k, v in answers.items() if v}


# -- scenarios ------------------------------------------------------------------------


def _flash_grab(
    client: httpx.Client, wrk: str | None, url: str, seconds: int, tag: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    packets = math.ceil(EXPECTED_MAX_GRABS_PER_S * seconds / SHARES) + 1
    sender = f"sender-{tag}"
    client.post(
        f"/v1/accounts/{sender}/deposits",
        json={"amount_cents": packets * PACKET_CENTS, "reference": f"bench-{tag}"},
    ).raise_for_status()
    ids = [f"pk-{tag}-{i}" for i in range(packets)]
    for packet_id in ids:
        client.post(
            "/v1/redpackets",
            json={
                "sender_id": sender,
                "amount_cents": PACKET_CENTS,
                "count": SHARES,
                "packet_id": packet_id,
            },
        ).raise_for_status()
    result = _load(wrk, url, seconds, "grab", *ids)
    grabs = sold_out = 0
    consistent = True
    for packet_id in ids:
        packet = client.get(f"/v1/redpackets/{packet_id}").raise_for_status().json()
        taken = packet["count"] - packet["remaining_count"]
        grabs += taken
        sold_out += packet["remaining_count"] == 0
        users = {g["user_id"] for g in packet["grabs"]}
        amounts = [g["amount_cents"] for g in packet["grabs"]]
        consistent &= (
            len(users) == len(packet["grabs"]) == taken
            and all(a >= 1 for a in amounts)
            and sum(amounts) + packet["remaining_cents"] == packet["amount_cents"]
        )
    counted = int(result["grabbed"])
    # wrk stops with up to CONNECTIONS requests in flight: the server may have served a
    # grab whose answer wrk never counted, never the other way round.
    correct = {
        "grabs_recorded": grabs,
        "grabbed_answers": counted,
        "already_grabbed_answers": int(result["already"]),
        "uncounted_in_flight": grabs - counted,
        "packets": packets,
        "packets_sold_out": sold_out,
        "answers": _answers(result),
        "ok": bool(
            0 <= grabs - counted <= CONNECTIONS
            and consistent
            and result.get("c5xx", 0) == 0
            and counted + int(result["already"]) + int(result.get("c409", 0))
            == int(result["requests"])
        ),
    }
    return result, correct


def _lock_storm(
    client: httpx.Client, wrk: str | None, url: str, seconds: int, tag: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    activity = f"act-{tag}"
    client.post(
        "/v1/activities",
        json={"activity_id": activity, "team_size": TEAM_SIZE, "lock_ttl_s": LOCK_TTL_S},
    ).raise_for_status()

    def open_team(i: int) -> None:
        client.post(
            f"/v1/activities/{activity}/teams",
            json={"leader_id": f"leader-{i}", "team_id": f"t{i}", "order_id": f"o-{i}"},
        ).raise_for_status()

    def read_team(i: int) -> dict[str, Any]:
        return client.get(f"/v1/activities/{activity}/teams/t{i}").raise_for_status().json()

    # In parallel: with --workers > 1 each keep-alive request costs ~40 ms (see the note).
    with ThreadPoolExecutor(SETUP_THREADS) as pool:
        list(pool.map(open_team, range(1, TEAMS + 1)))
    result = _load(wrk, url, seconds, "lock", activity, str(TEAMS), str(LOCK_USERS))
    overfull = held = 0
    with ThreadPoolExecutor(SETUP_THREADS) as pool:
        teams = list(pool.map(read_team, range(1, TEAMS + 1)))
    for team in teams:
        seats = len(team["members"]) + len(team["locks"])
        held += len(team["locks"])
        overfull += seats > team["size"] or len(team["members"]) != 1
    correct = {
        "teams": TEAMS,
        "teams_overfull": overfull,
        "locks_held_at_end": held,
        "answers": _answers(result),
        "ok": overfull == 0 and result.get("c5xx", 0) == 0,
    }
    return result, correct


# -- runs -----------------------------------------------------------------------------


def _create_schema(url: str) -> None:
    """Create the tables first: two workers racing create_all on a fresh SQLite file can
    fail one worker's start-up ("table events already exists"), and uvicorn then stops."""
    from groupbuy.db import Database

    async def create() -> None:
        database = Database(url)
        try:
            await database.create_all()
        finally:
            await database.dispose()

    asyncio.run(create())


def _groupbuy_rows(
    redis_url: str, workdir: Path, wrk: str | None, workers: int, seconds: int, how: str
) -> list[dict[str, Any]]:
    tag = f"w{workers}"
    database = workdir / f"bench-{tag}.db"
    database.unlink(missing_ok=True)
    _create_schema(f"sqlite+aiosqlite:///{database}")
    env = {
        **os.environ,
        "GROUPBUY_REDIS_URL": redis_url,
        "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
        "GROUPBUY_API_KEYS": f"admin:{ADMIN_KEY},service:{SERVICE_KEY}",
        "GROUPBUY_SCHEDULER_ENABLED": "true",
    }
    port = free_port()
    args = [sys.executable, "-m", "groupbuy.cli", "serve", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--workers", str(workers)]
    log = workdir / f"groupbuy-{tag}.log"
    implementation = f"groupbuy ({workers} worker{'s' if workers > 1 else ''})"
    with (
        _server(args, env, port, log) as url,
        httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=60,
            limits=httpx.Limits(max_connections=SETUP_THREADS),
        ) as client,
    ):
        grab, grab_ok = _flash_grab(client, wrk, url, seconds, tag)
        lock, lock_ok = _lock_storm(client, wrk, url, seconds, tag)
    errors = _log_errors(log)
    grab_ok["server_log_errors"] = lock_ok["server_log_errors"] = errors
    common = f"{how}; SQLite write-behind and scheduler on; access log at INFO to a file"
    common += NAGLE_NOTE if workers > 1 else ""
    return [
        _row(
            "flash_grab",
            implementation,
            grab,
            grab_ok,
            f"POST /v1/redpackets/{{id}}/grab, distinct users over {grab_ok['packets']} packets "
            f"of {SHARES} shares, every 20th request a double tap; ops = all answers; {common}",
        ),
        _row(
            "lock_storm",
            implementation,
            lock,
            lock_ok,
            f"POST .../teams/{{t}}/locks, {TEAMS} teams of {TEAM_SIZE}, random users of "
            f"{LOCK_USERS}, lock_ttl_s={LOCK_TTL_S}; ops = all answers "
            f"(201 new, 200 existing, 409 full); {common}",
        ),
    ]


def _bare_rows(
    redis_url: str, workdir: Path, wrk: str | None, workers: int, seconds: int, how: str
) -> list[dict[str, Any]]:
    port = free_port()
    env = {**os.environ, "BARE_REDIS_URL": redis_url}
    args = [sys.executable, "-m", "benchmarks.bare_app", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--workers", str(workers)]
    log = workdir / f"bare-w{workers}.log"
    with _server(args, env, port, log) as url:
        result = _load(wrk, url, seconds, "bare")
    correct = {
        "answers": _answers(result),
        "server_log_errors": _log_errors(log),
        "ok": result.get("c200", 0) == result["requests"],
    }
    implementation = f"bare starlette + 1 redis call ({workers} worker{'s' if workers > 1 else ''})"
    note = (
        f"POST /grab = one EVALSHA (HINCRBY), small JSON; same uvicorn options and {how}; "
        "one measurement, reported under both scenarios"
    ) + (NAGLE_NOTE if workers > 1 else "")
    row = _row("flash_grab", implementation, result, correct, note)
    return [row, {**row, "scenario": "lock_storm"}]


def run_http(redis_url: str, workdir: Path, quick: bool) -> list[dict]:
    """Rows for groupbuy serve and the bare baseline, 1 and 2 workers, both scenarios."""
    workdir.mkdir(parents=True, exist_ok=True)
    wrk = _ensure_wrk()
    seconds = 2 if quick else 10
    if wrk is None:
        how = f"httpx.AsyncClient load in-process (wrk unavailable), {CONNECTIONS} tasks"
    else:
        how = f"wrk -t{THREADS} -c{CONNECTIONS} -d{seconds}s"
    flush = redis.Redis.from_url(redis_url)
    rows: list[dict[str, Any]] = []
    try:
        for workers in WORKER_COUNTS:
            flush.flushall()
            rows += _groupbuy_rows(redis_url, workdir, wrk, workers, seconds, how)
            flush.flushall()
            rows += _bare_rows(redis_url, workdir, wrk, workers, seconds, how)
    finally:
        flush.close()
    return rows


def _main() -> None:
    server = start_redis()
    workdir = Path(tempfile.mkdtemp(prefix="groupbuy-http-"))
    try:
        began = time.monotonic()
        rows = run_http(server.url, workdir, quick=True)
        elapsed = time.monotonic() - began
    finally:
        server.stop()
    for row in rows:
        print(json.dumps(row))
    print()
    print(f"{'scenario':<11} {'implementation':<42} {'ops/s':>9} {'p50':>7} {'p99':>7}  ok")
    for r in rows:
        print(
            f"{r['scenario']:<11} {r['implementation']:<42} {r['ops_per_s']:>9,.0f} "
            f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f}  {r['correct']['ok']}"
        )
    print(f"total {elapsed:.1f} s; logs in {workdir}")


if __name__ == "__main__":
    _main()
