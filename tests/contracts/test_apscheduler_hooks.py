"""APScheduler 3's asyncio executor as groupbuy/ops/scheduler.py, Scheduler, relies on it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

WAIT_S = 30.0


async def test_asyncio_scheduler_runs_each_coroutine_job_run_in_a_task_of_its_own() -> None:
    """groupbuy/ops/scheduler.py, Scheduler.hold_lease / _tick / stop: a coroutine job runs
    in a task of its own (asyncio.current_task() inside it), which ends with the run; so
    stop() can pause() the scheduler, then wait for the tasks it noted to end the runs in
    progress. Undocumented: APScheduler only says it runs coroutine jobs on the loop."""
    began = asyncio.Event()
    release = asyncio.Event()
    runs: list[asyncio.Task[Any] | None] = []

    async def job() -> None:
        runs.append(asyncio.current_task())
        began.set()
        await release.wait()

    scheduler = AsyncIOScheduler(
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
    )
    scheduler.add_job(job, "interval", seconds=3600, id="job", next_run_time=datetime.now(UTC))
    scheduler.start()
    try:
        await asyncio.wait_for(began.wait(), WAIT_S)
        [task] = runs
        assert task is not None and task is not asyncio.current_task()
        scheduler.pause()
        assert not task.done()
        release.set()
        done, _pending = await asyncio.wait({task}, timeout=WAIT_S)
        assert done == {task}
        assert task.exception() is None
    finally:
        scheduler.shutdown(wait=False)
    assert len(runs) == 1
