"""HTTP-level benchmark: `groupbuy serve` (1 and 2 workers) against bare Starlette + 1 Redis call.

wrk (Debian package; installed with apt-get when missing) drives the load through
benchmarks/wrk/post.lua (grab, bare) and benchmarks/wrk/storm.lua (storm, mixed), which count
answers by status (and "grabbed" bodies, and per operation) and print latency percentiles.
Scenarios: flash_grab (distinct users grabbing shares of big packets, 5 % double taps),
lock_storm (per-thread users lock a random team of 50 70 %, release their lock 15 %, confirm
the team they last locked 15 %; locking elsewhere while holding a lock switches) and mixed
(several activities and packets at once: every other request grabs a random packet, the
others are storm steps). The baseline, benchmarks/bare_app.py, runs under the same uvicorn
options and the same wrk settings. Without wrk an in-process httpx load generator is used
(said in each row's note).

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
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.measure import Row, result_row
from groupbuy.testing.servers import free_port, start_redis

REPO = Path(__file__).resolve().parents[1]
LUA = REPO / "benchmarks" / "wrk" / "post.lua"
STORM_LUA = REPO / "benchmarks" / "wrk" / "storm.lua"
THREADS = 2
CONNECTIONS = 64
WORKER_COUNTS = (1, 2)
ADMIN_KEY, SERVICE_KEY = "a", "s"
SHARES, PACKET_CENTS = 10_000, 1_000_000  # the default limits of one packet
EXPECTED_MAX_GRABS_PER_S = 8_000  # enough packets that none should sell out at this rate
TEAMS, TEAM_SIZE, LOCK_TTL_S = 200, 50, 2
STORM_USERS = 100  # user slots per wrk thread (a confirmed user is replaced by a fresh one)
MIXED_ACTIVITIES, MIXED_TEAMS, MIXED_PACKETS, MIXED_SHARES = 20, 10, 50, 500
OPS = ("lock", "unlock", "confirm", "grab")
STORM_STEPS = (
    "70 % POST .../teams/{t}/locks on a random team (a switch when holding elsewhere), "
    "15 % DELETE .../teams/{held}/locks/{user}, 15 % POST .../teams/{held}/members"
)
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

        def apt_get(*args: str) -> None:
            subprocess.run(
                ["apt-get", *args],
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=300,
            )

        with contextlib.suppress(subprocess.SubprocessError, OSError):
            apt_get("install", "-y", "wrk")
            if shutil.which("wrk") is None:
                apt_get("update")
                apt_get("install", "-y", "wrk")
        found = shutil.which("wrk")
    return found


# -- load -----------------------------------------------------------------------------


def _load(wrk: str | None, url: str, seconds: int, mode: str, *params: str) -> dict[str, Any]:
    """Drive requests for `seconds`; the counts by status (and by operation for storm and
    mixed: op_<operation>_<status>) and latency percentiles (µs)."""
    if wrk is None:
        return asyncio.run(_httpx_load(url, seconds, mode, params))
    script = STORM_LUA if mode in ("storm", "mixed") else LUA
    args = [wrk, f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{seconds}s", "-s", str(script), url]
    done = subprocess.run(
        [*args, "--", mode, SERVICE_KEY, *params],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=False,
    )
    result: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        if line.startswith(("wrk_result ", "wrk_status ", "wrk_ops ")):
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
    storm = mode in ("storm", "mixed")
    switch = re.compile(r'"released_team_id":\s*"')
    if storm:  # params as for storm.lua: USERS TEAMS ACTIVITY... [+ PACKET...]
        rest = list(params[2:])
        cut_at = rest.index("+") if "+" in rest else len(rest)
        activities, packets, n_teams = rest[:cut_at], rest[cut_at + 1 :], int(params[1])
        # one slot table for all tasks (the wrk threads' tables, merged): [user, activity, team]
        slots = [[f"u0-{i}", random.choice(activities), None] for i in range(int(params[0]))]
        fresh = len(slots)

    def storm_request(n: int) -> tuple[str, str, str | None, Any]:
        """(operation, method, path, body) of one storm or mixed step, and the slot state."""
        slot = random.randrange(len(slots))
        user, activity, held = slots[slot]
        team_path = f"/v1/activities/{activity}/teams"
        if mode == "mixed" and n % 2 == 0:
            path = f"/v1/redpackets/{random.choice(packets)}/grab"
            return "grab", path, f'{{"user_id":"{user}"}}', (slot, user, None)
        roll = random.random()
        if held and roll >= 0.85:
            body = f'{{"user_id":"{user}","order_id":"o-{user}"}}'
            return "confirm", f"{team_path}/{held}/members", body, (slot, user, held)
        if held and roll >= 0.70:
            return "unlock", f"{team_path}/{held}/locks/{user}", None, (slot, user, held)
        team = f"t{random.randint(1, n_teams)}"
        return "lock", f"{team_path}/{team}/locks", f'{{"user_id":"{user}"}}', (slot, user, team)

    def storm_answer(op: str, code: int, sent: tuple[int, str, str | None], text: str) -> None:
        nonlocal fresh
        name = str(code) if code in (200, 201, 404, 409, 410) else "5xx" if code >= 500 else "4xx"
        counts[f"op_{op}_{name}"] = counts.get(f"op_{op}_{name}", 0) + 1
        slot, user, team = sent
        state = slots[slot]
        if op == "grab" or state[0] != user:
            return
        if op == "lock" and code in (200, 201):
            state[2] = team
            counts["switched"] = counts.get("switched", 0) + bool(switch.search(text))
        elif op == "confirm" and code in (200, 201):
            fresh += 1
            slots[slot] = [f"u0-{fresh}", random.choice(activities), None]
        else:
            forget = op == "unlock" or (op == "confirm" and code == 409)
            if (op == "lock" and code == 409) or (forget and state[2] == team):
                state[2] = None

    def next_request(task: int, n: int, last: tuple[str, str] | None) -> tuple[str, str]:
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
            if storm:
                op, path, body, sent = storm_request(n)
                method = "DELETE" if op == "unlock" else "POST"
            else:
                op, method, sent = "", "POST", None
                last = next_request(task, n, last)
                path, body = last
            began = time.perf_counter()
            try:
                answer = await client.request(method, path, content=body, headers=headers)
            except httpx.HTTPError:
                errors += 1
                continue
            latencies.append((time.perf_counter() - began) * 1e6)
            code = answer.status_code
            name = f"c{code}" if f"c{code}" in counts else "c5xx" if code >= 500 else "c4xx"
            counts[name if code >= 200 else "cother"] += 1
            if storm:
                storm_answer(op, code, sent, answer.text)
            if op in ("", "grab") and code == 200 and '"grabbed"' in answer.text:
                counts["grabbed"] += 1
            elif op in ("", "grab") and code == 200 and '"already_grabbed"' in answer.text:
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
) -> Row:
    requests = int(result["requests"])
    percentiles = tuple(result[f"p{p}_us"] / 1000 if requests else None for p in ("50", "95", "99"))
    return result_row(
        scenario,
        "http",
        implementation,
        requests,
        result["duration_us"] / 1e6,
        (percentiles[0], percentiles[1], percentiles[2]),
        correct,
        note,
        seconds_digits=3,
    )


def _answers(result: dict[str, Any]) -> dict[str, int]:
    answers = {name[1:]: int(result.get(name, 0)) for name in STATUS_NAMES}
    answers["socket_errors"] = sum(
        int(result.get(f"err_{e}", 0)) for e in ("connect", "read", "write", "timeout")
    )
    return {k: v for k, v in answers.items() if v}


# -- scenarios ------------------------------------------------------------------------


def _send_packets(client: httpx.Client, tag: str, ids: list[str], cents: int, shares: int) -> None:
    """Fund one sender and send the packets `ids`, each of `cents` in `shares` shares."""
    sender = f"sender-{tag}"
    client.post(
        f"/v1/accounts/{sender}/deposits",
        json={"amount_cents": len(ids) * cents, "reference": f"bench-{tag}"},
    ).raise_for_status()

    def send(packet_id: str) -> None:
        client.post(
            "/v1/redpackets",
            json={
                "sender_id": sender,
                "amount_cents": cents,
                "count": shares,
                "packet_id": packet_id,
            },
        ).raise_for_status()

    with ThreadPoolExecutor(SETUP_THREADS) as pool:
        list(pool.map(send, ids))


def _packet_checks(client: httpx.Client, ids: list[str]) -> dict[str, Any]:
    """Read every packet: grabs recorded = shares taken, users unique, amounts >= 1 and
    summing with the remainder to the packet's amount (so never above it)."""

    def read(packet_id: str) -> dict[str, Any]:
        body: dict[str, Any] = client.get(f"/v1/redpackets/{packet_id}").raise_for_status().json()
        return body

    with ThreadPoolExecutor(SETUP_THREADS) as pool:
        packets = list(pool.map(read, ids))
    grabs = sold_out = inconsistent = 0
    for packet in packets:
        taken = packet["count"] - packet["remaining_count"]
        grabs += taken
        sold_out += packet["remaining_count"] == 0
        users = {g["user_id"] for g in packet["grabs"]}
        amounts = [g["amount_cents"] for g in packet["grabs"]]
        inconsistent += not (
            len(users) == len(packet["grabs"]) == taken
            and all(a >= 1 for a in amounts)
            and sum(amounts) <= packet["amount_cents"]
            and sum(amounts) + packet["remaining_cents"] == packet["amount_cents"]
        )
    return {
        "grabs_recorded": grabs,
        "packets": len(ids),
        "packets_sold_out": sold_out,
        "packets_inconsistent": inconsistent,
    }


def _flash_grab(
    client: httpx.Client, wrk: str | None, url: str, seconds: int, tag: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    packets = math.ceil(EXPECTED_MAX_GRABS_PER_S * seconds / SHARES) + 1
    ids = [f"pk-{tag}-{i}" for i in range(packets)]
    _send_packets(client, tag, ids, PACKET_CENTS, SHARES)
    result = _load(wrk, url, seconds, "grab", *ids)
    checks = _packet_checks(client, ids)
    grabs = checks["grabs_recorded"]
    counted = int(result["grabbed"])
    # wrk stops with up to CONNECTIONS requests in flight: the server may have served a
    # grab whose answer wrk never counted, never the other way round.
    correct = {
        "grabs_recorded": grabs,
        "grabbed_answers": counted,
        "already_grabbed_answers": int(result["already"]),
        "uncounted_in_flight": grabs - counted,
        "packets": packets,
        "packets_sold_out": checks["packets_sold_out"],
        "answers": _answers(result),
        "ok": bool(
            0 <= grabs - counted <= CONNECTIONS
            and checks["packets_inconsistent"] == 0
            and result.get("c5xx", 0) == 0
            and counted + int(result["already"]) + int(result.get("c409", 0))
            == int(result["requests"])
        ),
    }
    return result, correct


def _open_teams(client: httpx.Client, activities: list[str], teams: int) -> None:
    """Create the activities, then open teams t1..t<teams> in each (leader = member 1)."""
    for activity in activities:
        client.post(
            "/v1/activities",
            json={"activity_id": activity, "team_size": TEAM_SIZE, "lock_ttl_s": LOCK_TTL_S},
        ).raise_for_status()

    def open_team(pair: tuple[str, int]) -> None:
        activity, i = pair
        client.post(
            f"/v1/activities/{activity}/teams",
            json={"leader_id": f"leader-{i}", "team_id": f"t{i}", "order_id": f"o-{i}"},
        ).raise_for_status()

    # In parallel: with --workers > 1 each keep-alive request costs ~40 ms (see the note).
    with ThreadPoolExecutor(SETUP_THREADS) as pool:
        list(pool.map(open_team, [(a, i) for a in activities for i in range(1, teams + 1)]))


def _team_checks(client: httpx.Client, activities: list[str], teams: int) -> dict[str, Any]:
    """Read every team after the run: seats within size (and, when open, members + locks +
    free_seats == size), nobody locked in two teams of one activity; for information, users
    who are members of two teams (the API allows it: a member of A may lock and join B)."""

    def read_team(pair: tuple[str, int]) -> dict[str, Any]:
        activity, i = pair
        url = f"/v1/activities/{activity}/teams/t{i}"
        body: dict[str, Any] = client.get(url).raise_for_status().json()
        return body

    pairs = [(a, i) for a in activities for i in range(1, teams + 1)]
    with ThreadPoolExecutor(SETUP_THREADS) as pool:
        read = list(pool.map(read_team, pairs))
    overfull = mismatched = no_leader = formed = held = members = 0
    lockers: dict[str, Counter[str]] = {a: Counter() for a in activities}
    joined: dict[str, Counter[str]] = {a: Counter() for a in activities}
    for team in read:
        seats = len(team["members"]) + len(team["locks"])
        held += len(team["locks"])
        members += len(team["members"]) - 1
        overfull += seats > team["size"]
        mismatched += team["status"] == "open" and seats + team["free_seats"] != team["size"]
        no_leader += not team["members"] or team["members"][0]["user_id"] != team["leader_id"]
        formed += team["status"] == "formed"
        lockers[team["activity_id"]].update(lock["user_id"] for lock in team["locks"])
        joined[team["activity_id"]].update(m["user_id"] for m in team["members"][1:])
    return {
        "teams": len(pairs),
        "teams_overfull": overfull,
        "teams_seats_mismatched": mismatched,
        "teams_without_leader": no_leader,
        "teams_formed": formed,
        "users_locked_in_two_teams": sum(n > 1 for c in lockers.values() for n in c.values()),
        "users_member_of_two_teams": sum(n > 1 for c in joined.values() for n in c.values()),
        "members_joined": members,
        "locks_held_at_end": held,
    }


def _by_operation(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    """{operation: {status: answers}} from the op_<operation>_<status> counts."""
    out: dict[str, dict[str, int]] = {}
    for name, value in result.items():
        if name.startswith("op_") and value:
            _, op, status = name.split("_", 2)
            out.setdefault(op, {})[status] = int(value)
    return {op: out[op] for op in OPS if op in out}


def _storm_ok(result: dict[str, Any], teams: dict[str, Any]) -> bool:
    """No seat oversold, no double lock, no 5xx, no 404/other 4xx (every id exists and every
    body is valid), every answer matched to its request (X-Request-Id)."""
    return (
        teams["teams_overfull"] == 0
        and teams["teams_seats_mismatched"] == 0
        and teams["teams_without_leader"] == 0
        and teams["users_locked_in_two_teams"] == 0
        and all(int(result.get(name, 0)) == 0 for name in ("c5xx", "c404", "c4xx", "unmatched"))
    )


def _lock_storm(
    client: httpx.Client, wrk: str | None, url: str, seconds: int, tag: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    activity = f"act-{tag}"
    _open_teams(client, [activity], TEAMS)
    result = _load(wrk, url, seconds, "storm", str(STORM_USERS), str(TEAMS), activity)
    teams = _team_checks(client, [activity], TEAMS)
    correct = {
        **teams,
        "lock_switches": int(result.get("switched", 0)),
        "by_operation": _by_operation(result),
        "answers": _answers(result),
        "ok": _storm_ok(result, teams),
    }
    return result, correct


def _mixed(
    client: httpx.Client, wrk: str | None, url: str, seconds: int, tag: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    activities = [f"mix{i}-{tag}" for i in range(MIXED_ACTIVITIES)]
    _open_teams(client, activities, MIXED_TEAMS)
    packets = [f"mixp{i}-{tag}" for i in range(MIXED_PACKETS)]
    cents = MIXED_SHARES * 100
    _send_packets(client, f"mix-{tag}", packets, cents, MIXED_SHARES)
    params = [str(STORM_USERS), str(MIXED_TEAMS), *activities, "+", *packets]
    result = _load(wrk, url, seconds, "mixed", *params)
    teams = _team_checks(client, activities, MIXED_TEAMS)
    grabs = _packet_checks(client, packets)
    counted = int(result.get("grabbed", 0))
    correct = {
        **teams,
        **grabs,
        "grabbed_answers": counted,
        "already_grabbed_answers": int(result.get("already", 0)),
        "uncounted_in_flight": grabs["grabs_recorded"] - counted,
        "lock_switches": int(result.get("switched", 0)),
        "by_operation": _by_operation(result),
        "answers": _answers(result),
        "ok": bool(
            _storm_ok(result, teams)
            and grabs["packets_inconsistent"] == 0
            and 0 <= grabs["grabs_recorded"] - counted <= CONNECTIONS
        ),
    }
    return result, correct


# -- runs -----------------------------------------------------------------------------


def _create_schema(url: str) -> None:
    """Create the tables first: two workers racing create_all on a fresh SQLite file can
    fail one worker's start-up ("table events already exists"), and uvicorn then stops."""
    from groupbuy.storage.db import Database

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
        mixed, mixed_ok = _mixed(client, wrk, url, seconds, tag)
    errors = _log_errors(log)
    for correct in (grab_ok, lock_ok, mixed_ok):
        correct["server_log_errors"] = errors
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
            f"{TEAMS} teams of {TEAM_SIZE} in one activity, {STORM_USERS} users per wrk "
            f"thread (a confirmed user is replaced by a fresh one): {STORM_STEPS}; "
            f"lock_ttl_s={LOCK_TTL_S}; ops = all answers; {common}",
        ),
        _row(
            "mixed",
            implementation,
            mixed,
            mixed_ok,
            f"{MIXED_ACTIVITIES} activities x {MIXED_TEAMS} teams of {TEAM_SIZE} and "
            f"{MIXED_PACKETS} packets x {MIXED_SHARES} shares at once: every other request "
            f"POST /v1/redpackets/{{id}}/grab on a random packet, the others storm steps "
            f"({STORM_STEPS}), {STORM_USERS} users per wrk thread, each with a random home "
            f"activity; ops = all answers; {common}",
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
    return [row, {**row, "scenario": "lock_storm"}, {**row, "scenario": "mixed"}]


def run_http(redis_url: str, workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """Rows for groupbuy serve and the bare baseline, 1 and 2 workers, every scenario."""
    workdir.mkdir(parents=True, exist_ok=True)
    wrk = _ensure_wrk()
    seconds = 2 if quick else 8  # 8 wrk runs (3 scenarios + bare, 2 worker counts)
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
