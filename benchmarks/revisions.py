"""Two revisions of the code measured side by side: does a change cost speed?

A refactoring should leave the engine and HTTP figures where they were. This checks out
`--base` (any git revision) into a temporary worktree and runs the same measurement in
that tree and in this one, alternating the order every round (AB, BA, ...). Each round
gives, for every row both trees report, the ratio of this tree's rate to the base's; the
median over the rounds is the figure and the lowest and highest round its spread.
Rows of kind `ratio` compare a trial's own interleaved ratios (the engine against the
seed-style peer in the same seconds, say): the steadiest figures on a drifting machine.

    .venv/bin/python -m benchmarks.revisions --base 3de2ae8 --rounds 3 --level engine

`--level cpu` counts calls per CPU second of the calling process instead (grabs and seat
locks, one at a time, and grabs by 64 callers at once): the Python cost of a call, which a
busy machine barely moves.

Each trial is a fresh process run in its own tree (PYTHONPATH points at it), so both
sides measure themselves with their own harness: the quick engine level
(benchmarks/engine) or the one-worker part of the HTTP level (benchmarks/http_level).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from benchmarks.interleave import rotation

HERE = Path(__file__).resolve().parent.parent

_ENGINE = """
import asyncio, json
from benchmarks.engine.runner import private_redis_and_sqlite, run_engine
with private_redis_and_sqlite() as (redis_url, database_url):
    rows = asyncio.run(run_engine(redis_url, database_url, quick=True))
for row in rows:
    print(json.dumps({k: v for k, v in row.items() if k != "latencies_ms"}, default=str))
"""
# CPU seconds of this process per grab and seat lock on a private Redis: the
# Python cost of a call, which other processes' load barely moves (rates do). Written
# against both shapes of the engines (before and after the split by job) so that any
# two revisions compare.
_CPU = """
import asyncio, json, time
from benchmarks.engine.common import private_redis_and_sqlite, open_services, close_services
CALLS = 2600
async def main(redis_url, database_url):
    s = await open_services(redis_url, database_url)
    packets, teams = s.packets, s.teams
    await getattr(packets, "accounts", packets).deposit("sender", 10**9, "ref")
    await getattr(packets, "sending", packets).send(
        "sender", CALLS * 40, 2 * CALLS + 200, packet_id="pk", expires_in_s=3600
    )
    grabs = getattr(packets, "grabs", packets)
    activities = getattr(teams, "activities", teams)
    seats = getattr(teams, "seats", teams)
    await activities.create_activity("a1", team_size=50, lock_ttl_s=600)
    for t in range(CALLS // 40):
        await activities.open_team("a1", f"L{t}", team_id=f"t{t}")
    for u in range(200):  # warm up: caches, connections, the scripts
        await grabs.grab("pk", f"w{u}")
    started = time.process_time()
    for u in range(CALLS):
        await grabs.grab("pk", f"u{u}")
    grabbed = time.process_time()
    for u in range(CALLS // 40 * 40):
        await seats.lock("a1", f"t{u // 40}", f"m{u}")
    locked = time.process_time()
    users = iter(range(CALLS))
    async def caller():  # one of 64 at once: the pipelined path of a flash grab
        for u in users:
            await grabs.grab("pk", f"c{u}")
    await asyncio.gather(*(caller() for _ in range(64)))
    flashed = time.process_time()
    await close_services(s)
    for name, seconds, calls in (
        ("grab, sequential", grabbed - started, CALLS),
        ("seat lock, sequential", locked - grabbed, CALLS // 40 * 40),
        ("grab, 64 callers", flashed - locked, CALLS),
    ):
        print(json.dumps({"scenario": name, "level": "cpu",
                          "implementation": "calls per CPU second", "ops_per_s": calls / seconds}))
with private_redis_and_sqlite() as (redis_url, database_url):
    asyncio.run(main(redis_url, database_url))
"""
COMMANDS = {
    "cpu": ["-c", _CPU],
    "engine": ["-c", _ENGINE],
    "http": ["-m", "benchmarks.http_level", "--part", "1 worker"],
}

Key = tuple[str, str, str]


def trial(tree: Path, level: str) -> dict[Key, float]:
    """Run one measurement in `tree`: ops/s of each (scenario, level, implementation) row,
    and the median of each interleaved comparison the trial made."""
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, *COMMANDS[level]],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: exit {done.returncode}\n{done.stderr[-3000:]}")
    rates: dict[Key, float] = {}
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if "comparison" in row and row.get("median"):
            # a trial's own interleaved ratio (engine / seed-style peer, say): the machine's
            # drift during the trial cancels out of it
            rates[(str(row["comparison"]), "ratio", "median of the trial's rounds")] = float(
                row["median"]
            )
        elif row.get("ops_per_s"):
            key = (str(row["scenario"]), str(row["level"]), str(row["implementation"]))
            rates.setdefault(key, float(row["ops_per_s"]))  # the first of repeated names
    return rates


def compare(base: Path, head: Path, level: str, rounds: int) -> dict[Key, list[float]]:
    """Per-round ratios head/base of every row both trees report."""
    ratios: dict[Key, list[float]] = defaultdict(list)
    trees = {"base": base, "head": head}
    for index in range(rounds):
        rates = {}
        for name in rotation(list(trees), index):
            print(f"[revisions] round {index + 1}/{rounds}: {name} ({level})", flush=True)
            try:
                rates[name] = trial(trees[name], level)
            except RuntimeError as failed:  # said, and the round left out of the figures
                print(f"[revisions] round {index + 1} left out: {failed}", flush=True)
                break
        if len(rates) < len(trees):
            continue
        for key in rates["base"].keys() & rates["head"].keys():
            ratios[key].append(rates["head"][key] / rates["base"][key])
    return ratios


def report(ratios: dict[Key, list[float]]) -> list[str]:
    """One line per row: the median ratio, the lowest and highest round."""
    lines = []
    for (scenario, level, implementation), found in sorted(ratios.items()):
        lines.append(
            f"{scenario:<20} {level:<7} {implementation:<40} "
            f"{statistics.median(found):.2f}x ({min(found):.2f}-{max(found):.2f}, "
            f"{len(found)} rounds)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--level", choices=sorted(COMMANDS), action="append")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="groupbuy-base-") as scratch:
        base = Path(scratch) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base), args.base],
            cwd=HERE,
            check=True,
            capture_output=True,
        )
        try:
            for level in args.level or sorted(COMMANDS):
                lines = report(compare(base, HERE, level, args.rounds))
                print(f"== {level}: this tree / {args.base}, ops/s")
                print("\n".join(lines))
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(base)], cwd=HERE, check=False
            )


if __name__ == "__main__":
    main()
