"""The scheduled jobs: what time does, each idempotent, named, with its interval.

Every job can run in several processes at once or twice in a row and change nothing
twice: the scripts decide each transition once, and SQL writes are keyed by business
keys. The scheduler's lease only saves the duplicated work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import redis.exceptions

from groupbuy import errors, metrics
from groupbuy.locks.engine import TeamEngine
from groupbuy.ops.blocklist import BlocklistService
from groupbuy.ops.reconcile import Reconciler
from groupbuy.redpacket.engine import RedPackets
from groupbuy.settings import Settings
from groupbuy.storage.outbox import RecordWriter, RunTime
from groupbuy.storage.reachability import closed_transport

log = logging.getLogger(__name__)

Report = dict[str, Any]

JOBS: dict[str, str] = {
    "sweep_locks": "expire the seat locks that are due",
    "expire_teams": "end the teams whose deadline passed (failed, or formed virtually)",
    "expire_packets": "expire the packets whose time is over and refund their rest",
    "flush_records": "write what Redis decided to SQL (the write-behind)",
    "repair": "finish half-done sends, release ended teams and packets from Redis, "
    "rebuild lost index entries",
    "reconcile": "compare Redis, the grab rows and the ledger; store the report",
}
"""Every job by name, in the order they are scheduled: what it does. The names are those of
POST /v1/admin/jobs/{name}/run (the API lists them from here)."""


class Wakeup:
    """Work for a job was done in this process: each scheduler running the job (see
    `Prompt`) starts a run now rather than at its next poll. Call it on the event loop the
    scheduler runs on; a call costs an Event.set() per started scheduler."""

    def __init__(self) -> None:
        self._events: set[asyncio.Event] = set()  # one per scheduler that follows the job

    def __call__(self) -> None:
        for event in self._events:
            event.set()

    def listen(self, event: asyncio.Event) -> None:
        """Have each call set `event` (a scheduler's, while it runs)."""
        self._events.add(event)

    def forget(self, event: asyncio.Event) -> None:
        """Stop setting `event` (its scheduler stopped)."""
        self._events.discard(event)


@dataclass(frozen=True)
class Prompt:
    """What lets a job run as soon as there is work, not only every interval: the leader
    runs it when this process's work wakes it, when a poll finds work another process left,
    and again at once after a run that found work; at least once per interval anyway."""

    wakeup: Wakeup
    # Whether work is waiting (another process's): one cheap read, asked every `poll_s`.
    waiting: Callable[[], Awaitable[bool]]
    poll_s: float
    # Whether a run's report says it did work: then the next run starts at once.
    busy: Callable[[Report], bool]


@dataclass(frozen=True)
class Job:
    """One scheduled job: its name (as in POST /v1/admin/jobs/{name}/run), how often it runs,
    and the call that does it and returns a report."""

    name: str
    interval_s: float
    run: Callable[[], Awaitable[Report]]
    # For a job that can stop when its time is up and leave the rest to its next run: the
    # call a scheduled run makes instead of `run`, given the seconds it may take.
    run_within: Callable[[float], Awaitable[Report]] | None = None
    # For a job that work wakes (flush_records): run as soon as there is work.
    prompt: Prompt | None = None


def build_jobs(
    settings: Settings,
    teams: TeamEngine,
    packets: RedPackets,
    team_writer: RecordWriter,
    packet_writer: RecordWriter,
    reconciler: Reconciler,
    redis: Any,
    blocklist: BlocklistService,
    recorded: Wakeup,
) -> list[Job]:
    """Every job, built from the services it calls (the writers: each engine's
    write-behind; `recorded`: what this process's engines call when they wrote a record that
    flush_records should write to SQL soon)."""
    schedule = settings.scheduler
    batch = schedule.sweep_batch
    flush_interval_s = settings.outbox.flush_interval_s
    writers = (team_writer, packet_writer)

    async def sweep_locks() -> Report:
        return await teams.sweeps.expire_locks(batch)

    async def expire_teams() -> Report:
        return await teams.sweeps.expire_due(batch)

    async def flush_records(seconds: float | None = None) -> Report:
        # A scheduled run has `seconds` (less than its interval): it stops in time for its next
        # tick, and what is left is that run's. A run by hand writes everything waiting.
        within = RunTime(seconds)
        try:
            # Side by side: under load each engine's drain mostly waits (for Redis, for the
            # database), and a credit waited for the team drain before its own began.
            team_records, packet_records = await both(
                team_writer.drain_all(within), packet_writer.drain_all(within)
            )
        except Exception:
            # SQL down or locked: the backlog grows, and the gauges must show it while the
            # flush keeps failing (the run's own error is the one to raise).
            for writer in writers:
                with contextlib.suppress(Exception):
                    await metrics.update_writeback(writer, redis)
            raise
        # sets the gauges; the report sums the engines' backlogs and takes the oldest lag
        writebacks = [await metrics.update_writeback(writer, redis) for writer in writers]
        return {
            "team_records": team_records,
            "packet_records": packet_records,
            "complete": not within.ran_out,
            "backlog": sum(w["backlog_records"] for w in writebacks),
            "lag_s": max((w["lag_seconds"] for w in writebacks), default=0.0),
        }

    async def records_waiting() -> bool:
        # One read of each pending index (per slot in use): the streams another process's
        # scripts wrote to are listed there until their records are in SQL.
        for writer in writers:
            if await writer.pending(1):
                return True
        return False

    def flushed_some(report: Report) -> bool:
        applied = int(report["team_records"]) + int(report["packet_records"])
        return applied > 0 or not report["complete"]

    flush_soon = Prompt(recorded, records_waiting, settings.outbox.flush_poll_s, flushed_some)

    async def repair() -> Report:
        return {
            **await packets.sending.repair_pending(),
            **await teams.sweeps.release_ended(),
            **await packets.sweeps.release_ended(),
            # the slow safety net under the indexes the other jobs read: a page per run
            **await teams.sweeps.reindex(restore_limit=schedule.restore_batch),
            **await packets.sweeps.reindex(restore_limit=schedule.restore_batch),
            **await blocklist.sync(),  # Redis's copy of the blocked users, rebuilt if lost
        }

    built: dict[str, Job] = {
        "sweep_locks": Job("sweep_locks", schedule.sweep_interval_s, sweep_locks),
        "expire_teams": Job("expire_teams", schedule.sweep_interval_s, expire_teams),
        "expire_packets": Job(
            "expire_packets", schedule.expire_packets_interval_s, packets.sweeps.expire_due
        ),
        "flush_records": Job(
            "flush_records", flush_interval_s, flush_records, flush_records, flush_soon
        ),
        "repair": Job("repair", schedule.repair_interval_s, repair),
        "reconcile": Job("reconcile", schedule.reconcile_interval_s, reconciler.run),
    }
    if built.keys() != JOBS.keys():
        raise RuntimeError(f"jobs built {sorted(built)} are not the jobs listed {sorted(JOBS)}")
    return [built[name] for name in JOBS]


class JobRunner:
    """Runs a job by name, keeps its last report and counts it in the metrics."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = {job.name: job for job in jobs}
        self.last_reports: dict[str, Report] = {}

    async def run(self, name: str, within_s: float | None = None) -> Report:
        """Run one job now and return its report (NotFound for an unknown name); one that can
        stop in time stops after `within_s` seconds, when given."""
        job = self.jobs.get(name)
        if job is None:
            raise errors.NotFound(f"no job {name!r}; jobs: {', '.join(sorted(self.jobs))}")
        began = time.perf_counter()
        with metrics.track_job(name):
            try:
                report = await self._run_once(job, within_s)
            except RuntimeError as error:
                if not closed_transport(error):
                    raise
                # redis-py closed the connection under a command (a cluster failover): the
                # job runs once more on new connections, in the time its first run left.
                log.info("job %s met a closed Redis connection (%s); running it again", name, error)
                left_s = None if within_s is None else within_s - (time.perf_counter() - began)
                try:
                    report = await self._run_once(job, left_s)
                except RuntimeError as again:
                    if not closed_transport(again):
                        raise
                    # Twice: Redis is away as far as this run can tell; said as such (503
                    # for a run by hand, one line per outage from the scheduler).
                    raise redis.exceptions.ConnectionError(
                        f"the Redis connection was closed under job {name}: {again}"
                    ) from again
        report = {
            "job": name,
            "duration_ms": round((time.perf_counter() - began) * 1000, 3),
            **report,
        }
        self.last_reports[name] = report
        return report

    @staticmethod
    async def _run_once(job: Job, within_s: float | None) -> Report:
        if within_s is not None and job.run_within is not None:
            return await job.run_within(max(within_s, 0.0))
        return await job.run()


async def both(first: Awaitable[int], second: Awaitable[int]) -> tuple[int, int]:
    """Run two drains at once; the first failure is raised once both have ended (neither
    is cancelled midway through a batch)."""
    results = await asyncio.gather(first, second, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(int, results[0]), cast(int, results[1])
