"""The cost of rate limits on the grab path: the HTTP flash grab through `groupbuy serve`
(1 worker) with `[ratelimit]` on (the defaults: each grab first waits for one script call
taking from its API key's bucket and its user's) and off, side by side on the same
redis-server.

Both servers run at once (own key prefixes and SQLite files) and are measured in
alternation, round after round, each round started with both idle
(benchmarks/harness.py); the figure is the median of the same-round ratios of their
rates, on/off. Target: the limits cost at most 10% of the grab path (ratio >= 0.90). The
load is benchmarks/http_level.py's flash grab (wrk, distinct users, every 20th request a
double tap, all through one API key): no request may be refused, so the row's
correctness counts also show that the default limits do not throttle a flash sale.

    .venv/bin/python -m benchmarks.http_ratelimit            # 5 rounds of 3 s (~1 min)
    .venv/bin/python -m benchmarks.http_ratelimit --quick    # 2 rounds of 2 s
    .venv/bin/python -m benchmarks.http_ratelimit --rounds 9 # a steadier median
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.harness import (
    Bench,
    Row,
    Server,
    Trial,
    comparison,
    cpu_seconds,
    groupbuy,
    run_sync,
    standalone,
    wait_idle,
)
from benchmarks.http_level import (
    flash_grab,
    groupbuy_trial,
    log_errors,
    notes,
    plan_of,
    rounds_row,
    say,
)
from groupbuy.settings import RateLimitSettings

TARGET = 0.90  # rate with limits on / rate with them off, at least
ON, OFF = "grab, rate limits on", "grab, rate limits off"


def _default_limits() -> dict[str, str]:
    """GROUPBUY_RATELIMIT_* at the built-in defaults (benchmarks/harness.py raises the
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


def run_ratelimit_http(bench: Bench) -> list[Row]:
    """The flash grab with limits on and off, alternated; their rows and the ratios."""
    plan = plan_of(bench)
    note = notes(1, plan.round_s)["flash_grab"]
    limits = _default_limits()
    off_limits = {**limits, "GROUPBUY_RATELIMIT_ENABLED": "false"}
    with (
        groupbuy(bench.redis_url, bench.workdir, 1, "rl1", **limits) as on,
        groupbuy(bench.redis_url, bench.workdir, 1, "rl0", **off_limits) as off,
    ):
        servers = [on.server, off.server]
        contenders = {
            ON: _with_cpu(groupbuy_trial(flash_grab, on, plan.round_s), on.server),
            OFF: _with_cpu(groupbuy_trial(flash_grab, off, plan.round_s), off.server),
        }
        say(f"rate limits: {', '.join(contenders)}; {plan.rounds} rounds")
        trials = run_sync(contenders, plan.rounds, between=lambda: wait_idle(servers), say=say)
        rows = [
            rounds_row(
                "flash_grab",
                "groupbuy (1 worker, rate limits on)",
                trials[ON],
                f"{note}; [ratelimit] at its defaults: each grab first takes from the key's "
                "and the user's bucket in one script call",
            ),
            rounds_row(
                "flash_grab",
                "groupbuy (1 worker, rate limits off)",
                trials[OFF],
                f"{note}; [ratelimit] enabled = false",
            ),
        ]
        log_errors(rows[:1], on.server)
        log_errors(rows[1:], off.server)
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


if __name__ == "__main__":
    standalone(run_ratelimit_http, __doc__)
