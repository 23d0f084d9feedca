"""What the console and the listings cost: every page's latency on a big database, the HTTP
flash grab with 20 consoles open against none, and the Redis commands pages send
(docs/benchmarking.md says how).

Guards the console's bound: every page within 200 ms at 10,000 activities.

    .venv/bin/python -m benchmarks.console_cost --quick    # about three minutes
    .venv/bin/python -m benchmarks.console_cost --write    # full, into docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.harness import (
    ADMIN_KEY,
    REPO,
    Bench,
    Groupbuy,
    Plan,
    Server,
    Trial,
    comparison,
    groupbuy_command,
    percentile,
    plan_of,
    run_sync,
    serve,
    wait_idle,
)
from benchmarks.http_level import flash_grab, wrk_trial
from groupbuy.services import build_services, running
from groupbuy.settings import load_settings
from tests.support.console import csrf_of
from tests.support.console_seed import FULL, QUICK, Scale, Seeded, pages, seed
from tests.support.servers import start_redis

DOCS = REPO / "docs"
CONSOLES = 20
POLL_S = 10.0  # a console page that polls reloads every 10 s (docs/console.md)
DEEP_PAGES = 20  # pages followed (of 100 rows) before a deep cursor page is timed
TARGET = 0.95
SCANS = ("keys", "scan", "hscan", "sscan", "zscan")


GRAB_FULL, GRAB_QUICK = Plan(rounds=8, round_s=3), Plan(rounds=2, round_s=2)


def _session(url: str) -> httpx.Cookies:
    """The cookies of a console session of its own."""
    with contextlib.closing(signed_in(url)) as client:
        return client.cookies


def signed_in(url: str) -> httpx.Client:
    """A client holding an admin's console session and sending the admin key to the API."""
    client = httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60
    )
    form = client.get("/console/signin").raise_for_status()
    answer = client.post(
        "/console/signin",
        data={"key": ADMIN_KEY, "csrf": csrf_of(form.text), "next": "/console"},
        follow_redirects=False,
    )
    if answer.status_code != 303:
        raise RuntimeError(f"console sign-in answered {answer.status_code}: {answer.text[:200]}")
    return client


def _deep(client: httpx.Client, path: str, key: str) -> str | None:
    """`path` at the cursor reached after DEEP_PAGES pages, or None when the listing ends
    sooner."""
    at = path
    for _ in range(DEEP_PAGES):
        cursor = client.get(at).raise_for_status().json().get(key)
        if cursor is None:
            return None
        at = f"{path}{'&' if '?' in path else '?'}cursor={cursor}"
    return at


def time_pages(client: httpx.Client, seeded: Seeded, requests: int) -> list[dict[str, Any]]:
    """p50 and p99 of `requests` sequential GETs of every page that exists."""
    rows = []
    for path, cursor_key in pages(seeded):
        target = _deep(client, path, cursor_key) if cursor_key else path
        if target is None:
            print(f"  {path}: fewer than {DEEP_PAGES} pages, no deep page")
            continue
        first = client.get(target)
        if first.status_code == 404 and target.startswith("/console/"):
            print(f"  {target}: not served here (404), skipped")
            continue
        first.raise_for_status()
        took = []
        for _ in range(requests):
            began = time.perf_counter()
            client.get(target).raise_for_status()
            took.append(time.perf_counter() - began)
        took.sort()
        row = {
            "path": target if len(target) < 90 else target[:87] + "...",
            "ops": requests,
            "p50_ms": round(statistics.median(took) * 1000, 2),
            "p99_ms": percentile(took, 0.99),
            "load_1m": round(os.getloadavg()[0], 2),
        }
        print(f"  {row['path']:<80} p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms")
        rows.append(row)
    return rows


def command_counts(url: str) -> dict[str, int]:
    """Calls of each Redis command so far (INFO commandstats)."""
    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def counts_in_redis(url: str, keys: tuple[str, ...]) -> int:
    """How many of the activities' live-counts hashes Redis holds (one pipeline of HEXISTS,
    no scan)."""
    with redis.Redis.from_url(url) as client, client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hexists(key, "counted")
        return sum(bool(there) for there in pipe.execute())


# -- open consoles ----------------------------------------------------------------------


class Consoles:
    """Open console pages in a thread of their own, each signed in on its own: each loads
    its page, holds its live stream and reloads the page every POLL_S; `ready` once every
    stream has pushed once."""

    def __init__(self, url: str, watched: list[tuple[str, str]]) -> None:
        self.url, self.watched = url, watched
        # One session each, as operators at their own screens: the product caps the live
        # streams one session may hold ([console] live_connections_per_session).
        self.cookies = [_session(url) for _ in watched]
        self.updates = 0
        self.failures = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _console(self, cookies: httpx.Cookies, page: str, live: str, first: Any) -> None:
        assert self._stop is not None
        timeout = httpx.Timeout(30, read=None)
        async with httpx.AsyncClient(base_url=self.url, cookies=cookies, timeout=timeout) as client:
            (await client.get(page)).raise_for_status()
            async with client.stream("GET", live) as stream:
                stream.raise_for_status()
                last_load = time.monotonic()
                async for line in stream.aiter_lines():
                    if line.startswith('data: {"'):
                        self.updates += 1
                        first.set()
                    if time.monotonic() - last_load >= POLL_S:
                        (await client.get(page)).raise_for_status()
                        last_load = time.monotonic()
                    if self._stop.is_set():
                        return

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        firsts = [asyncio.Event() for _ in self.watched]
        tasks = [
            asyncio.create_task(self._console(cookies, page, live, first))
            for (page, live), cookies, first in zip(self.watched, self.cookies, firsts, strict=True)
        ]
        waiting = asyncio.gather(*(f.wait() for f in firsts))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiting, 30)
        self._ready.set()
        await self._stop.wait()
        for task in tasks:
            task.cancel()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, Exception):
                self.failures += 1

    def __enter__(self) -> Consoles:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the consoles did not open in 60 s")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def watched_pages(seeded: Seeded) -> list[tuple[str, str]]:
    """(page, its live stream) of each of the CONSOLES open consoles."""
    overview = ("/console", "/console/live?page=overview")
    aid, pid = seeded.live_activity, seeded.active_packet
    activity = (f"/console/activities/{aid}", f"/console/live?page=activity&id={aid}")
    packet = (f"/console/redpackets/{pid}", f"/console/live?page=packet&id={pid}")
    half, quarter = CONSOLES // 2, CONSOLES // 4
    return [overview] * half + [activity] * quarter + [packet] * (CONSOLES - half - quarter)


def grab_rounds(target: Groupbuy, seeded: Seeded, plan: Plan) -> Any:
    """The flash grab with no console and with CONSOLES open, alternated round by round."""
    loads: list[float] = []
    opened: list[int] = []

    def trial(index: int, watching: bool) -> Trial:
        seconds = plan.round_s if index else 1
        loads.append(round(os.getloadavg()[0], 2))
        if not watching:
            return wrk_trial(*flash_grab(target, seconds, f"n{index}"))
        with Consoles(target.server.url, watched_pages(seeded)) as consoles:
            measured = wrk_trial(*flash_grab(target, seconds, f"c{index}"))
        opened.append(consoles.updates)
        if consoles.failures:
            raise RuntimeError(f"{consoles.failures} console(s) failed during round {index}")
        return measured

    contenders = {"none": partial(trial, watching=False), "consoles": partial(trial, watching=True)}
    trials = run_sync(contenders, plan.rounds, between=lambda: wait_idle([target.server]))
    compared = comparison(
        "http_grab_consoles_vs_none",
        f"HTTP grab, 1 worker: {CONSOLES} consoles open / none",
        trials["consoles"],
        trials["none"],
        TARGET,
        percent=True,
    )
    return {
        "consoles": CONSOLES,
        "comparison": compared,
        "rates": {name: [round(t.rate) for t in ts] for name, ts in trials.items()},
        "loads_1m": loads,
        "live_updates": opened,
        "how": f"Wrk load, rounds of {plan.round_s} s; "
        f"each console holds its live stream and reloads its page every {POLL_S:.0f} s.",
        "ok": all(t.correct.get("ok", False) for ts in trials.values() for t in ts),
    }


# -- the run ----------------------------------------------------------------------------


@contextlib.contextmanager
def seeded_server(redis_url: str, workdir: Path, scale: Scale) -> Iterator[tuple[Server, Seeded]]:
    """A seeded database (and its Redis state) served by one `groupbuy serve` worker."""
    args, env, port = groupbuy_command(redis_url, workdir, 1, "console")
    config = REPO / "config.toml"
    settings = load_settings(config if config.is_file() else None, env)

    async def fill() -> Seeded:
        async with running(build_services(settings), scheduler=False) as services:
            return await seed(services, scale)

    began = time.monotonic()
    seeded = asyncio.run(fill())
    print(f"  seeded in {time.monotonic() - began:.0f} s")
    with serve(args, env, port, workdir / "groupbuy-console.log") as server:
        yield server, seeded


def run_console_cost(bench: Bench, command: str) -> dict[str, Any]:
    """Seed, serve, time the pages, count the Redis commands, run the grab rounds."""
    plan, scale = plan_of(bench, GRAB_FULL, GRAB_QUICK), QUICK if bench.quick else FULL
    requests, redis_url = 20 if bench.quick else 100, bench.redis_url
    with (
        seeded_server(redis_url, bench.workdir, scale) as (server, seeded),
        contextlib.closing(signed_in(server.url)) as client,
    ):
        wait_idle([server])
        counted_before = counts_in_redis(redis_url, seeded.counts_keys)
        if counted_before != len(seeded.counts_keys):
            raise RuntimeError(
                f"only {counted_before} of {len(seeded.counts_keys)} activities have live "
                "counts in Redis: the pages would be timed putting them back from SQL"
            )
        before = command_counts(redis_url)
        page_rows = time_pages(client, seeded, requests)
        after = command_counts(redis_url)
        counted_after = counts_in_redis(redis_url, seeded.counts_keys)
        print(f"  live counts in Redis: {counted_before} before the pages, {counted_after} after")
        calls = {n: after[n] - before.get(n, 0) for n in after if after[n] != before.get(n)}
        target = Groupbuy(server, client, "console")
        grab = grab_rounds(target, seeded, plan)
        errors = server.log_errors()
    return {
        "meta": {
            "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} cores",
            "seeded": f"{scale.activities:,} activities ({scale.live_activities} with open "
            f"teams in Redis), {scale.packets:,} packets ({scale.active_packets} active), "
            f"{scale.senders} senders, {scale.events:,} events, {scale.audit:,} audit rows",
            "requests": requests,
            "counts_in_redis": f"{counted_before:,} of {len(seeded.counts_keys):,} activities' "
            f"live counts in Redis before the pages, {counted_after:,} after",
            "server_log_errors": errors,
        },
        "pages": page_rows,
        "grab": grab,
        "redis_commands": {
            "total": sum(calls.values()),
            "scans": sum(calls.get(name, 0) for name in SCANS),
            "by_command": calls,
        },
    }


# -- the report ---------------------------------------------------------------------------

BEGIN = "<!-- console-cost: begin (benchmarks/console_cost.py) -->"
END = "<!-- console-cost: end -->"
BOUND_MS = 200.0


def section(console: dict[str, Any]) -> str:
    """The Markdown of one console run: pages and listings, the grab with consoles open,
    and the Redis commands the page loads sent."""
    meta = console["meta"]
    counted = f" ({meta['counts_in_redis']})" if meta.get("counts_in_redis") else ""
    lines = [
        BEGIN,
        "## Console and listings",
        "",
        f"`{meta['command']}` on {meta['machine']}, {meta['date']}: {meta['seeded']}. "
        "One `groupbuy serve` worker, signed in with an admin key; each page is asked "
        f"{meta['requests']} times in a row{counted}. Target: p99 within {BOUND_MS:.0f} ms "
        "([benchmarks-findings.md](benchmarks-findings.md#the-recorded-run-against-the-targets)). "
        "The load average (1 min) is the machine's when the figure "
        "was taken: the machine is shared.",
        "",
        "| page | requests | p50 ms | p99 ms | within 200 ms | load |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in console["pages"]:
        p50, p99 = (f"{row[k]:,.1f}" if row[k] is not None else "–" for k in ("p50_ms", "p99_ms"))
        met = row["p99_ms"] is not None and row["p99_ms"] <= BOUND_MS
        lines.append(f"| `{row['path']}` | {row['ops']} | {p50} | {p99} "
                     f"| {'yes' if met else 'no'} | {row['load_1m']:.2f} |")  # fmt: skip
    if grab := console.get("grab"):
        c, loads = grab["comparison"], ", ".join(f"{x:.2f}" for x in grab["loads_1m"])
        lines += [
            "",
            f"HTTP flash grab (wrk, as the HTTP level) with {grab['consoles']} consoles open "
            f"/ with none, {c['rounds']} alternated rounds: median ratio "
            f"**{c['median']:.0%}** (lowest {c['min']:.0%}, highest {c['max']:.0%}); target "
            f">= {c['target_min']:.0%}: {'met' if c['met'] else 'not met'}. "
            f"{grab['how']} Rates (grabs/s): none {grab['rates']['none']}, "
            f"with consoles {grab['rates']['consoles']}; load at each round: {loads}.",
        ]
    redis = console["redis_commands"]
    lines += [
        "",
        f"Redis commands while the pages were asked: {redis['total']} in all; scans "
        f"(`KEYS`, `SCAN`, `HSCAN`, `SSCAN`, `ZSCAN`): {redis['scans']}.",
        END,
    ]
    return "\n".join(lines)


def write(docs: Path, console: dict[str, Any]) -> None:
    """Keep `console` in docs/benchmarks.json and replace only its section of
    docs/benchmarks.md (or add it at the end): the rest is another run's figures."""
    saved_path = docs / "benchmarks.json"
    saved = json.loads(saved_path.read_text("utf-8")) if saved_path.exists() else {"rows": []}
    saved["console"] = console
    saved_path.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    report = docs / "benchmarks.md"
    markdown = report.read_text("utf-8") if report.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    text = section(console)
    if pattern.search(markdown):
        markdown = pattern.sub(lambda _: text, markdown)
    else:
        markdown = markdown.rstrip("\n") + "\n\n" + text + "\n"
    report.write_text(markdown, encoding="utf-8")


def main() -> None:
    """Run alone; with --write, into docs/benchmarks.json and its section of benchmarks.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds")
    parser.add_argument("--write", action="store_true", help="record in docs/benchmarks.md")
    args = parser.parse_args()
    command = ".venv/bin/python -m benchmarks.console_cost" + (" --quick" if args.quick else "")
    server = start_redis()
    try:
        with tempfile.TemporaryDirectory(prefix="groupbuy-console-") as workdir:
            result = run_console_cost(Bench(server.url, Path(workdir), args.quick), command)
    finally:
        server.stop()
    c = result["grab"]["comparison"]
    print(
        f"grab with {CONSOLES} consoles / none: {c['median']:.1%} ({c['min']:.1%}–{c['max']:.1%})"
    )
    print(f"redis commands during the pages: {result['redis_commands']}")
    if args.write:
        write(DOCS, result)
        print(f"written: {DOCS / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
