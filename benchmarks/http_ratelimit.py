"""The cost of rate limits on the grab path: the HTTP flash grab through `groupbuy serve`
(1 worker) with `[ratelimit]` on (the defaults: each grab first waits for one script call
taking from its API key's bucket and its user's) and off, side by side on the same
redis-server.

Both servers run at once (own key prefixes and SQLite files) and are measured in
alternation, round after round, each round started with both idle
(benchmarks/interleave.py); the figure is the median of the same-round ratios of their
rates, on/off. Target: the limits cost at most 10% of the grab path (ratio >= 0.90). The
load is benchmarks/http_level.py's flash grab (wrk, distinct users, every 20th request a
double tap, all through one API key): no request may be refused, so the row's
correctness counts also show that the default limits do not throttle a flash sale.

    .venv/bin/python -m benchmarks.http_ratelimit            # 5 rounds of 3 s (~1 min)
    .venv/bin/python -m benchmarks.http_ratelimit --quick    # 2 rounds of 2 s
    .venv/bin/python -m benchmarks.http_ratelimit --rounds 9 # a steadier median
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from benchmarks.http_level import (
    CONNECTIONS,
    FULL,
    QUICK,
    THREADS,
    Plan,
    _ensure_wrk,
    _flash_grab,
    _groupbuy,
    _groupbuy_trial,
    _log_errors,
    _notes,
    _rounds_row,
    _say,
)
from benchmarks.interleave import Trial, comparison, run_sync
from benchmarks.measure import Row
from benchmarks.servers import Server, cpu_seconds, wait_idle
from groupbuy.settings import RateLimitSettings
from tests.support.servers import start_redis

TARGET = 0.90  # rate with limits on / rate with them off, at least
ON, OFF = "grab, rate limits on", "grab, rate limits off"


def _default_limits() -> dict[str, str]:
    """GROUPBUY_RATELIMIT_* at the built-in defaults (benchmarks/servers.py raises the
    per-user quotas for the other scenarios; this pair measures the shipped settings)."""
    defaults = RateLimitSettings()
    return {
        f"GROUPBUY_RATELIMIT_{name.upper()}": str(value).lower()
        for name, value in defaults.model_dump().items()
    }


def _with_cpu(trial: Callable[[int], Trial], server: Server) -> Callable[[int], Trial]:
    """The trial, also counting the CPU seconds its server used (its own set-up, the load,
    the write-behind and the checks after it: the same work for both contenders but for
    the limits). CPU per request hardly moves when other processes share the machine,
    where requests per second does."""

    def run(index: int) -> Trial:
        before = cpu_seconds(server)
        measured = trial(index)
        measured.correct["server_cpu_s"] = round(cpu_seconds(server) - before, 3)
        return measured

    return run


def _per_cpu(trials: list[Trial]) -> list[Trial]:
    """Each round as requests per CPU second of its server (the inverse of CPU per request)."""
    return [Trial(t.ops, t.correct["server_cpu_s"], t.correct) for t in trials]


def run_ratelimit_http(redis_url: str, workdir: Path, plan: Plan) -> list[Row]:
    """The flash grab with limits on and off, alternated; their rows and the ratios."""
    wrk = _ensure_wrk()
    how = f"wrk -t{THREADS} -c{CONNECTIONS}" if wrk else "httpx load in-process (no wrk)"
    note = _notes(how, 1, plan.round_s)["flash_grab"]
    limits = _default_limits()
    with contextlib.ExitStack() as stack:
        on = stack.enter_context(_groupbuy("uvicorn", redis_url, workdir, 1, "rl1", **limits))
        off = stack.enter_context(
            _groupbuy(
                "uvicorn",
                redis_url,
                workdir,
                1,
                "rl0",
                **{**limits, "GROUPBUY_RATELIMIT_ENABLED": "false"},
            )
        )
        servers = [on.server, off.server]
        contenders = {
            ON: _with_cpu(_groupbuy_trial(_flash_grab, on, wrk, plan.round_s), on.server),
            OFF: _with_cpu(_groupbuy_trial(_flash_grab, off, wrk, plan.round_s), off.server),
        }
        _say(f"rate limits: {', '.join(contenders)}; {plan.rounds} rounds")
        trials = run_sync(contenders, plan.rounds, between=lambda: wait_idle(servers), say=_say)
        rows = [
            _rounds_row(
                "flash_grab",
                "groupbuy (1 worker, rate limits on)",
                trials[ON],
                f"{note}; [ratelimit] at its defaults: each grab first takes from the key's "
                "and the user's bucket in one script call",
            ),
            _rounds_row(
                "flash_grab",
                "groupbuy (1 worker, rate limits off)",
                trials[OFF],
                f"{note}; [ratelimit] enabled = false",
            ),
        ]
        _log_errors(rows[:1], on.server)
        _log_errors(rows[1:], off.server)
    for row in rows:
        correct = row["correct"]
        correct["rate_limited"] = correct.get("answers", {}).get("4xx", 0)
        correct["server_cpu_us_per_request"] = round(correct["server_cpu_s"] / row["ops"] * 1e6, 1)
    rows.append(
        comparison(
            "http_grab_ratelimit_on_vs_off",
            "HTTP grab, 1 worker: rate limits on / off (interleaved)",
            trials[ON],
            trials[OFF],
            TARGET,
            percent=True,
        )
    )
    rows.append(
        comparison(
            "http_grab_ratelimit_cpu_on_vs_off",
            "HTTP grab, 1 worker: requests per server CPU second, rate limits on / off "
            "(interleaved)",
            _per_cpu(trials[ON]),
            _per_cpu(trials[OFF]),
            TARGET,
            percent=True,
        )
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 s")
    parser.add_argument("--rounds", type=int, help="rounds of each contender (default 5)")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = dataclasses.replace(plan, rounds=args.rounds)
    server = start_redis()
    workdir = Path(tempfile.mkdtemp(prefix="groupbuy-ratelimit-"))
    began = time.monotonic()
    try:
        redis.Redis.from_url(server.url).flushall()
        rows = run_ratelimit_http(server.url, workdir, plan)
    finally:
        server.stop()
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "latencies_ms"}, default=str))
    print()
    for r in rows:
        if "comparison" in r:
            print(
                f"{r['what']}: median {r['median']:.1%} (rounds {r['min']:.1%}-{r['max']:.1%}; "
                f"target >= {TARGET:.0%}: {'met' if r['met'] else 'not met'})"
            )
            continue
        print(
            f"{r['implementation']:<40} {r['ops_per_s']:>9,.0f}/s  p50 {r['p50_ms']:.2f} ms  "
            f"p99 {r['p99_ms']:.2f} ms  ok {r['correct'].get('ok')}  "
            f"429s {r['correct']['rate_limited']}  "
            f"server CPU {r['correct']['server_cpu_us_per_request']} µs/request"
        )
    print(f"total {time.monotonic() - began:.0f} s; logs in {workdir}")


if __name__ == "__main__":
    main()
