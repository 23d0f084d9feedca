"""The scheduler: APScheduler 3 runs the jobs in whichever process holds a Redis lease.

Every process (each API worker, each `groupbuy worker`) runs a scheduler; they compete
for one lease (token + TTL, renewed at a third of the TTL, released on shutdown) and
only the holder runs jobs. If it dies, the lease runs out and another takes over. The
jobs are idempotent anyway, so a short overlap while a lease changes hands, or an
operator running a job by hand, changes nothing twice.

A job with a `Prompt` (flush_records) is not on APScheduler's clock: a task of its own
follows it, and the holder runs it when this process's work wakes it, when a poll finds
work another process left, again at once after a run that found work, and at least once
per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from groupbuy import errors, metrics
from groupbuy.ops.jobs import Job, JobRunner, Prompt, Report
from groupbuy.settings import SchedulerSettings
from groupbuy.storage.calls import lease_hold, lease_release
from groupbuy.storage.db import unavailable
from groupbuy.storage.reachability import Reachability
from groupbuy.storage.specs import Scripts

log = logging.getLogger(__name__)
# APScheduler logs two INFO lines per job run ("Running job", "executed successfully"),
# in every process whether or not it holds the lease: with second-long intervals that
# is most of a log. Its warnings and errors (a job that raised, a missed run) still show.
_APSCHEDULER_LEVEL = logging.WARNING

LEASE = "scheduler"  # the lease's name: Keys.lease(LEASE)
# Longest a shutdown waits for the jobs that are running to finish.
_STOP_WAIT_S = 10.0
# The share of its interval a scheduled run of a job that can stop in time may take
# (flush_records): the rest covers the loop's delays, so the run ends before its next tick.
_RUN_SHARE = 0.8


@dataclass
class _Run:
    """A scheduled run going on: when it began, and whether a tick came meanwhile."""

    began: float
    overran: bool = False


@dataclass
class _Follower:
    """The task that runs a prompt job when there is work, and the event its wakeup sets."""

    job: Job
    prompt: Prompt
    woken: asyncio.Event
    halt: asyncio.Event  # set by stop(): ends a wait after a failed run
    task: asyncio.Task[None] | None = None


class Scheduler:
    """Interval jobs under a Redis lease; start() and stop() inside the running event loop."""

    def __init__(
        self,
        runner: JobRunner,
        scripts: Scripts,
        lease_key: str,
        settings: SchedulerSettings,
        reachability: Reachability | None = None,
        database: Reachability | None = None,
    ) -> None:
        """`reachability` is Redis's and `database` the database's: a job that fails because
        one is away is said once per outage there, not with a traceback per run."""
        self._runner = runner
        self._reachability = reachability or Reachability("the configured URL")
        self._database = database or Reachability("the database", "database", unavailable)
        self._scripts = scripts
        self._lease_key = lease_key
        self._settings = settings
        self.token = secrets.token_hex(16)
        self.is_leader = False
        self._stopping = False
        self._running: set[asyncio.Task[Any]] = set()
        self._runs: dict[str, _Run] = {}  # by job: its scheduled run going on now
        self._late: set[str] = set()  # jobs whose overrun was logged (one line per episode)
        self._refused: set[str] = set()  # jobs whose 503-kind failure was logged (the same)
        self._aps: AsyncIOScheduler | None = None
        self._followers: list[_Follower] = []  # one per prompt job, once started

    async def hold_lease(self) -> bool:
        """Take or renew the lease; whether this process is the one that runs jobs (never
        once stopping)."""
        if self._stopping:
            # A renewal APScheduler handed to the loop just before stop() paused it starts
            # after stop() looked at what runs: it would outlive the Redis connections and
            # end in APScheduler's traceback of a CancelledError.
            return False
        # stop() waits for a renewal in flight too (with Redis away it retries for a while):
        # cancelled at exit instead, it would end in APScheduler's traceback.
        await self._in_own_task(self._renew())
        return self.is_leader

    async def _renew(self) -> None:
        ttl_ms = int(self._settings.lease_ttl_s * 1000)
        try:
            held = await lease_hold(self._scripts, self._lease_key, self.token, ttl_ms)
            self._lead(held)
            self._reachability.answered()
        except Exception as error:
            # Cannot tell: stop running jobs rather than risk running them without the lease.
            self._lead(False)
            if not self._reachability.failed(error):
                log.warning("could not renew the scheduler lease", exc_info=True)

    async def _in_own_task(self, work: Coroutine[Any, Any, object]) -> None:
        """Run `work` in a task of its own, noted while it runs: stop() waits for exactly
        that (APScheduler does not promise a task per job run)."""
        task = asyncio.create_task(work)
        self._running.add(task)
        try:
            await task
        finally:
            self._running.discard(task)

    def _lead(self, held: bool) -> None:
        """Whether this process holds the lease now: said in the log and the metrics when it
        changes, so an operator sees which replica runs the jobs and when that moved."""
        if held != self.is_leader:
            if held:
                log.info("this process holds the scheduler lease now and runs the jobs")
            else:
                log.info("this process no longer holds the scheduler lease")
        self.is_leader = held
        metrics.SCHEDULER_LEADER.set(1 if held else 0)

    async def _tick(self, name: str) -> None:
        if self._stopping or not self.is_leader:
            return
        run = self._runs.get(name)
        if run is not None:
            self._overran(name, run)
            return
        self._runs[name] = _Run(time.monotonic())
        await self._in_own_task(self._run(name))

    async def _run(self, name: str) -> Report | None:
        """One scheduled run of the job: its report, or None when it failed (said here)."""
        try:
            report = await self._runner.run(name, self._runner.jobs[name].interval_s * _RUN_SHARE)
            self._refused.discard(name)
            return report
        except Exception as error:
            self._failed(name, error)
            return None
        finally:
            run = self._runs.pop(name)
            if not run.overran:  # on time: a later overrun is a new episode, said again
                self._late.discard(name)

    async def _follow(self, follower: _Follower) -> None:
        """Run a prompt job whenever there is work, while this process holds the lease."""
        job, prompt, woken = follower.job, follower.prompt, follower.woken
        last = time.monotonic()  # the last run's start: the next is due an interval later
        # A run the poll started found nothing to do (a stream it cannot write yet, such as
        # a dead writer's batch not yet reclaimable): the poll starts no run until another
        # run (woken, or due at the interval) ran, so such a stream costs a run or two per
        # interval, not one per poll.
        fruitless = False
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), prompt.poll_s)
            if not self.is_leader:
                woken.clear()  # the holder finds this work by its poll
                continue
            polled = False
            due = woken.is_set() or time.monotonic() - last >= job.interval_s
            if not due and not fruitless:
                due = polled = await self._work_waits(job.name, prompt)
            if not due:
                continue
            if self._stopping:  # checked with no await before the run starts: stop() sees it
                return
            woken.clear()
            last = time.monotonic()
            report = await self._watched(job)
            if report is None:
                # Failed (said once per outage): tried again at the interval, as a ticked
                # job is, not at each wakeup while SQL or Redis is away.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(follower.halt.wait(), job.interval_s)
            elif prompt.busy(report):
                fruitless = False
                woken.set()  # a backlog drains run after run
            else:
                fruitless = polled

    @staticmethod
    async def _work_waits(name: str, prompt: Prompt) -> bool:
        """The prompt's poll; a failure is left to the run due at the interval to say (once
        per outage), rather than said at every poll."""
        try:
            return await prompt.waiting()
        except Exception:
            log.debug("could not poll for %s's work", name, exc_info=True)
            return False

    async def _watched(self, job: Job) -> Report | None:
        """Run the job in a task of its own (stop() waits for it); each interval it takes
        counts as a skipped tick and makes it late, as an APScheduler tick would."""
        run = self._runs[job.name] = _Run(time.monotonic())
        task = asyncio.create_task(self._run(job.name))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        while not task.done():
            await asyncio.wait({task}, timeout=job.interval_s)
            if not task.done():
                self._overran(job.name, run)
        return task.result()

    def _failed(self, name: str, error: Exception) -> None:
        """A run that failed: Redis or the database away is said once by their reachability;
        another refusal of the 503 kind (too few replicas confirmed a write) once per job
        until a run of it succeeds; anything else, with its traceback, as the bug it may be."""
        if self._reachability.failed(error) or self._database.failed(error):
            return
        if isinstance(error, errors.Unavailable):
            if name not in self._refused:
                self._refused.add(name)
                log.warning("job %s cannot run now (%s); it is tried at each interval", name, error)
            return
        log.warning("job %s failed; it runs again at its next interval", name, exc_info=True)

    def _overran(self, name: str, run: _Run) -> None:
        """A tick came while the job's previous run goes on: it is skipped. Counted each
        time, said once per episode (until a run ends within its interval)."""
        run.overran = True
        metrics.JOB_TICKS_SKIPPED.labels(job=name).inc()
        if name not in self._late:
            self._late.add(name)
            log.warning(
                "%s has been running for %.1f s (interval %g s); its next run waits",
                name,
                time.monotonic() - run.began,
                self._runner.jobs[name].interval_s,
            )

    def start(self) -> None:
        """Start the APScheduler with the lease renewal and every job."""
        # Here rather than in the command line: every process that runs a scheduler (serve,
        # worker, an app embedded in another ASGI server, the tests) is quiet the same way.
        aps_log = logging.getLogger("apscheduler")
        if aps_log.level < _APSCHEDULER_LEVEL:  # an operator's higher level stays
            aps_log.setLevel(_APSCHEDULER_LEVEL)
        aps = AsyncIOScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
        )
        aps.add_job(
            self.hold_lease,
            "interval",
            seconds=self._settings.lease_ttl_s / 3,
            id="lease",
            next_run_time=datetime.now(UTC),
        )
        for job in self._runner.jobs.values():
            if job.prompt is not None:
                self._start_following(job, job.prompt)
                continue
            # A tick while the job's run goes on returns at once (_tick says it is late):
            # APScheduler's own refusal would log a warning on every tick instead.
            aps.add_job(
                self._tick,
                "interval",
                seconds=job.interval_s,
                args=[job.name],
                id=job.name,
                max_instances=2,
            )
        aps.start()
        self._aps = aps

    def _start_following(self, job: Job, prompt: Prompt) -> None:
        follower = _Follower(job, prompt, asyncio.Event(), asyncio.Event())
        prompt.wakeup.listen(follower.woken)
        follower.task = asyncio.create_task(self._follow(follower), name=f"follow-{job.name}")
        self._followers.append(follower)

    async def stop(self) -> None:
        """Stop scheduling, let running jobs finish (cancelling mid-SQL can hang), release."""
        self._stopping = True
        if self._aps is not None:
            self._aps.pause()
        for follower in self._followers:
            follower.prompt.wakeup.forget(follower.woken)
            follower.woken.set()  # a follower waiting for work sees the stop now
            follower.halt.set()
        following = {f.task for f in self._followers if f.task is not None}
        if self._running or following:
            await asyncio.wait(self._running | following, timeout=_STOP_WAIT_S)
        for task in following:
            # Left waiting for a run that outlived the wait: cancelling it leaves the run be.
            task.cancel()
        await asyncio.gather(*following, return_exceptions=True)
        if self._aps is not None:
            self._aps.shutdown(wait=False)
        if self.is_leader:
            try:
                await lease_release(self._scripts, self._lease_key, self.token)
            except Exception as error:
                if not self._reachability.failed(error):
                    log.warning(
                        "could not release the scheduler lease; it will run out", exc_info=True
                    )
            self._lead(False)
