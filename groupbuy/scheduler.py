"""The scheduler: APScheduler 3 runs the jobs in whichever process holds a Redis lease.

Every process (each API worker, each `groupbuy worker`) runs a scheduler; they compete
for one lease (token + TTL, renewed at a third of the TTL, released on shutdown) and
only the holder runs jobs. If it dies, the lease runs out and another takes over. The
jobs are idempotent anyway, so a short overlap while a lease changes hands, or an
operator running a job by hand, changes nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from groupbuy import errors, metrics
from groupbuy.jobs import Job

if TYPE_CHECKING:
    from groupbuy.app import Services

log = logging.getLogger(__name__)

LEASE = "scheduler"
# Longest a shutdown waits for the jobs that are running to finish.
_STOP_WAIT_S = 10.0


class JobRunner:
    """Runs a job by name, keeps its last report and counts it in the metrics."""

    def __init__(self, jobs: dict[str, Job]) -> None:
        self.jobs = jobs
        self.last_reports: dict[str, dict[str, Any]] = {}

    async def run(self, name: str) -> dict[str, Any]:
        """Run one job now and return its report (NotFound for an unknown name)."""
        job = self.jobs.get(name)
        if job is None:
            raise errors.NotFound(f"no job {name!r}; jobs: {', '.join(sorted(self.jobs))}")
        began = time.perf_counter()
        with metrics.track_job(name):
            report = await job()
        report = {
            "job": name,
            "duration_ms": round((time.perf_counter() - began) * 1000, 3),
            **report,
        }
        self.last_reports[name] = report
        return report


class Scheduler:
    """Interval jobs under a Redis lease; start() and stop() inside the running event loop."""

    def __init__(self, services: Services, runner: JobRunner) -> None:
        self._services = services
        self._runner = runner
        self._settings = services.settings.scheduler
        self.token = secrets.token_hex(16)
        self.is_leader = False
        self._stopping = False
        self._running: set[asyncio.Task[Any]] = set()
        self._aps: AsyncIOScheduler | None = None

    def intervals(self) -> dict[str, float]:
        """Seconds between runs of each job."""
        s = self._services.settings
        return {
            "sweep_locks": s.scheduler.sweep_interval_s,
            "expire_teams": s.scheduler.sweep_interval_s,
            "expire_packets": s.scheduler.expire_packets_interval_s,
            "flush_records": s.outbox.flush_interval_s,
            "repair": s.scheduler.repair_interval_s,
            "reconcile": s.scheduler.reconcile_interval_s,
        }

    async def hold_lease(self) -> bool:
        """Take or renew the lease; whether this process is the one that runs jobs."""
        ttl_ms = int(self._settings.lease_ttl_s * 1000)
        key = self._services.keys.lease(LEASE)
        try:
            reply = await self._services.scripts.call("lease_hold", [key], [self.token, ttl_ms])
            self.is_leader = bool(int(reply[0]))
        except Exception:
            # Cannot tell: stop running jobs rather than risk running them without the lease.
            self.is_leader = False
            log.warning("could not renew the scheduler lease", exc_info=True)
        return self.is_leader

    async def _tick(self, name: str) -> None:
        if self._stopping or not self.is_leader:
            return
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        try:
            await self._runner.run(name)
        except Exception:
            log.warning("job %s failed; it runs again at its next interval", name, exc_info=True)
        finally:
            self._running.discard(task)

    def start(self) -> None:
        """Start the APScheduler with the lease renewal and every job."""
        aps = AsyncIOScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
        )
        aps.add_job(
            self.hold_lease,
            "interval",
            seconds=self._settings.lease_ttl_s / 3,
            id="lease",
            next_run_time=_now(),
        )
        for name, seconds in self.intervals().items():
            if name in self._runner.jobs:
                aps.add_job(self._tick, "interval", seconds=seconds, args=[name], id=name)
        aps.start()
        self._aps = aps

    async def stop(self) -> None:
        """Stop scheduling, let running jobs finish (cancelling mid-SQL can hang), release."""
        self._stopping = True
        if self._aps is not None:
            self._aps.pause()
        if self._running:
            await asyncio.wait(set(self._running), timeout=_STOP_WAIT_S)
        if self._aps is not None:
            self._aps.shutdown(wait=False)
        if self.is_leader:
            key = self._services.keys.lease(LEASE)
            try:
                await self._services.scripts.call("lease_release", [key], [self.token])
            except Exception:
                log.warning("could not release the scheduler lease; it will run out", exc_info=True)
            self.is_leader = False


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)
