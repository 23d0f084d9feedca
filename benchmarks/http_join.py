"""The join flash over HTTP: one activity of 1,000 open teams of 3 (the leader alone in
each), 5,000 shoppers tapping "join any team" within half a second, through `groupbuy serve`
(1 worker). A flash whose seats are gone within a second does not fit wrk's fixed
duration, so the benchmark's own open-loop generator (benchmarks/openloop.py, raw sockets,
64 keep-alive connections) offers exactly 5,000 requests at 10,000/s and waits for every
answer; latency counts from when each request was due, so queueing behind the flash is in
it. Every team is read back afterwards: no team over-filled, every seat granted once.

    .venv/bin/python -m benchmarks.http_join
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks import openloop
from benchmarks.measure import Row, result_row
from benchmarks.servers import ADMIN_KEY, groupbuy_command, serve
from tests.support.servers import start_redis

TEAMS = 1_000
SHOPPERS = 5_000
TEAM_SIZE = 3
CONNECTIONS = 64
RATE = 10_000.0  # offered per second: the 5,000 taps arrive within half a second


def join_flash_http(base_url: str, key: str, tag: str) -> Row:
    """Set up the activity over HTTP, run the flash, read every team back."""
    aid = f"join-{tag}"
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as client:
        client.post("/v1/activities", json={"activity_id": aid, "team_size": TEAM_SIZE})
        for t in range(TEAMS):
            opened = client.post(
                f"/v1/activities/{aid}/teams", json={"leader_id": f"lead-{t}", "team_id": f"t{t}"}
            )
            assert opened.status_code == 201, opened.text
        build = openloop.request_builder("join", key, tag, [aid])
        result = asyncio.run(openloop.run(base_url, RATE, SHOPPERS / RATE, CONNECTIONS, build))
        held = Counter[int]()
        for t in range(TEAMS):
            team = client.get(f"/v1/activities/{aid}/teams/t{t}").json()
            held[len(team["members"]) + len(team["locks"])] += 1
    free = TEAMS * (TEAM_SIZE - 1)
    statuses = {int(k): v for k, v in result["statuses"].items()}
    granted = statuses.get(201, 0)
    locks_held = sum(n * (seats - 1) for seats, n in held.items())
    correct: dict[str, Any] = {
        "winners": granted,
        "seats": free,
        "locks_held": locks_held,
        "over_capacity": sum(n for seats, n in held.items() if seats > TEAM_SIZE),
        "no_team_available": statuses.get(409, 0),
        "unanswered": result["unanswered"],
        "statuses": statuses,
    }
    correct["winners_ok"] = granted == locks_held == min(free, SHOPPERS)
    correct["ok"] = (
        correct["winners_ok"]
        and correct["over_capacity"] == 0
        and result["unanswered"] == 0
        and set(statuses) <= {201, 409}
    )
    note = (
        f"1 activity, {TEAMS} open teams of {TEAM_SIZE} (leader only) = {free} free seats, "
        f"{SHOPPERS} shoppers each POSTing /v1/activities/{{aid}}/locks once, offered at "
        f"{RATE:,.0f}/s (open loop, {CONNECTIONS} keep-alive connections, latency from when "
        "each was due); groupbuy serve, 1 worker; every team read back over HTTP afterwards; "
        f"the generator issued {result['issued_per_s']:,.0f}/s"
    )
    return result_row(
        "join_flash",
        "http",
        "groupbuy (1 worker)",
        result["answered"],
        result["seconds"],
        (result["p50_ms"], result["p95_ms"], result["p99_ms"]),
        correct,
        note,
    )


def run_join_http(redis_url: str, workdir: Path) -> Row:
    """The join flash against a `groupbuy serve` of its own on this Redis."""
    print("[http]   join flash: 1,000 open teams of 3, 5,000 joins at 10,000/s", flush=True)
    args, env, port = groupbuy_command("uvicorn", redis_url, workdir, 1, "join")
    with serve(args, env, port, workdir / "groupbuy-join.log") as running:
        return join_flash_http(running.url, ADMIN_KEY, "j1")


def _main() -> None:
    server = start_redis()
    try:
        row = run_join_http(server.url, Path(tempfile.mkdtemp(prefix="groupbuy-join-")))
    finally:
        server.stop()
    print(json.dumps({k: v for k, v in row.items() if k != "latencies_ms"}, default=str))


if __name__ == "__main__":
    _main()
