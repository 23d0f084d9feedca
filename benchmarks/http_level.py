"""HTTP level: `groupbuy serve` against bare Starlette + 1 Redis call, the embedded default
against redis-server, and open-loop latency (docs/benchmarking.md says how).

Guards the grab and the seat lock over HTTP: ratios to bare, embedded engine, p99 targets.

Usage: .venv/bin/python -m benchmarks.http_level [--quick] [--part embedded ...]
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks import harness
from benchmarks.harness import (
    REPO,
    SERVICE_KEY,
    Bench,
    Groupbuy,
    Plan,
    Row,
    Server,
    Trial,
    admin_client,
    bare_command,
    comparison,
    groupbuy,
    groupbuy_command,
    make_row,
    plan_of,
    run_sync,
    serve,
    standalone,
    trials_row,
    wait_idle,
)
from benchmarks.harness import _cpu_seconds as cpu_seconds
from benchmarks.harness import _tree as process_tree
from tests.support.servers import server_binary

THREADS, CONNECTIONS = 2, 64
SHARES, PACKET_CENTS = 10_000, 1_000_000  # the default limits of one packet
EXPECTED_MAX_GRABS_PER_S = 12_000  # enough packets that none should sell out at this rate
EXPECTED_MAX_LOCKS_PER_S = 8_000  # enough teams that none should fill at this rate
TEAMS, TEAM_SIZE, LOCK_TTL_S = 200, 50, 2
SEATS_USED = 40  # of a team's 49 free seats, by the seat-lock runs (round-robin over teams)
STORM_USERS = 100  # user slots per wrk thread (a confirmed user is replaced by a fresh one)
OPS = ("lock", "unlock", "confirm")
STATUS_NAMES = ("c200", "c201", "c404", "c409", "c410", "c4xx", "c5xx", "cother")
OPEN_LOOP_CONNECTIONS = 128
GENERATOR = ("offered_per_s", "issued_per_s", "issue_late_p50_ms", "issue_late_p99_ms",
             "waited_for_connection", "generator_cpu_share", "generator_kept_up",
             "generator_on_time", "max_ms")  # fmt: skip


FULL, QUICK = Plan(rounds=5, round_s=3, open_loop_s=5), Plan(rounds=2, round_s=2, open_loop_s=2)


def say(message: str) -> None:
    """One progress line."""
    harness.say(message, "http")


# -- load -----------------------------------------------------------------------------


def wrk_binary() -> str:
    """wrk on PATH, installed from Debian's packages when missing (as root)."""
    if shutil.which("wrk") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        for args in (["update"], ["install", "-y", "wrk"]):
            subprocess.run(["apt-get", *args], check=False, capture_output=True, timeout=300)
    found = shutil.which("wrk")
    if found is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk): no HTTP load")
    return found


def load(url: str, seconds: int, mode: str, *params: str) -> dict[str, Any]:
    """Drive requests for `seconds`; the counts by status (and by operation for the storm:
    op_<operation>_<status>) and latency percentiles (µs)."""
    script = REPO / "benchmarks" / "wrk" / "load.lua"
    args = [wrk_binary(), f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{seconds}s", "-s", str(script)]
    done = subprocess.run(
        [*args, url, "--", mode, SERVICE_KEY, *params],
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


def answers(result: dict[str, Any]) -> dict[str, int]:
    """The answers by status, and the socket errors."""
    found = {name[1:]: int(result.get(name, 0)) for name in STATUS_NAMES}
    found["socket_errors"] = sum(
        int(result.get(f"err_{e}", 0)) for e in ("connect", "read", "write", "timeout")
    )
    return {k: v for k, v in found.items() if v}


def open_loop(url: str, rate: float, seconds: float, tag: str, mode: str, *params: str) -> Any:
    """benchmarks/openloop.py in its own process (so it does not share this one's heap)."""
    args = [sys.executable, "-m", "benchmarks.openloop", url, f"{rate:.1f}", str(seconds)]
    args += [str(OPEN_LOOP_CONNECTIONS), tag, mode, SERVICE_KEY, *params]
    done = subprocess.run(
        args, cwd=REPO, capture_output=True, text=True, timeout=seconds + 120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"open-loop generator failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


# -- layouts and their CPU --------------------------------------------------------------

LEASE_LINE = b"holds the scheduler lease"  # the worker's log line once it runs the jobs
WORKER_START_S = 30.0  # longest a `groupbuy worker` may take to hold the lease (loaded machine)
STOP_WAIT_S = 10.0  # longest a SIGTERM'd worker may take to stop before it is killed


@dataclass
class Layout(Groupbuy):
    """A `groupbuy serve` under test and what else a request's CPU is counted on: a `groupbuy
    worker` running its jobs (the write-behind included), if any, on the same Redis keys and
    SQLite file, and `meters` of other processes (name -> seconds used so far)."""

    worker: Server | None = None
    meters: dict[str, Callable[[], float]] = field(default_factory=dict)

    def settle(self) -> float:
        """Wait until the server and the worker are both idle (the backlog written)."""
        return round(wait_idle(list(roles(self).values())), 2)


def roles(target: Groupbuy) -> dict[str, Server]:
    """The processes whose CPU a grab costs, by role: the server, and the worker if any."""
    found = {"serve": target.server}
    if isinstance(target, Layout) and target.worker is not None:
        found["worker"] = target.worker
    return found


def cpu_by_role(target: Groupbuy) -> dict[str, float]:
    """CPU seconds used so far by each role's process and its children (all threads), and
    by the layout's other meters."""
    used = {role: cpu_seconds(process_tree(s.process.pid)) for role, s in roles(target).items()}
    if isinstance(target, Layout):
        used.update((name, meter()) for name, meter in target.meters.items())
    return used


def spent_since(before: dict[str, float], target: Groupbuy) -> dict[str, float]:
    """CPU seconds each role used since `before`."""
    return {role: now - before[role] for role, now in cpu_by_role(target).items()}


@dataclass
class CpuBook:
    """CPU seconds and requests of each contender's measured rounds, by role."""

    cpu_s: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    requests: Counter[str] = field(default_factory=Counter)

    def add(self, name: str, index: int, result: dict[str, Any]) -> None:
        """Count one round's CPU (the warm-up round, index 0, is not counted)."""
        if index:
            self.cpu_s[name].update(result["cpu_s"])
            self.requests[name] += int(result["requests"])

    def per_request_us(self, name: str) -> dict[str, float]:
        """CPU µs per answered request of each role, over the contender's rounds."""
        done = max(1, self.requests[name])
        return {role: round(spent * 1e6 / done, 1) for role, spent in self.cpu_s[name].items()}

    def note(self, name: str) -> str:
        """The CPU per request for a row's note."""
        shown = ", ".join(f"{r} {us:,.0f}" for r, us in self.per_request_us(name).items())
        return f"CPU µs per request: {shown}"


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL the process group if it has not stopped in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@contextlib.contextmanager
def job_worker(env: dict[str, str], log: Path) -> Iterator[Server]:
    """`groupbuy worker` in its own process group, yielded once it holds the jobs' lease."""
    args = [sys.executable, "-m", "groupbuy.cli", "worker"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + WORKER_START_S
            while LEASE_LINE not in log.read_bytes():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"groupbuy worker did not take the lease; see {log}")
                time.sleep(0.1)
            yield Server("", process, log)
        finally:
            _stop(process)


@contextlib.contextmanager
def split_groupbuy(redis_url: str, workdir: Path, tag: str) -> Iterator[Layout]:
    """One `groupbuy serve` worker with GROUPBUY_SCHEDULER_ENABLED=false and one `groupbuy
    worker` beside it that runs the jobs."""
    args, env, port = groupbuy_command(
        redis_url, workdir, 1, tag, GROUPBUY_SCHEDULER_ENABLED="false"
    )
    with (
        serve(args, env, port, workdir / f"groupbuy-{tag}.log") as running,
        job_worker(
            {**env, "GROUPBUY_SCHEDULER_ENABLED": "true"}, workdir / f"worker-{tag}.log"
        ) as worker,
        admin_client(running.url) as client,
    ):
        yield Layout(running, client, tag, worker)


# -- set-up and checks ----------------------------------------------------------------


def _parallel(call: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    # In parallel: with --workers > 1 each keep-alive request waits for a delayed ACK.
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(call, items))


def send_packets(client: httpx.Client, tag: str, ids: list[str], cents: int, shares: int) -> None:
    """Fund one sender and send the packets `ids`, each of `cents` in `shares` shares."""
    sender = f"sender-{tag}"
    client.post(
        f"/v1/accounts/{sender}/deposits",
        json={"amount_cents": len(ids) * cents, "reference": f"bench-{tag}"},
    ).raise_for_status()
    body = {"sender_id": sender, "amount_cents": cents, "count": shares}

    def send(pid: str) -> None:
        client.post("/v1/redpackets", json={**body, "packet_id": pid}).raise_for_status()

    _parallel(send, ids)


def _packet_with_every_grab(client: httpx.Client, pid: str) -> tuple[Any, list[Any]]:
    """A packet and all its grabs (its body carries the first 100; the rest are paged)."""
    packet = client.get(f"/v1/redpackets/{pid}").raise_for_status().json()
    every, cursor = list(packet["grabs"]), packet["grabs_next_cursor"]
    while cursor is not None:
        page = client.get(f"/v1/redpackets/{pid}/grabs", params={"cursor": cursor, "limit": 100})
        body = page.raise_for_status().json()
        every += body["grabs"]
        cursor = body["next_cursor"]
    return packet, every


def packet_checks(client: httpx.Client, ids: list[str]) -> dict[str, Any]:
    """Read every packet: grabs recorded = shares taken, users unique, amounts >= 1 and
    summing with the remainder to the packet's amount (so never above it)."""
    packets = _parallel(lambda pid: _packet_with_every_grab(client, pid), ids)
    grabs = sold_out = inconsistent = 0
    for packet, every in packets:
        taken = packet["count"] - packet["remaining_count"]
        grabs += taken
        sold_out += packet["remaining_count"] == 0
        users = {g["user_id"] for g in every}
        amounts = [g["amount_cents"] for g in every]
        inconsistent += not (
            len(users) == len(every) == taken
            and all(a >= 1 for a in amounts)
            and sum(amounts) + packet["remaining_cents"] == packet["amount_cents"]
        )
    return {"grabs_recorded": grabs, "packets": len(ids), "packets_sold_out": sold_out,
            "packets_inconsistent": inconsistent}  # fmt: skip


def open_teams(
    client: httpx.Client, activities: list[str], teams: int, lock_ttl_s: int = LOCK_TTL_S
) -> None:
    """Create the activities, then open teams t1..t<teams> in each (leader = member 1)."""
    for activity in activities:
        client.post(
            "/v1/activities",
            json={"activity_id": activity, "team_size": TEAM_SIZE, "lock_ttl_s": lock_ttl_s},
        ).raise_for_status()

    def open_team(pair: tuple[str, int]) -> None:
        activity, i = pair
        client.post(
            f"/v1/activities/{activity}/teams",
            json={"leader_id": f"leader-{i}", "team_id": f"t{i}", "order_id": f"o-{i}"},
        ).raise_for_status()

    _parallel(open_team, [(a, i) for a in activities for i in range(1, teams + 1)])


def team_checks(client: httpx.Client, activities: list[str], teams: int) -> dict[str, Any]:
    """Read every team after the run: seats within size (and, when open, members + locks +
    free_seats == size), nobody locked in two teams of one activity; for information, users
    who are members of two teams (the API allows it: a member of A may lock and join B)."""
    pairs = [(a, i) for a in activities for i in range(1, teams + 1)]
    read = _parallel(
        lambda p: client.get(f"/v1/activities/{p[0]}/teams/t{p[1]}").raise_for_status().json(),
        pairs,
    )
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
        "teams": len(pairs), "teams_overfull": overfull, "teams_seats_mismatched": mismatched,
        "teams_without_leader": no_leader, "teams_formed": formed,
        "users_locked_in_two_teams": sum(n > 1 for c in lockers.values() for n in c.values()),
        "users_member_of_two_teams": sum(n > 1 for c in joined.values() for n in c.values()),
        "members_joined": members, "locks_held_at_end": held,
    }  # fmt: skip


def _storm_ok(result: dict[str, Any], teams: dict[str, Any]) -> bool:
    """No seat oversold, no double lock, no 5xx, no 404/other 4xx (every id exists and every
    body is valid), every answer matched to its request (X-Request-Id)."""
    return (
        teams["teams_overfull"] == teams["teams_seats_mismatched"] == 0
        and teams["teams_without_leader"] == teams["users_locked_in_two_teams"] == 0
        and all(int(result.get(name, 0)) == 0 for name in ("c5xx", "c404", "c4xx", "unmatched"))
    )


# -- scenarios: (wrk's result, correctness counts) ------------------------------------

Measured = tuple[dict[str, Any], dict[str, Any]]


def flash_grab(target: Groupbuy, seconds: int, tag: str) -> Measured:
    """Distinct users over packets of SHARES shares, every 20th request a double tap."""
    packets = math.ceil(EXPECTED_MAX_GRABS_PER_S * seconds / SHARES) + 1
    ids = [f"pk-{tag}-{i}" for i in range(packets)]
    send_packets(target.client, tag, ids, PACKET_CENTS, SHARES)
    before = cpu_by_role(target)
    result = load(target.server.url, seconds, "grab", *ids)
    idle_after_s = target.settle()
    # The load and the write-behind it left (settle waits for both), not the set-up and
    # the checks' reads.
    result["cpu_s"] = spent_since(before, target)
    checks = packet_checks(target.client, ids)
    grabs, counted, already = (
        checks["grabs_recorded"],
        int(result["grabbed"]),
        int(result["already"]),
    )
    # wrk stops with up to CONNECTIONS requests in flight: the server may have served a
    # grab whose answer wrk never counted, never the other way round.
    ok = (
        0 <= grabs - counted <= CONNECTIONS
        and checks["packets_inconsistent"] == 0
        and result.get("c5xx", 0) == 0
        and counted + already + int(result.get("c409", 0)) == int(result["requests"])
    )
    return result, {
        "seconds_to_idle_after_load": idle_after_s, "grabs_recorded": grabs,
        "grabbed_answers": counted, "already_grabbed_answers": already,
        "uncounted_in_flight": grabs - counted, "packets": packets,
        "packets_sold_out": checks["packets_sold_out"], "answers": answers(result), "ok": bool(ok),
    }  # fmt: skip


def lock_storm(target: Groupbuy, seconds: int, tag: str) -> Measured:
    """Users locking, switching, unlocking and confirming in one activity's teams."""
    activity = f"act-{tag}"
    open_teams(target.client, [activity], TEAMS)
    result = load(target.server.url, seconds, "storm", str(STORM_USERS), str(TEAMS), activity)
    idle_after_s = target.settle()
    teams = team_checks(target.client, [activity], TEAMS)
    by_operation: dict[str, dict[str, int]] = {}
    for name, value in result.items():
        if name.startswith("op_") and value:
            _, op, status = name.split("_", 2)
            by_operation.setdefault(op, {})[status] = int(value)
    return result, {
        "seconds_to_idle_after_load": idle_after_s, **teams,
        "lock_switches": int(result.get("switched", 0)),
        "by_operation": {op: by_operation[op] for op in OPS if op in by_operation},
        "answers": answers(result), "ok": _storm_ok(result, teams),
    }  # fmt: skip


def seat_locks(target: Groupbuy, seconds: int, tag: str) -> Measured:
    """Closed loop: a new user locks a seat each request, round-robin over enough teams."""
    activity = f"locks-{tag}"
    teams = math.ceil(EXPECTED_MAX_LOCKS_PER_S * seconds / SEATS_USED) + 1
    open_teams(target.client, [activity], teams, lock_ttl_s=300)
    before = cpu_by_role(target)
    result = load(target.server.url, seconds, "lock", activity, str(teams))
    idle_after_s = target.settle()
    result["cpu_s"] = spent_since(before, target)
    checks = team_checks(target.client, [activity], teams)
    refused = int(result.get("c201", 0)) + int(result.get("c409", 0)) != int(result["requests"])
    return result, {
        "seconds_to_idle_after_load": idle_after_s,
        **checks,
        "answers": answers(result),
        "ok": _storm_ok(result, checks) and not refused,
    }


# -- rounds and rows --------------------------------------------------------------------


def wrk_trial(result: dict[str, Any], correct: dict[str, Any]) -> Trial:
    """wrk's result as a trial: its requests, duration and percentiles."""
    p50, p95, p99 = (result[f"p{p}_us"] / 1000 for p in ("50", "95", "99"))
    return Trial(int(result["requests"]), result["duration_us"] / 1e6, correct,
                 percentiles_ms=(p50, p95, p99))  # fmt: skip


Scenario = Callable[[Groupbuy, int, str], Measured]


def groupbuy_trial(
    scenario: Scenario, target: Groupbuy, seconds: int, book: tuple[CpuBook, str] | None = None
) -> Callable[[int], Trial]:
    """A round of one scenario on one server (the warm-up round lasts 1 s); its CPU is
    counted in `book` under the given name when the scenario measures it."""

    def trial(index: int) -> Trial:
        result, correct = scenario(target, seconds if index else 1, f"{target.tag}r{index}")
        if book is not None:
            book[0].add(book[1], index, result)
        return wrk_trial(result, correct)

    return trial


def _bare_trial(server: Server, seconds: int, book: CpuBook) -> Callable[[int], Trial]:
    def trial(index: int) -> Trial:
        before = cpu_seconds(process_tree(server.process.pid))
        result = load(server.url, seconds if index else 1, "bare")
        wait_idle([server])  # the same window as a grab's, which waits for its write-behind
        result["cpu_s"] = {"serve": cpu_seconds(process_tree(server.process.pid)) - before}
        book.add(BARE, index, result)
        ok = result.get("c200", 0) == result["requests"]
        return wrk_trial(result, {"answers": answers(result), "ok": ok})

    return trial


def rounds_row(
    scenario: str, implementation: str, trials: list[Trial], note: str, **extra: Any
) -> Row:
    """A row for the rounds of one contender: ops and seconds summed, each percentile the
    median of the rounds' (wrk reports percentiles, not its samples)."""
    return trials_row(scenario, implementation, trials, f"{note}; {len(trials)} rounds",
                      level="http", **extra)  # fmt: skip


def costed_row(
    scenario: str, implementation: str, trials: list[Trial], note: str, book: CpuBook, name: str
) -> Row:
    """rounds_row with the contender's CPU per request in its note and in `cpu_us`."""
    return rounds_row(scenario, implementation, trials, f"{note}; {book.note(name)}",
                      cpu_us=book.per_request_us(name))  # fmt: skip


def wrk_note(seconds: int) -> str:
    """How wrk drove a row's load (each scenario's workload: docs/benchmarking.md)."""
    return f"wrk -t{THREADS} -c{CONNECTIONS} -d{seconds}s"


def log_errors(rows: list[Row], server: Server) -> None:
    """Note the server's logged errors in each row's correctness counts."""
    errors = server.log_errors()
    for row in rows:
        row["correct"]["server_log_errors"] = errors


GRAB, BARE, STORM = "groupbuy flash grab", "bare", "groupbuy lock storm"
SPLIT = "groupbuy flash grab, write-behind in groupbuy worker"


def _against_bare(bench: Bench, plan: Plan, workers: int) -> list[Row]:
    """Interleaved rounds of groupbuy's flash grab and the bare endpoint (and, on 1 worker,
    the grab with its write-behind in `groupbuy worker`, groupbuy's lock storm, then the
    open-loop rows): their rows, with CPU per request, and comparisons."""
    n = f"{workers} worker{'s' if workers > 1 else ''}"
    how = wrk_note(plan.round_s)
    args, env, port = bare_command(bench.redis_url, workers)
    book = CpuBook()
    with (
        groupbuy(bench.redis_url, bench.workdir, workers, f"u{workers}") as uv,
        serve(args, env, port, bench.workdir / f"bare-w{workers}.log") as bare,
        _split_if(workers == 1, bench) as split,
    ):
        servers = [uv.server, bare]
        contenders = {GRAB: groupbuy_trial(flash_grab, uv, plan.round_s, (book, GRAB)),
                      BARE: _bare_trial(bare, plan.round_s, book)}  # fmt: skip
        if split is not None:
            servers += roles(split).values()
            contenders[SPLIT] = groupbuy_trial(flash_grab, split, plan.round_s, (book, SPLIT))
            contenders[STORM] = groupbuy_trial(lock_storm, uv, plan.round_s)
        say(f"{n}: {', '.join(contenders)}; {plan.rounds} rounds")
        trials = run_sync(contenders, plan.rounds, between=lambda: wait_idle(servers), say=say)
        mine = [costed_row("flash_grab", f"groupbuy ({n})", trials[GRAB], how, book, GRAB)]
        beside: list[Row] = []
        if split is not None:
            beside.append(costed_row("flash_grab", f"groupbuy ({n}, write-behind in groupbuy "
                                     "worker)", trials[SPLIT], how, book, SPLIT))  # fmt: skip
            log_errors(beside, split.server)
            mine.append(rounds_row("lock_storm", f"groupbuy ({n})", trials[STORM], how))
            grab_max = statistics.median(t.rate for t in trials[GRAB])
            mine += _open_loop_rows(uv, plan, servers, grab_max)
        name = f"bare starlette + 1 redis call ({n})"
        base = costed_row("flash_grab", name, trials[BARE], how, book, BARE)
        log_errors(mine, uv.server)
        log_errors([base], bare)
    to_bare = "/ bare Starlette + one Redis call (interleaved)"
    rows = [
        *mine,
        *beside,
        base,
        comparison(
            f"http_grab_vs_bare_{workers}",
            f"HTTP grab, {n} {to_bare}",
            trials[GRAB],
            trials[BARE],
            1.0 if workers == 1 else 0.7,
        ),
    ]
    if workers == 1:
        rows.append(comparison("http_grab_worker_vs_bare_1",
                               f"HTTP grab, {n}, write-behind in groupbuy worker {to_bare}",
                               trials[SPLIT], trials[BARE], 0.9))  # fmt: skip
        rows.append(comparison("http_lock_vs_bare_1", f"HTTP lock storm, {n} {to_bare}",
                               trials[STORM], trials[BARE], 0.7))  # fmt: skip
    return rows


@contextlib.contextmanager
def _split_if(wanted: bool, bench: Bench) -> Iterator[Layout | None]:
    """The split layout (split_groupbuy) when wanted, else None."""
    if not wanted:
        yield None
        return
    with split_groupbuy(bench.redis_url, bench.workdir, "w1") as split:
        yield split


def _embedded(bench: Bench, plan: Plan) -> list[Row]:
    """The flash grab on the embedded default (`groupbuy serve` with no Redis URL: its own
    engine on a Unix socket, append-only file fsynced before every answer) against the same
    service on the private redis-server (TCP, no persistence), alternated round by round."""
    note = wrk_note(plan.round_s)
    with (
        groupbuy(bench.redis_url, bench.workdir, 1, "r1") as paired,
        groupbuy("", bench.workdir, 1, "e1") as embedded,
    ):
        servers = [paired.server, embedded.server]
        contenders = {"redis-server": groupbuy_trial(flash_grab, paired, plan.round_s),
                      "embedded": groupbuy_trial(flash_grab, embedded, plan.round_s)}  # fmt: skip
        say(f"1 worker, embedded engine against redis-server; {plan.rounds} rounds")
        trials = run_sync(contenders, plan.rounds, between=lambda: wait_idle(servers), say=say)
        started = embedded.server.log.read_text(errors="replace").splitlines()
        engine = next(
            (s.split(":", 1)[1].strip() for s in started if s.strip().startswith("redis:")), "?"
        )
        mine = rounds_row("flash_grab", "groupbuy (1 worker, embedded engine)",
                          trials["embedded"], f"{note}; no Redis URL: {engine}")  # fmt: skip
        base = rounds_row(
            "flash_grab", "groupbuy (1 worker, redis-server beside the embedded engine)",
            trials["redis-server"], f"{note}; {server_binary() or 'server'}",
        )  # fmt: skip
        log_errors([mine], embedded.server)
        log_errors([base], paired.server)
    what = ("HTTP grab, 1 worker: embedded engine (Unix socket, AOF fsync always) / "
            "redis-server (TCP, no persistence) (interleaved)")  # fmt: skip
    compared = comparison("http_grab_embedded_vs_redis_1", what, trials["embedded"],
                          trials["redis-server"], 0.9)  # fmt: skip
    return [mine, base, compared]


# -- open loop ------------------------------------------------------------------------


def _open_loop_rows(
    target: Groupbuy, plan: Plan, servers: list[Server], grab_max: float
) -> list[Row]:
    """Grabs and seat locks offered at half and 80% of their closed-loop rates on 1 worker."""
    wait_idle(servers)
    say("1 worker: seat locks, closed loop (the maximum for the open loop)")
    note = wrk_note(plan.round_s)
    trial = wrk_trial(*seat_locks(target, plan.round_s, "u1"))
    locks = make_row("seat_locks", "groupbuy (1 worker)", trial.seconds, [], trial.correct, note,
                     ops=trial.ops, level="http", percentiles_ms=trial.percentiles_ms)  # fmt: skip
    rows = [locks]
    for fraction in (0.5, 0.8):
        for kind, max_rate in (("grab", grab_max), ("lock", float(locks["ops_per_s"]))):
            wait_idle(servers)
            rows.append(_open_loop_row(target, plan, kind, max_rate, fraction))
    return rows


def _open_loop_row(
    target: Groupbuy, plan: Plan, kind: str, max_rate: float, fraction: float
) -> Row:
    rate, seconds = max_rate * fraction, plan.open_loop_s
    total, tag = int(rate * seconds), f"{target.tag}-{kind}{int(fraction * 100)}"
    label = "half" if fraction == 0.5 else f"{fraction:.0%}"
    say(f"1 worker: {kind}s offered at {rate:,.0f}/s ({label} of max)")
    client, url = target.client, target.server.url
    correct: dict[str, Any]
    if kind == "grab":
        ids = [f"ol-{tag}-{i}" for i in range(math.ceil(total / SHARES) + 1)]
        send_packets(client, tag, ids, PACKET_CENTS, SHARES)
        result = open_loop(url, rate, seconds, tag, "grab", *ids)
        correct = {"seconds_to_idle_after_load": target.settle(), **packet_checks(client, ids)}
        correct.update(grabbed_answers=result["grabbed"], already_grabbed_answers=result["already"])
        ok = (correct["grabs_recorded"] == result["grabbed"]
              and correct["packets_inconsistent"] == correct["packets_sold_out"] == 0
              and result["grabbed"] + result["already"] == sum(result["statuses"].values())
              == result["requests"])  # fmt: skip
    else:
        activity, teams = f"ol-{tag}", math.ceil(total / SEATS_USED) + 1
        open_teams(client, [activity], teams, lock_ttl_s=300)
        result = open_loop(url, rate, seconds, tag, "lock", activity, str(teams))
        correct = {"seconds_to_idle_after_load": target.settle(),
                   **team_checks(client, [activity], teams)}  # fmt: skip
        locked = result["statuses"].get("201", 0)
        ok = (
            locked == result["requests"] == correct["locks_held_at_end"]
            and correct["teams_overfull"] == correct["users_locked_in_two_teams"] == 0
        )
    generator = {k: v for k, v in result.items() if k in GENERATOR}
    correct.update(ok=bool(ok), answers=result["statuses"], unanswered=result["unanswered"],
                   generator_kept_up=result["generator_kept_up"],
                   generator_on_time=result["generator_on_time"])  # fmt: skip
    note = f"offered at {rate:,.0f}/s ({label} of {max_rate:,.0f}/s) for {seconds} s"
    return make_row(
        f"{kind} @ {label} max rate", "groupbuy (1 worker)", float(seconds),
        [ms / 1000 for ms in result["latencies_ms"]], correct, note, ops=result["answered"],
        level="http", percentiles_ms=(result["p50_ms"], result["p95_ms"], result["p99_ms"]),
        offered_fraction=fraction, generator=generator,
    )  # fmt: skip


PARTS = ("1 worker", "embedded", "2 workers")


def run_http(bench: Bench) -> list[Row]:
    """Rows (and comparison rows) for groupbuy serve and the bare baseline, and for the
    embedded default against redis-server (the parts of PARTS the bench asks for)."""
    plan = plan_of(bench, FULL, QUICK)
    rows: list[Row] = []
    runs: dict[str, Callable[[], list[Row]]] = {
        "1 worker": lambda: _against_bare(bench, plan, 1),
        "embedded": lambda: _embedded(bench, plan),
        "2 workers": lambda: _against_bare(bench, plan, 2),
    }
    with contextlib.closing(redis.Redis.from_url(bench.redis_url)) as flush:
        for part in bench.parts or PARTS:
            flush.flushall()
            rows += runs[part]()
    return rows


if __name__ == "__main__":
    standalone(run_http, __doc__, PARTS)
