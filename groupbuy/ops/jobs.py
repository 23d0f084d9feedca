"""The scheduled jobs: what time does, each idempotent, named, with its interval.

Every job can run in several processes at once or twice in a row and change nothing
twice: the scripts decide each transition once, and SQL writes are keyed by business
keys. The scheduler's lease only saves the duplicated work.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from groupbuy import errors, metrics
from groupbuy.locks.service import TeamService
from groupbuy.ops.blocklist import BlocklistService
from groupbuy.ops.reconcile import Reconciler
from groupbuy.redpacket.service import RedPacketService
from groupbuy.settings import Settings

Report = dict[str, Any]

# Most back-to-back write-behind rounds in one flush_records run.
_FLUSH_ROUNDS = 10

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


@dataclass(frozen=True)
class Job:
    """One scheduled job: its name (as in POST /v1/admin/jobs/{name}/run), how often it runs,
    and the call that does it and returns a report."""

    name: str
    interval_s: float
    run: Callable[[], Awaitable[Report]]


def build_jobs(
    settings: Settings,
    teams: TeamService,
    packets: RedPacketService,
    reconciler: Reconciler,
    redis: Any,
    blocklist: BlocklistService,
) -> list[Job]:
    """Every job, built from the services it calls."""
    schedule = settings.scheduler
    batch = schedule.sweep_batch
    flush_interval_s = settings.outbox.flush_interval_s

    async def sweep_locks() -> Report:
        return await teams.expire_locks(batch)

    async def expire_teams() -> Report:
        return await teams.expire_due(batch)

    async def flush_records() -> Report:
        # A round that outlasts the interval makes the scheduler skip the next tick, so
        # what arrived meanwhile would wait a whole extra interval: go again at once
        # instead, for a few rounds at most (an idle round costs one read of each index).
        team_records = packet_records = rounds = 0
        try:
            while True:
                began = time.monotonic()
                team_records += await teams.record_pending()
                packet_records += await packets.record_pending()
                rounds += 1
                busy = time.monotonic() - began >= flush_interval_s
                if not busy or rounds >= _FLUSH_ROUNDS:
                    break
        except Exception:
            # SQL down or locked: the backlog grows, and the gauges must show it while the
            # flush keeps failing (the round's own error is the one to raise).
            with contextlib.suppress(Exception):
                await metrics.update_writeback(packets.writer, redis)
            raise
        writeback = await metrics.update_writeback(packets.writer, redis)  # sets the gauges
        return {
            "team_records": team_records,
            "packet_records": packet_records,
            "rounds": rounds,
            "backlog": writeback["backlog_records"],
            "lag_s": writeback["lag_seconds"],
        }

    async def repair() -> Report:
        return {
            **await packets.repair_pending(),
            **await teams.release_ended(),
            **await packets.release_ended(),
            # the slow safety net under the indexes the other jobs read: a page per run
            **await teams.reindex(restore_limit=schedule.restore_batch),
            **await packets.reindex(restore_limit=schedule.restore_batch),
            **await blocklist.sync(),  # Redis's copy of the blocked users, rebuilt if lost
        }

    built: dict[str, tuple[float, Callable[[], Awaitable[Report]]]] = {
        "sweep_locks": (schedule.sweep_interval_s, sweep_locks),
        "expire_teams": (schedule.sweep_interval_s, expire_teams),
        "expire_packets": (schedule.expire_packets_interval_s, packets.expire_due),
        "flush_records": (flush_interval_s, flush_records),
        "repair": (schedule.repair_interval_s, repair),
        "reconcile": (schedule.reconcile_interval_s, reconciler.run),
    }
    if built.keys() != JOBS.keys():
        raise RuntimeError(f"jobs built {sorted(built)} are not the jobs listed {sorted(JOBS)}")
    return [Job(name, *built[name]) for name in JOBS]


class JobRunner:
    """Runs a job by name, keeps its last report and counts it in the metrics."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = {job.name: job for job in jobs}
        self.last_reports: dict[str, Report] = {}

    async def run(self, name: str) -> Report:
        """Run one job now and return its report (NotFound for an unknown name)."""
        job = self.jobs.get(name)
        if job is None:
            raise errors.NotFound(f"no job {name!r}; jobs: {', '.join(sorted(self.jobs))}")
        began = time.perf_counter()
        with metrics.track_job(name):
            report = await job.run()
        report = {
            "job": name,
            "duration_ms": round((time.perf_counter() - began) * 1000, 3),
            **report,
        }
        self.last_reports[name] = report
        return report
