"""Prometheus metrics: the metric objects, the helpers that move them, and /metrics' text.

Metrics live in prometheus-client's process-global registry. Several uvicorn worker
processes share them through multiprocess mode: when PROMETHEUS_MULTIPROC_DIR is set
*before prometheus_client is imported*, every process writes its values to files in
that directory and `render()` sums them (gauges keep the most recent write instead).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ParamSpec, Protocol, TypeVar

from groupbuy_client.wire import Outcome
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)

from groupbuy import errors

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# A `_created` series per counter and histogram doubles the text of /metrics and says when
# the process started, which process_start_time_seconds already says.
disable_created_metrics()  # type: ignore[no-untyped-call]

REQUEST_OUTCOME: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "groupbuy_request_outcome", default=None
)
"""Where the access log finds a request's outcome code: the request's middleware sets an
empty list, `note_outcome` appends (a list, so tasks started by the request write it too)."""


def note_outcome(code: str) -> None:
    """Record the outcome code (`grabbed`, `team_full`...) of the request being served."""
    slot = REQUEST_OUTCOME.get()
    if slot is not None:
        slot.append(code)


# Requests are decided by one script call: most answer in a few milliseconds.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_JOB_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

LOCK_OUTCOMES = Counter(
    "groupbuy_lock_outcomes_total",
    "Seat lock attempts by operation (lock: a named team, join: any team of the activity) and "
    "outcome: locked, existing, or the refusal's error code.",
    ["operation", "outcome"],
)
WAITLIST_ENTRIES = Counter(
    "groupbuy_waitlist_entries_total",
    "Waitlist entries by what became of them: queued, offered (a seat lock given), taken (the "
    "offer confirmed), dropped (the user could no longer take a seat), expired, removed (by "
    "DELETE).",
    ["outcome"],
)
GRAB_OUTCOMES = Counter(
    "groupbuy_grab_outcomes_total",
    "Red packet grabs by outcome: grabbed, already_grabbed, or the refusal's error code.",
    ["outcome"],
)
PROBLEMS = Counter(
    "groupbuy_http_problems_total",
    "Problems answered (application/problem+json) by status and code: the expected outcomes "
    "of a sale (409 team_full, activity_sold_out, ...) apart from the real errors. Codes are "
    "the fixed set of groupbuy.errors.",
    ["status", "code"],
)
HTTP_DURATION = Histogram(
    "groupbuy_http_request_duration_seconds",
    "HTTP request latency by method, route template (or 'unmatched') and status.",
    ["method", "route", "status"],
    buckets=_LATENCY_BUCKETS,
)
# The write-behind gauges are measured from Redis at each scrape of /metrics, by whichever
# process answers it (the backlog is global in Redis), and after each flush_records run.
# A measure counts the records of this many streams at most (oldest first), so a scrape
# stays short however large the backlog.
# Each write-behind metric is labelled by engine: teams (activity outbox streams) or
# packets (packet outbox streams).
COUNTED_STREAMS = 5000
WRITEBACK_BACKLOG = Gauge(
    "groupbuy_writeback_backlog_records",
    "Records waiting in outbox streams to be written to SQL, by engine (teams|packets), "
    "measured in Redis at this scrape (the last value when Redis did not answer). Counts "
    f"the records of the {COUNTED_STREAMS} oldest streams at most: a lower bound when "
    "groupbuy_writeback_backlog_streams is above that.",
    ["engine"],
    multiprocess_mode="livemostrecent",
)
WRITEBACK_STREAMS = Gauge(
    "groupbuy_writeback_backlog_streams",
    "Outbox streams with records waiting to be written to SQL, by engine (teams|packets), "
    "measured in Redis at this scrape (the last value when Redis did not answer).",
    ["engine"],
    multiprocess_mode="livemostrecent",
)
WRITEBACK_LAG = Gauge(
    "groupbuy_writeback_lag_seconds",
    "Age of the oldest record waiting in an outbox stream (0 when none), by engine "
    "(teams|packets), measured in Redis at this scrape (the last value when Redis did not "
    "answer).",
    ["engine"],
    multiprocess_mode="livemostrecent",
)
# Webhooks: outcomes and latency counted by the process that made the attempt; the
# backlog gauges measured in SQL at each scrape by whichever process answers it.
WEBHOOK_DELIVERIES = Counter(
    "groupbuy_webhook_deliveries_total",
    "Webhook delivery attempts by endpoint and outcome: delivered, retrying (a retry is "
    "scheduled), failed (the schedule is over, or the body is over the bound), gone (a 410).",
    ["endpoint", "outcome"],
)
WEBHOOK_ATTEMPT_SECONDS = Histogram(
    "groupbuy_webhook_attempt_duration_seconds",
    "Duration of webhook delivery attempts by endpoint, from the request to the answer read.",
    ["endpoint"],
    buckets=_LATENCY_BUCKETS,
)
WEBHOOK_LAG = Gauge(
    "groupbuy_webhook_lag_seconds",
    "Per endpoint: age of the oldest event not yet delivered (0 when none waits), measured "
    "in SQL at this scrape.",
    ["endpoint"],
    multiprocess_mode="livemostrecent",
)
WEBHOOK_QUEUE = Gauge(
    "groupbuy_webhook_queue_depth",
    "Per endpoint: deliveries pending (waiting, in flight or scheduled for a retry), "
    "measured in SQL at this scrape.",
    ["endpoint"],
    multiprocess_mode="livemostrecent",
)
WRITEBACK_RECORDS = Counter(
    "groupbuy_writeback_records_total",
    "Outbox records written to SQL by this process's write-behind, by engine (teams|packets).",
    ["engine"],
)
JOB_RUNS = Counter(
    "groupbuy_job_runs_total", "Scheduled job runs by job and result (ok|error).", ["job", "result"]
)
SCHEDULER_LEADER = Gauge(
    "groupbuy_scheduler_leader",
    "1 while this process holds the scheduler lease and runs the jobs, else 0 (several "
    "workers of one serve: how many of them hold it, 0 or 1).",
    multiprocess_mode="livesum",
)
JOB_DURATION = Histogram(
    "groupbuy_job_duration_seconds", "Scheduled job run time.", ["job"], buckets=_JOB_BUCKETS
)
JOB_TICKS_SKIPPED = Counter(
    "groupbuy_job_ticks_skipped_total",
    "Scheduled runs skipped because the job's previous run was still going on, by job.",
    ["job"],
)
REDIS_BATCH_CALLS = Histogram(
    "groupbuy_redis_batch_calls",
    "Script calls carried by each coalesced Redis round trip (1 when idle, more under load).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
RESTORED = Counter(
    "groupbuy_restored_total",
    "Live teams and packets rebuilt in Redis from SQL after Redis lost them, by kind.",
    ["kind"],
)
DEAD_LETTERS = Counter(
    "groupbuy_dead_letters_total",
    "Outbox records SQL could not apply, moved to the dead letters, by stream (packets|teams).",
    ["stream"],
)
REPLICATION_TIMEOUTS = Counter(
    "groupbuy_redis_replication_timeouts_total",
    "Script calls failed with redis_replication_timeout: fewer replicas than [redis] "
    "wait_replicas confirmed their writes within wait_timeout_s (applied on the primary).",
)
GUESSES_REFUSED = Counter(
    "groupbuy_auth_throttled_total",
    "Requests refused 429 because their client address failed to authenticate too often "
    "([auth] guess_limit), by surface (api|console).",
    ["surface"],
)
BACKEND_ERRORS = Counter(
    "groupbuy_backend_errors_total",
    "Requests answered 503 because a backing service failed, by backend (redis|database).",
    ["backend"],
)

P = ParamSpec("P")
R = TypeVar("R")


def series(metric: Any) -> Callable[..., Any]:
    """`metric.labels(*values)`, each label set looked up once and kept: `labels()`
    validates and takes a lock on every call, which showed on the hot paths. Only for
    metrics whose label values come from small fixed sets (outcomes, routes, statuses)."""
    return functools.lru_cache(maxsize=None)(metric.labels)


def counts_outcomes(
    counter: Counter, outcome_of: Callable[[Any], str], *labels: str
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorate an async service call to count each call in `counter` by its outcome.

    `labels` are the values of the counter's labels before `outcome`, the same for every
    call. A result is labelled by `outcome_of(result)`, a refusal by its error code, and any
    other failure (Redis or SQL down, a bug) as `error`.
    """

    child = series(counter)

    def decorate(call: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(call)
        async def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            outcome = "error"
            try:
                result = await call(*args, **kwargs)
                outcome = outcome_of(result)
                return result
            except errors.GroupBuyError as exc:
                outcome = exc.code
                raise
            finally:
                child(*labels, outcome).inc()
                note_outcome(outcome)

        return counted

    return decorate


_PROBLEM_SERIES = series(PROBLEMS)


def count_problem(error: errors.GroupBuyError) -> None:
    """Count one problem answered, by its status and code."""
    _PROBLEM_SERIES(str(error.status_code), error.code).inc()


def lock_outcome(outcome: Outcome) -> str:
    """The label of a successful seat lock or join: `existing` for a repeat, else `locked`."""
    return "existing" if outcome.body.get("existing") else "locked"


def grab_outcome(body: dict[str, Any]) -> str:
    """The label of a successful GrabService.grab: its status."""
    return str(body["status"])


@contextlib.contextmanager
def track_job(name: str) -> Iterator[None]:
    """Count one run of job `name` as ok or error (exception raised inside) and time it.

    A plain context manager, so it also wraps awaits: `with track_job("flush_records"):`.
    """
    started = time.perf_counter()
    result = "error"
    try:
        yield
        result = "ok"
    finally:
        JOB_DURATION.labels(job=name).observe(time.perf_counter() - started)
        JOB_RUNS.labels(job=name, result=result).inc()


class Backlog(Protocol):
    """What update_writeback measures: an engine's record writer."""

    @property
    def engine(self) -> str:
        """The engine's label: teams or packets."""
        ...

    async def measure_backlog(self, most: int) -> tuple[int, int | None, int]:
        """(records waiting in the `most` oldest streams, ms timestamp of the oldest one or
        None, streams with records waiting)."""
        ...


async def update_writeback(backlog: Backlog, redis: Any) -> dict[str, Any]:
    """Measure the records waiting in one engine's outbox streams and set its gauges.

    The lag compares the oldest waiting record's stream id with Redis's TIME (stream
    ids come from that clock). Returns what it set.
    """
    records, oldest_ms, streams = await backlog.measure_backlog(COUNTED_STREAMS)
    lag_s = 0.0
    if oldest_ms is not None:
        seconds, micros = await redis.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        lag_s = max(0.0, (now_ms - oldest_ms) / 1000)
    WRITEBACK_BACKLOG.labels(engine=backlog.engine).set(records)
    WRITEBACK_STREAMS.labels(engine=backlog.engine).set(streams)
    WRITEBACK_LAG.labels(engine=backlog.engine).set(lag_s)
    return {"backlog_records": records, "lag_seconds": lag_s, "streams": streams}


def update_webhooks(backlog: dict[str, tuple[int, float]]) -> None:
    """Set the webhook gauges from a measure: per endpoint, (pending deliveries, lag in s)."""
    for endpoint, (depth, lag_s) in backlog.items():
        WEBHOOK_QUEUE.labels(endpoint).set(depth)
        WEBHOOK_LAG.labels(endpoint).set(lag_s)


def collected() -> CollectorRegistry:
    """The registry to read every metric from: in multiprocess mode a fresh one that reads
    every process's files (the process-global one would only show this process)."""
    registry: CollectorRegistry = REGISTRY
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


def render() -> tuple[bytes, str]:
    """The Prometheus text of every metric (of every worker process), and its content type."""
    return generate_latest(collected()), CONTENT_TYPE_LATEST


def process_exited() -> None:
    """Drop this process's live gauges from the multiprocess files (call at shutdown)."""
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def multiprocess_dir(needed: bool) -> Iterator[str | None]:
    """Give worker processes started inside a fresh shared metrics directory.

    Sets PROMETHEUS_MULTIPROC_DIR (children inherit it before they import
    prometheus_client) and removes the directory afterwards. Does nothing when not
    `needed` or when the variable is already set (the operator chose a directory).
    """
    if not needed or os.environ.get(MULTIPROC_ENV):
        yield os.environ.get(MULTIPROC_ENV)
        return
    path = tempfile.mkdtemp(prefix="groupbuy-metrics-")
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)
