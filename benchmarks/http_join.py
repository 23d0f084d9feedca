"""The join flash over HTTP: one activity of 1,000 open teams of 3 (the leader alone in
each), 5,000 shoppers each tapping "join any team" once, CONCURRENCY at once, through
`groupbuy serve` (1 worker). A flash whose seats are gone within a second does not fit a
fixed-duration load (wrk), so this is a bounded client run: every shopper once, timed from
the first request to the last answer. Its point is correctness over HTTP (every seat granted
once, no team over-filled, no wrong no_team_available); its rate is the one httpx client
process's on a machine it shares with the server, far below what the service serves (the
engine-level join flash measures that), so it is not part of the recorded run.

    .venv/bin/python -m benchmarks.http_join
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from benchmarks.measure import Row, percentile, result_row
from benchmarks.servers import ADMIN_KEY, groupbuy_command, serve
from groupbuy.testing.joins import Tap, grade_joins
from groupbuy.testing.servers import start_redis

TEAMS = 1_000
SHOPPERS = 5_000
TEAM_SIZE = 3
CONCURRENCY = 64  # keep-alive connections of the one client process


async def _flash(base_url: str, key: str, aid: str) -> tuple[float, list[float], list[Tap]]:
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    taps: list[Tap] = []
    latencies: list[float] = []
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=60
    ) as client:

        async def shopper(user: str) -> None:
            async with gate:
                began = time.perf_counter()
                answer = await client.post(f"/v1/activities/{aid}/locks", json={"user_id": user})
                ended = time.perf_counter()
            latencies.append(ended - began)
            body = answer.json()
            if answer.status_code in (200, 201):
                outcome = "locked" if answer.status_code == 201 else "existing"
                taps.append(Tap(user, outcome, body["team_id"], began, ended))
            else:
                taps.append(Tap(user, str(body.get("code")), None, began, ended))

        began = time.perf_counter()
        await asyncio.gather(*(shopper(f"u{i}") for i in range(SHOPPERS)))
        seconds = time.perf_counter() - began
    return seconds, latencies, taps


def join_flash_http(base_url: str, key: str, tag: str) -> Row:
    """Set up the activity over HTTP, run the flash, check every team afterwards."""
    aid = f"join-{tag}"
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
        client.post("/v1/activities", json={"activity_id": aid, "team_size": TEAM_SIZE})
        for t in range(TEAMS):
            opened = client.post(
                f"/v1/activities/{aid}/teams", json={"leader_id": f"lead-{t}", "team_id": f"t{t}"}
            )
            assert opened.status_code == 201, opened.text
        seconds, latencies, taps = asyncio.run(_flash(base_url, key, aid))
        held = Counter[int]()
        for t in range(TEAMS):
            team = client.get(f"/v1/activities/{aid}/teams/t{t}").json()
            held[len(team["members"]) + len(team["locks"])] += 1
    free = TEAMS * (TEAM_SIZE - 1)
    correct = grade_joins(taps, free, TEAM_SIZE - 1)
    correct["over_capacity"] += sum(n for seats, n in held.items() if seats > TEAM_SIZE)
    correct["winners_ok"] = correct["winners"] == min(free, SHOPPERS)
    ordered = sorted(latencies)
    note = (
        f"1 activity, {TEAMS} open teams of {TEAM_SIZE} (leader only) = {free} free seats, "
        f"{SHOPPERS} shoppers each POSTing /v1/activities/{{aid}}/locks once, {CONCURRENCY} "
        "at once from one httpx client process (a bounded run: the seats are gone within a "
        "second, too short for wrk's fixed duration), so the rate is the client's, not the "
        "server's; groupbuy serve, 1 worker; every team read back over HTTP afterwards for "
        "over_capacity"
    )
    return result_row(
        "join_flash",
        "http",
        "groupbuy (1 worker)",
        len(latencies),
        seconds,
        (percentile(ordered, 0.50), percentile(ordered, 0.95), percentile(ordered, 0.99)),
        correct,
        note,
    )


def _main() -> None:
    server = start_redis()
    workdir = Path(tempfile.mkdtemp(prefix="groupbuy-join-"))
    try:
        args, env, port = groupbuy_command("uvicorn", server.url, workdir, 1, "join")
        with serve(args, env, port, workdir / "groupbuy-join.log") as running:
            row = join_flash_http(running.url, ADMIN_KEY, "j1")
    finally:
        server.stop()
    print(json.dumps({k: v for k, v in row.items() if k != "latencies_ms"}, default=str))


if __name__ == "__main__":
    _main()
