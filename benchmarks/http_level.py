"""HTTP level: `groupbuy serve` against bare Starlette + 1 Redis call, the embedded default
against redis-server, and open-loop latency.

wrk drives the closed-loop load through benchmarks/wrk/post.lua (grab, lock, bare) and
benchmarks/wrk/storm.lua (storm, mixed), which count answers by status (and "grabbed"
bodies, and per operation) and print latency percentiles. The servers of one worker count
run side by side (benchmarks/servers.py: own key prefixes and SQLite files) so that the
comparisons alternate round by round (benchmarks/interleave.py); each round starts once
every server is idle, and the checks after a load run once its server is idle
(`seconds_to_idle_after_load`). Then, on the 1-worker server, grabs and seat locks are
offered open-loop (benchmarks/openloop.py) at half and 80% of the closed-loop rate.

Usage: .venv/bin/python -m benchmarks.http_level [--full] [--part embedded ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.interleave import Trial, comparison, merge_correct, run_sync
from benchmarks.measure import Row, result_row
from benchmarks.servers import (
    ADMIN_KEY,
    SERVICE_KEY,
    Server,
    bare_command,
    groupbuy_command,
    serve,
    wait_idle,
)
from tests.support.servers import server_binary, start_redis

REPO = Path(__file__).resolve().parents[1]
LUA = REPO / "benchmarks" / "wrk" / "post.lua"
STORM_LUA = REPO / "benchmarks" / "wrk" / "storm.lua"
THREADS = 2
CONNECTIONS = 64
SHARES, PACKET_CENTS = 10_000, 1_000_000  # the default limits of one packet
EXPECTED_MAX_GRABS_PER_S = 12_000  # enough packets that none should sell out at this rate
EXPECTED_MAX_LOCKS_PER_S = 8_000  # enough teams that none should fill at this rate
TEAMS, TEAM_SIZE, LOCK_TTL_S = 200, 50, 2
SEATS_USED = 40  # of a team's 49 free seats, by the seat-lock runs (round-robin over teams)
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
OPEN_LOOP_CONNECTIONS = 128
OPEN_LOOP_FRACTIONS = (0.5, 0.8)


@dataclass(frozen=True)
class Plan:
    """How long each HTTP measurement runs (full run or quick run)."""

    rounds: int  # interleaved rounds, after a 1 s warm-up round
    round_s: int  # wrk -d of one round
    single_s: int  # wrk -d of a measurement taken once
    open_loop_s: int  # duration of an open-loop run


FULL = Plan(rounds=5, round_s=3, single_s=5, open_loop_s=5)
QUICK = Plan(rounds=2, round_s=2, single_s=2, open_loop_s=2)


# -- processes ------------------------------------------------------------------------


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
        raise RuntimeError("wrk is not installed (apt-get install wrk): no HTTP load")
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


def _answers(result: dict[str, Any]) -> dict[str, int]:
    answers = {name[1:]: int(result.get(name, 0)) for name in STATUS_NAMES}
    answers["socket_errors"] = sum(
        int(result.get(f"err_{e}", 0)) for e in ("connect", "read", "write", "timeout")
    )
    return {k: v for k, v in answers.items() if v}


# -- servers under test ----------------------------------------------------------------


@dataclass
class Groupbuy:
    """A groupbuy server under test and an admin client for set-up and checks."""

    server: Server
    client: httpx.Client
    tag: str

    def settle(self) -> float:
        """Wait until the server has answered what the load left in flight (and written
        behind), so the checks read a state no request is still changing; the seconds
        that took (-1: the server never went idle)."""
        return round(wait_idle([self.server]), 2)


@contextlib.contextmanager
def _groupbuy(
    server: str, redis_url: str, workdir: Path, workers: int, tag: str, **settings: str
) -> Iterator[Groupbuy]:
    args, env, port = groupbuy_command(server, redis_url, workdir, workers, tag, **settings)
    with (
        serve(args, env, port, workdir / f"groupbuy-{tag}.log") as running,
        httpx.Client(
            base_url=running.url,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=60,
            limits=httpx.Limits(max_connections=SETUP_THREADS),
        ) as client,
    ):
        yield Groupbuy(running, client, tag)


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
    target: Groupbuy, wrk: str | None, seconds: int, tag: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    client, url = target.client, target.server.url
    packets = math.ceil(EXPECTED_MAX_GRABS_PER_S * seconds / SHARES) + 1
    ids = [f"pk-{tag}-{i}" for i in range(packets)]
    _send_packets(client, tag, ids, PACKET_CENTS, SHARES)
    result = _load(wrk, url, seconds, "grab", *ids)
    idle_after_s = target.settle()
    checks = _packet_checks(client, ids)
    grabs = checks["grabs_recorded"]
    counted = int(result["grabbed"])
    # wrk stops with up to CONNECTIONS requests in flight: the server may have served a
    # grab whose answer wrk never counted, never the other way round.
    correct = {
        "seconds_to_idle_after_load": idle_after_s,
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


def _open_teams(
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

    # In parallel: with --workers > 1 each keep-alive request waits for a delayed ACK.
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
    target: Groupbuy, wrk: str | None, seconds: int, tag: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    client, url = target.client, target.server.url
    activity = f"act-{tag}"
    _open_teams(client, [activity], TEAMS)
    result = _load(wrk, url, seconds, "storm", str(STORM_USERS), str(TEAMS), activity)
    idle_after_s = target.settle()
    teams = _team_checks(client, [activity], TEAMS)
    correct = {
        "seconds_to_idle_after_load": idle_after_s,
        **teams,
        "lock_switches": int(result.get("switched", 0)),
        "by_operation": _by_operation(result),
        "answers": _answers(result),
        "ok": _storm_ok(result, teams),
    }
    return result, correct


def _mixed(
    target: Groupbuy, wrk: str | None, seconds: int, tag: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    client, url = target.client, target.server.url
    activities = [f"mix{i}-{tag}" for i in range(MIXED_ACTIVITIES)]
    _open_teams(client, activities, MIXED_TEAMS)
    packets = [f"mixp{i}-{tag}" for i in range(MIXED_PACKETS)]
    cents = MIXED_SHARES * 100
    _send_packets(client, f"mix-{tag}", packets, cents, MIXED_SHARES)
    params = [str(STORM_USERS), str(MIXED_TEAMS), *activities, "+", *packets]
    result = _load(wrk, url, seconds, "mixed", *params)
    idle_after_s = target.settle()
    teams = _team_checks(client, activities, MIXED_TEAMS)
    grabs = _packet_checks(client, packets)
    counted = int(result.get("grabbed", 0))
    correct = {
        "seconds_to_idle_after_load": idle_after_s,
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


def _seat_locks(
    target: Groupbuy, wrk: str | None, seconds: int, tag: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    client, url = target.client, target.server.url
    """Closed loop: a new user locks a seat each request, round-robin over enough teams."""
    activity = f"locks-{tag}"
    teams = math.ceil(EXPECTED_MAX_LOCKS_PER_S * seconds / SEATS_USED) + 1
    _open_teams(client, [activity], teams, lock_ttl_s=300)
    result = _load(wrk, url, seconds, "lock", activity, str(teams))
    idle_after_s = target.settle()
    checks = _team_checks(client, [activity], teams)
    correct = {
        "seconds_to_idle_after_load": idle_after_s,
        **checks,
        "answers": _answers(result),
        "ok": bool(
            _storm_ok(result, checks)
            and int(result.get("c201", 0)) + int(result.get("c409", 0)) == int(result["requests"])
        ),
    }
    return result, correct


# -- runs -----------------------------------------------------------------------------


def _trial(result: dict[str, Any], correct: dict[str, Any]) -> Trial:
    percentiles = tuple(result[f"p{p}_us"] / 1000 for p in ("50", "95", "99"))
    return Trial(
        int(result["requests"]),
        result["duration_us"] / 1e6,
        correct,
        percentiles_ms=(percentiles[0], percentiles[1], percentiles[2]),
    )


Scenario = Callable[[Groupbuy, str | None, int, str], tuple[dict[str, Any], dict[str, Any]]]


def _groupbuy_trial(
    scenario: Scenario, target: Groupbuy, wrk: str | None, seconds: int
) -> Callable[[int], Trial]:
    """A round of one scenario on one server (the warm-up round lasts 1 s)."""

    def trial(index: int) -> Trial:
        return _trial(*scenario(target, wrk, seconds if index else 1, f"{target.tag}r{index}"))

    return trial


def _bare_trial(server: Server, wrk: str | None, seconds: int) -> Callable[[int], Trial]:
    def trial(index: int) -> Trial:
        result = _load(wrk, server.url, seconds if index else 1, "bare")
        correct = {"answers": _answers(result), "ok": result.get("c200", 0) == result["requests"]}
        return _trial(result, correct)

    return trial


def _rounds_row(scenario: str, implementation: str, trials: list[Trial], note: str) -> Row:
    """A row for the rounds of one contender: ops and seconds summed, each percentile the
    median of the rounds' (wrk reports percentiles, not its samples)."""

    def median_of(i: int) -> float | None:
        values = [t.percentiles_ms[i] for t in trials if t.percentiles_ms]
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 3) if present else None

    return result_row(
        scenario,
        "http",
        implementation,
        sum(t.ops for t in trials),
        sum(t.seconds for t in trials),
        (median_of(0), median_of(1), median_of(2)),
        merge_correct([t.correct for t in trials]),
        f"{note}; {len(trials)} rounds in rotating order with the other contenders, each "
        "started with every server idle; percentiles are the median of the rounds'",
        seconds_digits=3,
        rounds_ops_per_s=[round(t.rate, 1) for t in trials],
    )


def _single_row(
    scenario: str, implementation: str, result: dict[str, Any], correct: dict[str, Any], note: str
) -> Row:
    trial = _trial(result, correct)
    assert trial.percentiles_ms is not None
    return result_row(
        scenario,
        "http",
        implementation,
        trial.ops,
        trial.seconds,
        trial.percentiles_ms,
        correct,
        note,
        seconds_digits=3,
    )


def _notes(how: str, workers: int, seconds: int) -> dict[str, str]:
    how = f"{how} -d{seconds}s"
    common = f"{how}; SQLite write-behind and scheduler on; access log at INFO to a file"
    common += NAGLE_NOTE if workers > 1 else ""
    return {
        "flash_grab": "POST /v1/redpackets/{id}/grab, distinct users over packets of "
        f"{SHARES} shares, every 20th request a double tap; ops = all answers; {common}",
        "lock_storm": f"{TEAMS} teams of {TEAM_SIZE} in one activity, {STORM_USERS} users per "
        f"wrk thread (a confirmed user is replaced by a fresh one): {STORM_STEPS}; "
        f"lock_ttl_s={LOCK_TTL_S}; ops = all answers; {common}",
        "mixed": f"{MIXED_ACTIVITIES} activities x {MIXED_TEAMS} teams of {TEAM_SIZE} and "
        f"{MIXED_PACKETS} packets x {MIXED_SHARES} shares at once: every other request "
        f"POST /v1/redpackets/{{id}}/grab on a random packet, the others storm steps "
        f"({STORM_STEPS}), {STORM_USERS} users per wrk thread, each with a random home "
        f"activity; ops = all answers; {common}",
        "seat_locks": "POST /v1/activities/{a}/teams/{t}/locks, a new user each request, "
        f"round-robin over teams of {TEAM_SIZE} (at most {SEATS_USED} locks a team, lock_ttl_s="
        f"300); ops = all answers; {common}",
        "bare": "POST /grab = one EVALSHA (HINCRBY), small JSON; same uvicorn options; "
        f"{how}; one measurement, reported under every scenario"
        + (NAGLE_NOTE if workers > 1 else ""),
    }


def _log_errors(rows: list[Row], server: Server) -> None:
    errors = server.log_errors()
    for row in rows:
        row["correct"]["server_log_errors"] = errors


GRAB, BARE, STORM = "groupbuy flash grab", "bare", "groupbuy lock storm"


def _against_bare(
    stack: contextlib.ExitStack,
    redis_url: str,
    workdir: Path,
    wrk: str | None,
    plan: Plan,
    how: str,
    workers: int,
) -> tuple[list[Row], Groupbuy, list[Server], dict[str, list[Trial]]]:
    """Interleaved rounds of groupbuy's flash grab and the bare endpoint (and, on 1 worker,
    groupbuy's lock storm): their rows and comparisons, the groupbuy server (still
    running) and every server's trials."""
    n = f"{workers} worker{'s' if workers > 1 else ''}"
    notes = _notes(how, workers, plan.round_s)
    uv = stack.enter_context(_groupbuy("uvicorn", redis_url, workdir, workers, f"u{workers}"))
    args, env, port = bare_command(redis_url, workers)
    bare = stack.enter_context(serve(args, env, port, workdir / f"bare-w{workers}.log"))
    servers = [uv.server, bare]
    contenders = {
        GRAB: _groupbuy_trial(_flash_grab, uv, wrk, plan.round_s),
        BARE: _bare_trial(bare, wrk, plan.round_s),
    }
    if workers == 1:
        contenders[STORM] = _groupbuy_trial(_lock_storm, uv, wrk, plan.round_s)
    _say(f"{n}: {', '.join(contenders)}; {plan.rounds} rounds")
    trials = run_sync(contenders, plan.rounds, between=lambda: wait_idle(servers), say=_say)
    mine = [_rounds_row("flash_grab", f"groupbuy ({n})", trials[GRAB], notes["flash_grab"])]
    if workers == 1:
        mine.append(
            _rounds_row("lock_storm", f"groupbuy ({n})", trials[STORM], notes["lock_storm"])
        )
    row = _rounds_row("flash_grab", f"bare starlette + 1 redis call ({n})", trials[BARE],
                      notes["bare"])  # fmt: skip
    bare_rows = [row, {**row, "scenario": "lock_storm"}, {**row, "scenario": "mixed"}]
    _log_errors(bare_rows, bare)
    to_bare = "/ bare Starlette + one Redis call (interleaved)"
    target = 1.0 if workers == 1 else 0.7
    comparisons = [comparison(f"http_grab_vs_bare_{workers}", f"HTTP grab, {n} {to_bare}",
                              trials[GRAB], trials[BARE], target)]  # fmt: skip
    if workers == 1:
        comparisons.append(comparison("http_lock_vs_bare_1", f"HTTP lock storm, {n} {to_bare}",
                                      trials[STORM], trials[BARE], 0.7))  # fmt: skip
    return [*mine, *bare_rows, *comparisons], uv, servers, trials


def _one_worker(redis_url: str, workdir: Path, wrk: str | None, plan: Plan, how: str) -> list[Row]:
    """Interleaved rounds on 1 worker, the mixed load, then the open-loop rows."""
    with contextlib.ExitStack() as stack:
        rows, uv, servers, trials = _against_bare(stack, redis_url, workdir, wrk, plan, how, 1)
        wait_idle(servers)
        _say("1 worker: mixed")
        result, correct = _mixed(uv, wrk, plan.single_s, "u1")
        note = _notes(how, 1, plan.single_s)["mixed"]
        mixed = _single_row("mixed", "groupbuy (1 worker)", result, correct, note)
        grab_max = statistics.median(t.rate for t in trials[GRAB])
        notes = _notes(how, 1, plan.round_s)
        open_loop = _open_loop_rows(uv, wrk, plan, servers, grab_max, notes)
        _log_errors([*rows[:2], mixed, *open_loop], uv.server)
        # the published order: groupbuy's rows, the bare rows, the comparisons
        return [*rows[:2], mixed, *rows[2:], *open_loop]


def _redis_line(server: Server) -> str:
    """What `groupbuy serve` said about its Redis at start-up."""
    for line in server.log.read_text(errors="replace").splitlines():
        if line.strip().startswith("redis:"):
            return line.split(":", 1)[1].strip()
    return "?"


def _embedded(redis_url: str, workdir: Path, wrk: str | None, plan: Plan, how: str) -> list[Row]:
    """The flash grab on the embedded default (`groupbuy serve` with no Redis URL: its own
    engine on a Unix socket, append-only file fsynced before every answer) against the same
    service on the private redis-server (TCP, no persistence), alternated round by round."""
    notes = _notes(how, 1, plan.round_s)
    with contextlib.ExitStack() as stack:
        paired = stack.enter_context(_groupbuy("uvicorn", redis_url, workdir, 1, "r1"))
        embedded = stack.enter_context(_groupbuy("uvicorn", "", workdir, 1, "e1"))
        servers = [paired.server, embedded.server]
        contenders = {
            "groupbuy flash grab, redis-server": _groupbuy_trial(
                _flash_grab, paired, wrk, plan.round_s
            ),
            "groupbuy flash grab, embedded": _groupbuy_trial(
                _flash_grab, embedded, wrk, plan.round_s
            ),
        }
        _say(f"1 worker, embedded engine against redis-server; {plan.rounds} rounds")
        trials = run_sync(contenders, plan.rounds, between=lambda: wait_idle(servers), say=_say)
        engine = _redis_line(embedded.server)
        mine = _rounds_row(
            "flash_grab",
            "groupbuy (1 worker, embedded engine)",
            trials["groupbuy flash grab, embedded"],
            f"{notes['flash_grab']}; no Redis URL: {engine}",
        )
        base = _rounds_row(
            "flash_grab",
            "groupbuy (1 worker, redis-server beside the embedded engine)",
            trials["groupbuy flash grab, redis-server"],
            f"{notes['flash_grab']}; the benchmark's private {server_binary() or 'server'} on "
            "loopback TCP, no persistence",
        )
        _log_errors([mine], embedded.server)
        _log_errors([base], paired.server)
    return [
        mine,
        base,
        comparison(
            "http_grab_embedded_vs_redis_1",
            "HTTP grab, 1 worker: embedded engine (Unix socket, AOF fsync always) / "
            "redis-server (TCP, no persistence) (interleaved)",
            trials["groupbuy flash grab, embedded"],
            trials["groupbuy flash grab, redis-server"],
            0.9,
        ),
    ]


def _two_workers(redis_url: str, workdir: Path, wrk: str | None, plan: Plan, how: str) -> list[Row]:
    """Interleaved flash-grab rounds on 2 workers (groupbuy, bare), then the lock
    storm and the mixed load once each."""
    with contextlib.ExitStack() as stack:
        rows, uv, servers, _ = _against_bare(stack, redis_url, workdir, wrk, plan, how, 2)
        notes = _notes(how, 2, plan.single_s)
        single = []
        for name, scenario in (("lock_storm", _lock_storm), ("mixed", _mixed)):
            wait_idle(servers)
            _say(f"2 workers: {name}")
            result, correct = scenario(uv, wrk, plan.single_s, "u2")
            single.append(_single_row(name, "groupbuy (2 workers)", result, correct, notes[name]))
        _log_errors([rows[0], *single], uv.server)
        return [rows[0], *single, *rows[1:]]


_BEGAN = [time.monotonic()]


def _say(message: str) -> None:
    """One progress line, with the time since the HTTP level began."""
    print(f"[http] {message} ({time.monotonic() - _BEGAN[0]:.0f} s so far)", flush=True)


# -- open loop ------------------------------------------------------------------------


def _open_loop(url: str, rate: float, seconds: int, tag: str, mode: str, *params: str) -> Any:
    """benchmarks/openloop.py in its own process (so it does not share this one's heap)."""
    args = [sys.executable, "-m", "benchmarks.openloop", url, f"{rate:.1f}", str(seconds)]
    args += [str(OPEN_LOOP_CONNECTIONS), tag, mode, SERVICE_KEY, *params]
    done = subprocess.run(
        args, cwd=REPO, capture_output=True, text=True, timeout=seconds + 120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"open-loop generator failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _open_loop_rows(
    target: Groupbuy,
    wrk: str | None,
    plan: Plan,
    servers: list[Server],
    grab_max: float,
    notes: dict[str, str],
) -> list[Row]:
    """Grabs and seat locks offered at half and 80% of their closed-loop rates on 1 worker."""
    wait_idle(servers)
    _say("1 worker: seat locks, closed loop (the maximum for the open loop)")
    result, correct = _seat_locks(target, wrk, plan.round_s, "u1")
    locks = _single_row("seat_locks", "groupbuy (1 worker)", result, correct, notes["seat_locks"])
    rows = [locks]
    for fraction in OPEN_LOOP_FRACTIONS:
        for kind, max_rate in (("grab", grab_max), ("lock", float(locks["ops_per_s"]))):
            wait_idle(servers)
            rows.append(_open_loop_row(target, plan, kind, max_rate, fraction))
    return rows


def _open_loop_row(
    target: Groupbuy, plan: Plan, kind: str, max_rate: float, fraction: float
) -> Row:
    rate, seconds = max_rate * fraction, plan.open_loop_s
    total = int(rate * seconds)
    tag = f"{target.tag}-{kind}{int(fraction * 100)}"
    label = "half" if fraction == 0.5 else f"{fraction:.0%}"
    _say(f"1 worker: {kind}s offered at {rate:,.0f}/s ({label} of max)")
    client = target.client
    if kind == "grab":
        ids = [f"ol-{tag}-{i}" for i in range(math.ceil(total / SHARES) + 1)]
        _send_packets(client, tag, ids, PACKET_CENTS, SHARES)
        result = _open_loop(target.server.url, rate, seconds, tag, "grab", *ids)
        idle_after_s = target.settle()
        checks = _packet_checks(client, ids)
        answered = sum(result["statuses"].values())
        correct: dict[str, Any] = {
            "seconds_to_idle_after_load": idle_after_s,
            **checks,
            "grabbed_answers": result["grabbed"],
            "already_grabbed_answers": result["already"],
            "ok": bool(
                checks["grabs_recorded"] == result["grabbed"]
                and checks["packets_inconsistent"] == 0
                and checks["packets_sold_out"] == 0
                and result["grabbed"] + result["already"] == answered == result["requests"]
            ),
        }
        workload = "POST /v1/redpackets/{id}/grab, new users round-robin over packets, every "
        workload += "20th request a double tap"
        max_from = "the 1-worker flash grab (median of its rounds)"
    else:
        activity = f"ol-{tag}"
        teams = math.ceil(total / SEATS_USED) + 1
        _open_teams(client, [activity], teams, lock_ttl_s=300)
        result = _open_loop(target.server.url, rate, seconds, tag, "lock", activity, str(teams))
        idle_after_s = target.settle()
        checks = _team_checks(client, [activity], teams)
        locked = result["statuses"].get("201", 0)
        correct = {
            "seconds_to_idle_after_load": idle_after_s,
            **checks,
            "ok": bool(
                locked == result["requests"]
                and checks["locks_held_at_end"] == locked
                and checks["teams_overfull"] == 0
                and checks["users_locked_in_two_teams"] == 0
            ),
        }
        workload = "POST /v1/activities/{a}/teams/{t}/locks, a new user each request, "
        workload += f"round-robin over {teams} teams (at most {SEATS_USED} locks a team)"
        max_from = "the 1-worker seat_locks row"
    correct.update(
        answers=result["statuses"],
        unanswered=result["unanswered"],
        generator_kept_up=result["generator_kept_up"],
        generator_on_time=result["generator_on_time"],
    )
    generator = {
        k: result[k]
        for k in (
            "offered_per_s",
            "issued_per_s",
            "issue_late_p50_ms",
            "issue_late_p99_ms",
            "waited_for_connection",
            "generator_cpu_share",
            "generator_kept_up",
            "generator_on_time",
            "max_ms",
        )
    }
    note = (
        f"{workload}; offered at {rate:,.0f}/s ({label} of {max_from}, {max_rate:,.0f}/s) for "
        f"{seconds} s, open loop over {OPEN_LOOP_CONNECTIONS} keep-alive connections "
        "(benchmarks/openloop.py, one process); latency from when each request was due; "
        f"the generator issued {result['issued_per_s']:,.0f}/s, noticed requests "
        f"{result['issue_late_p99_ms']} ms late at p99 (counted in the latency), used "
        f"{result['generator_cpu_share']:.0%} of a core"
    )
    if not result["generator_kept_up"]:
        note += "; THE GENERATOR FELL BEHIND (issued under 95% of the rate): the service saw less"
        note += " load than this row says"
    elif not result["generator_on_time"]:
        note += "; the generator was short of CPU (requests noticed over 5 ms late at p99): its"
        note += " delays are part of these latencies"
    row = result_row(
        f"{kind} @ {label} max rate",
        "http",
        "groupbuy (1 worker)",
        result["answered"],
        float(seconds),
        (result["p50_ms"], result["p95_ms"], result["p99_ms"]),
        correct,
        note,
        latencies_ms=result["latencies_ms"],
        offered_fraction=fraction,
        generator=generator,
    )
    _say(
        f"  p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  generator kept up "
        f"{result['generator_kept_up']}, on time {result['generator_on_time']}  ok {correct['ok']}"
    )
    return row


PARTS = ("1 worker", "embedded", "2 workers")


def run_http(
    redis_url: str, workdir: Path, quick: bool, parts: tuple[str, ...] = PARTS
) -> list[dict[str, Any]]:
    """Rows (and comparison rows) for groupbuy serve and the bare baseline, and
    for the embedded default against redis-server (the `parts` of PARTS asked for)."""
    workdir.mkdir(parents=True, exist_ok=True)
    wrk = _ensure_wrk()
    plan = QUICK if quick else FULL
    how = f"wrk -t{THREADS} -c{CONNECTIONS}"
    flush = redis.Redis.from_url(redis_url)
    rows: list[dict[str, Any]] = []
    _BEGAN[0] = time.monotonic()
    try:
        for part, run in zip(PARTS, (_one_worker, _embedded, _two_workers), strict=True):
            if part in parts:
                flush.flushall()
                rows += run(redis_url, workdir, wrk, plan, how)
    finally:
        flush.close()
    return rows


def _main() -> None:
    parser = argparse.ArgumentParser(description="The HTTP level alone (a quick run).")
    parser.add_argument("--full", action="store_true", help="the full run's rounds and durations")
    parser.add_argument("--part", choices=PARTS, action="append", help="only these parts")
    args = parser.parse_args()
    server = start_redis()
    workdir = Path(tempfile.mkdtemp(prefix="groupbuy-http-"))
    try:
        began = time.monotonic()
        rows = run_http(server.url, workdir, not args.full, tuple(args.part or PARTS))
        elapsed = time.monotonic() - began
    finally:
        server.stop()
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "latencies_ms"}))
    print()
    print(f"{'scenario':<22} {'implementation':<42} {'ops/s':>9} {'p50':>7} {'p99':>7}  ok")
    for r in rows:
        if "comparison" in r:
            print(f"  {r['what']}: median {r['median']} ({r['min']}-{r['max']})")
            continue
        print(
            f"{r['scenario']:<22} {r['implementation']:<42} {r['ops_per_s']:>9,.0f} "
            f"{r['p50_ms'] or 0:>7.2f} {r['p99_ms'] or 0:>7.2f}  {r['correct'].get('ok')}"
        )
    print(f"total {elapsed:.1f} s; logs in {workdir}")


if __name__ == "__main__":
    _main()
