"""The cost of the key-guessing throttle on the grab path: the HTTP flash grab through
`groupbuy serve` (1 worker) with `[auth] guess_limit` at its default (each keyed request
first reads its address's failure count in Redis) and off (`guess_limit = 0`), side by
side on the same redis-server, alternated round after round (benchmarks/interleave.py).

Besides the rate, each round records the server's CPU and Redis's time (INFO
commandstats, summed over commands) per request: the throttle's read is one more script
call a request.

    .venv/bin/python -m benchmarks.http_guessing            # 5 rounds of 3 s
    .venv/bin/python -m benchmarks.http_guessing --quick    # 2 rounds of 2 s
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import redis

from benchmarks.http_level import FULL, QUICK, _ensure_wrk, _flash_grab, _groupbuy, _groupbuy_trial
from benchmarks.http_ratelimit import _with_cpu
from benchmarks.interleave import Trial, comparison, run_sync
from benchmarks.servers import wait_idle
from tests.support.servers import start_redis

ON, OFF = "grab, guess throttle on", "grab, guess throttle off"


def redis_usec(client: redis.Redis) -> int:
    """Microseconds Redis has spent in commands since its stats were last reset."""
    stats = client.info("commandstats")
    return sum(int(entry["usec"]) for entry in stats.values())


def _with_redis_time(trial: Callable[[int], Trial], client: redis.Redis) -> Callable[[int], Trial]:
    """The trial, also counting Redis's command time during it (rounds run one at a time)."""

    def run(index: int) -> Trial:
        before = redis_usec(client)
        measured = trial(index)
        measured.correct["redis_usec"] = redis_usec(client) - before
        return measured

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 s")
    parser.add_argument("--rounds", type=int, help="rounds of each contender (default 5)")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = dataclasses.replace(plan, rounds=args.rounds)
    server = start_redis()
    workdir = Path(tempfile.mkdtemp(prefix="groupbuy-guessing-"))
    client = redis.Redis.from_url(server.url)
    try:
        client.flushall()
        wrk = _ensure_wrk()
        with contextlib.ExitStack() as stack:
            on = stack.enter_context(_groupbuy("uvicorn", server.url, workdir, 1, "gt1"))
            off = stack.enter_context(
                _groupbuy("uvicorn", server.url, workdir, 1, "gt0", GROUPBUY_AUTH_GUESS_LIMIT="0")
            )
            contenders = {
                name: _with_redis_time(
                    _with_cpu(_groupbuy_trial(_flash_grab, g, wrk, plan.round_s), g.server),
                    client,
                )
                for name, g in ((ON, on), (OFF, off))
            }
            servers = [on.server, off.server]
            trials = run_sync(contenders, plan.rounds, between=lambda: wait_idle(servers))
    finally:
        client.close()
        server.stop()
    ratio = comparison(
        "http_grab_guess_on_vs_off", "HTTP grab: on / off", trials[ON], trials[OFF], None
    )
    print(json.dumps({k: v for k, v in ratio.items() if k != "latencies_ms"}, default=str))
    for name in (ON, OFF):
        rates = [t.rate for t in trials[name]]
        cpu = [t.correct["server_cpu_s"] / t.ops * 1e6 for t in trials[name]]
        rtime = [t.correct["redis_usec"] / t.ops for t in trials[name]]
        print(
            f"{name:<28} {statistics.median(rates):>8,.0f}/s  "
            f"server CPU {statistics.median(cpu):.1f} µs/request  "
            f"Redis {statistics.median(rtime):.1f} µs/request"
        )
    print(
        f"ratio on/off: median {ratio['median']:.3f} "
        f"(rounds {ratio['min']:.3f}-{ratio['max']:.3f}); logs in {workdir}"
    )


if __name__ == "__main__":
    main()
