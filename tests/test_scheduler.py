"""One active scheduler across processes (a Redis lease), and jobs done once with two running."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc
from prometheus_client import REGISTRY
from sqlalchemy import select
from starlette.testclient import TestClient

from groupbuy import errors, metrics
from groupbuy.api.app import create_app
from groupbuy.ops.jobs import Job, JobRunner
from groupbuy.ops.scheduler import LEASE, Scheduler
from groupbuy.services import Services, build_scheduler
from groupbuy.settings import Settings
from groupbuy.storage.db import unavailable
from groupbuy.storage.events import EventRow
from groupbuy.storage.reachability import Reachability
from tests.support.http import ADMIN, SERVICE, app_services, portal


async def test_the_lease_has_one_holder(services: Services) -> None:
    first = build_scheduler(services)
    second = build_scheduler(services)
    assert await first.hold_lease() and first.is_leader
    assert not await second.hold_lease()
    assert await first.hold_lease()  # renewing keeps it
    await first.stop()  # releases it
    assert not first.is_leader
    assert await second.hold_lease()
    await second.stop()


async def test_the_holder_is_shown_in_the_metrics_and_the_log(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    gauge = metrics.SCHEDULER_LEADER
    holder, other = build_scheduler(services), build_scheduler(services)
    with caplog.at_level(logging.INFO, logger="groupbuy.ops.scheduler"):
        assert await holder.hold_lease()
        assert gauge._value.get() == 1
        assert await holder.hold_lease()  # a renewal says nothing new
        await holder.stop()
        assert gauge._value.get() == 0
        assert await other.hold_lease()
        await other.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "groupbuy.ops.scheduler"]
    taken = "this process holds the scheduler lease now and runs the jobs"
    released = "this process no longer holds the scheduler lease"
    assert said == [taken, released, taken, released], said


async def test_a_renewal_that_starts_after_stop_does_nothing(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """APScheduler may hand a renewal to the loop just before stop() pauses it; started
    afterwards, it must not call Redis (whose connections are closing: a traceback)."""
    scheduler = build_scheduler(services)
    await scheduler.stop()
    called: list[str] = []

    async def recording(name: str, keys: list[str], args: list[Any]) -> Any:
        called.append(name)
        raise AssertionError("called Redis after stop")

    monkeypatch.setattr(services.scripts, "call", recording)
    assert await scheduler.hold_lease() is False
    assert called == [] and not scheduler.is_leader


async def test_stop_waits_for_the_run_in_progress_not_for_the_task_that_started_it(
    services: Services,
) -> None:
    """APScheduler only promises to run a coroutine job on the loop: whichever task starts a
    run (here one that goes on to other work, as an executor running jobs in turn might),
    stop() waits for that run to end, and for nothing else."""
    began, release = asyncio.Event(), asyncio.Event()

    async def slow() -> dict[str, Any]:
        began.set()
        await release.wait()
        return {}

    scheduler = Scheduler(
        JobRunner([Job("slow", 3600, slow)]),
        services.scripts,
        services.keys.lease(LEASE),
        services.settings.scheduler,
    )
    assert await scheduler.hold_lease()

    async def executor() -> None:
        await scheduler._tick("slow")
        await asyncio.sleep(3600)  # the starting task lives on after the run

    starter = asyncio.create_task(executor())
    try:
        await asyncio.wait_for(began.wait(), 5)
        stopping = asyncio.create_task(scheduler.stop())
        await asyncio.sleep(0.05)
        assert not stopping.done()  # the run is still in progress
        release.set()
        await asyncio.wait_for(stopping, 5)  # not the starting task's hour
    finally:
        starter.cancel()
    assert not scheduler.is_leader


async def test_a_lease_left_by_a_dead_holder_runs_out(services: Services) -> None:
    short = services.settings.replace("scheduler", lease_ttl_s=0.2)
    lease = services.keys.lease(LEASE)
    dead = Scheduler(services.jobs, services.scripts, lease, short.scheduler)
    heir = Scheduler(services.jobs, services.scripts, lease, short.scheduler)
    assert await dead.hold_lease()  # then it dies without releasing
    assert not await heir.hold_lease()
    await asyncio.sleep(0.3)
    assert await heir.hold_lease()


@pytest.fixture
def fast_settings(settings: Settings) -> Settings:
    return settings.replace(
        "scheduler",
        sweep_interval_s=0.05,
        expire_packets_interval_s=0.05,
        repair_interval_s=0.2,
        lease_ttl_s=0.6,
    )


@pytest.fixture
def two_instances(fast_settings: Settings) -> Iterator[tuple[TestClient, TestClient]]:
    """Two app instances on one Redis and one database, each with its own scheduler."""
    with TestClient(create_app(fast_settings)) as one, TestClient(create_app(fast_settings)) as two:
        yield one, two


def _events(client: TestClient, kind: str) -> list[dict[str, Any]]:
    """The recorded events of this type, read through the app's database (either one)."""

    async def read() -> list[dict[str, Any]]:
        async with app_services(client).database.sessions() as session:
            rows = await session.scalars(select(EventRow.data).where(EventRow.type == kind))
            return [json.loads(row) for row in rows]

    return portal(client).call(read)


def _wait_for(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])
def test_two_schedulers_do_every_expiry_once(
    two_instances: tuple[TestClient, TestClient], fast_settings: Settings, tmp_path: Path
) -> None:
    one, two = two_instances
    one.post(
        "/v1/activities",
        json={"activity_id": "a1", "lock_ttl_s": 5, "team_deadline_s": 30},
        headers=ADMIN,
    )
    for t in range(4):
        one.post(
            "/v1/activities/a1/teams",
            json={"leader_id": f"L{t}", "team_id": f"t{t}"},
            headers=SERVICE,
        )
        two.post(f"/v1/activities/a1/teams/t{t}/locks", json={"user_id": f"u{t}"}, headers=SERVICE)
    one.post("/v1/accounts/s/deposits", json={"amount_cents": 100, "reference": "r"}, headers=ADMIN)
    for p in range(3):
        one.post(
            "/v1/redpackets",
            json={
                "sender_id": "s",
                "amount_cents": 20,
                "count": 4,
                "packet_id": f"pk{p}",
                "expires_in_s": 30,
            },
            headers=SERVICE,
        )
        two.post(f"/v1/redpackets/pk{p}/grab", json={"user_id": "g"}, headers=SERVICE)
    leaders = [app_services(c) for c in (one, two)]
    for services in leaders:
        services.clock.advance(31)

    _wait_for(
        lambda: (
            len(_events(one, "packet.refunded")) == 3
            and len(_events(one, "team.failed")) == 4
            and len(_events(one, "lock.expired")) == 4
        )
    )
    time.sleep(0.5)  # more job runs on both instances change nothing
    assert len(_events(one, "packet.refunded")) == 3
    assert len(_events(one, "team.failed")) == 4
    assert len(_events(one, "lock.expired")) == 4
    balance = one.get("/v1/accounts/s", headers=SERVICE).json()["balance_cents"]
    grabbed = sum(
        one.get(f"/v1/redpackets/pk{p}", headers=SERVICE).json()["grabs"][0]["amount_cents"]
        for p in range(3)
    )
    assert balance == 100 - grabbed  # every remainder came back exactly once


def test_admin_runs_a_job_and_reads_the_reconciliation(client: TestClient) -> None:
    ran = client.post("/v1/admin/jobs/sweep_locks/run", headers=ADMIN)
    assert ran.status_code == 200 and ran.json()["job"] == "sweep_locks"
    assert client.post("/v1/admin/jobs/sweep_locks/run", headers=SERVICE).status_code == 403
    missing = client.post("/v1/admin/jobs/nope/run", headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    before = client.get("/v1/admin/reconcile", headers=ADMIN)
    assert before.status_code == 404
    report = client.post("/v1/admin/jobs/reconcile/run", headers=ADMIN).json()
    assert report["job"] == "reconcile" and report["mismatches"] == []
    latest = client.get("/v1/admin/reconcile", headers=ADMIN)
    assert latest.status_code == 200 and latest.json()["id"] == report["id"]


async def test_ticks_log_nothing_per_tick_and_job_failures_still_show(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """APScheduler's two INFO lines per run are gone in any process running a scheduler
    (not only under the command line), our own jobs log nothing per tick, and a failing
    job is still one WARNING."""
    aps_log = logging.getLogger("apscheduler")
    before = aps_log.level
    aps_log.setLevel(logging.NOTSET)  # as in a process that configured nothing
    fast = services.settings.replace(
        "scheduler", sweep_interval_s=0.05, expire_packets_interval_s=0.05, lease_ttl_s=0.3
    ).scheduler
    runs = 0

    async def failing() -> dict[str, Any]:
        nonlocal runs
        runs += 1
        raise RuntimeError("boom")

    jobs = JobRunner([*services.jobs.jobs.values(), Job("failing", 0.05, failing)])
    scheduler = Scheduler(jobs, services.scripts, services.keys.lease(LEASE), fast)
    caplog.set_level(logging.DEBUG)
    try:
        scheduler.start()
        deadline = time.monotonic() + 5
        while runs < 8 or "sweep_locks" not in jobs.last_reports:
            assert time.monotonic() < deadline, "the jobs did not run"
            await asyncio.sleep(0.05)
        await scheduler.stop()
    finally:
        aps_log.setLevel(before)
    quiet = [r for r in caplog.records if r.name.startswith(("apscheduler", "groupbuy"))]
    # the lease said once when taken and once when given back, never per tick
    lease = [r.getMessage() for r in quiet if "scheduler lease" in r.getMessage()]
    assert lease == [
        "this process holds the scheduler lease now and runs the jobs",
        "this process no longer holds the scheduler lease",
    ]
    chatty = [
        r for r in quiet if r.levelno < logging.WARNING and "scheduler lease" not in r.getMessage()
    ]
    assert chatty == []
    failures = [r for r in quiet if "job failing failed" in r.getMessage()]
    assert len(failures) >= 8 and {r.levelno for r in failures} == {logging.WARNING}


async def test_a_late_job_is_said_once_per_episode_and_its_ticks_are_counted(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """A run that outlasts its interval: each tick meanwhile is skipped and counted, one
    WARNING names the job (not APScheduler's line on every tick), and only a run that ends
    within its interval closes the episode, so the next overrun is said again."""
    fast = services.settings.replace("scheduler", lease_ttl_s=3).scheduler  # taken at start
    gates: list[asyncio.Event] = []
    given: list[float] = []

    async def run() -> dict[str, Any]:
        return {}

    async def slow(seconds: float) -> dict[str, Any]:
        given.append(seconds)
        if len(gates) == 1 and gates[0].is_set():  # the second run ends at once: on time
            gates.append(asyncio.Event())
            gates[-1].set()
            return {}
        gates.append(asyncio.Event())
        await gates[-1].wait()
        return {}

    def skipped() -> float:
        labels = {"job": "slow"}
        return REGISTRY.get_sample_value("groupbuy_job_ticks_skipped_total", labels) or 0.0

    async def until(check: Any) -> None:
        deadline = time.monotonic() + 10
        while not check():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)

    before = skipped()
    scheduler = Scheduler(
        JobRunner([Job("slow", 0.05, run, run_within=slow)]),
        services.scripts,
        services.keys.lease(LEASE),
        fast,
    )
    caplog.set_level(logging.INFO)
    scheduler.start()
    try:
        await until(lambda: len(gates) == 1 and skipped() >= before + 3)  # episode one
        gates[0].set()
        await until(lambda: len(gates) == 3)  # the second run was on time; the third hangs
        await until(lambda: skipped() >= before + 6)  # episode two
        gates[2].set()
    finally:
        await scheduler.stop()
    late = [r for r in caplog.records if "has been running for" in r.getMessage()]
    assert len(late) == 2, [r.getMessage() for r in late]
    for record in late:
        assert (record.name, record.levelno) == ("groupbuy.ops.scheduler", logging.WARNING)
        assert record.getMessage().startswith("slow has been running for ")
        assert record.getMessage().endswith(" s (interval 0.05 s); its next run waits")
    assert not [r for r in caplog.records if "Scheduler._tick" in r.getMessage()]
    assert given and all(0 < seconds < 0.05 for seconds in given), given  # ends before a tick


async def test_a_job_refused_by_a_backing_service_is_said_once_per_outage_without_traceback(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that fails because too few replicas confirmed its writes, or because the
    database is away, is said once (no traceback) until a run of it succeeds; the next
    refusal after that is said again. Any other failure keeps its traceback."""
    fast = services.settings.replace("scheduler", lease_ttl_s=3).scheduler
    failures: list[Exception | None] = [
        *[errors.RedisReplicationTimeout("0 of the 1 replicas")] * 3,
        None,  # a run that succeeds ends the episode
        errors.RedisReplicationTimeout("0 of the 1 replicas"),
        *[sqlalchemy.exc.OperationalError("SELECT 1", {}, ConnectionRefusedError())] * 3,
        RuntimeError("boom"),
    ]
    runs = 0

    async def flaky() -> dict[str, Any]:
        nonlocal runs
        runs += 1
        failure = failures[runs - 1] if runs <= len(failures) else None
        if failure is not None:
            raise failure
        return {}

    database = Reachability("sqlite:///x.db", "database", unavailable)
    scheduler = Scheduler(
        JobRunner([Job("flaky", 0.02, flaky)]),
        services.scripts,
        services.keys.lease(LEASE),
        fast,
        database=database,
    )
    caplog.set_level(logging.INFO)
    scheduler.start()
    try:
        deadline = time.monotonic() + 10
        while runs <= len(failures):
            assert time.monotonic() < deadline, f"only {runs} runs"
            await asyncio.sleep(0.01)
    finally:
        await scheduler.stop()
    said = [(r.getMessage(), r.exc_info is not None) for r in caplog.records if r.levelno >= 30]
    refused = "job flaky cannot run now (0 of the 1 replicas); it is tried at each interval"
    assert [message for message, _traced in said] == [
        refused,
        refused,
        said[2][0],
        "job flaky failed; it runs again at its next interval",
    ], said
    assert said[2][0].startswith("database at sqlite:///x.db unreachable: "), said
    assert [traced for _message, traced in said] == [False, False, False, True], said
