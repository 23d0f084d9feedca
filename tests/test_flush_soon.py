"""The write-behind runs as soon as there is work: woken by this process's grabs, finding
other processes' records by its poll, only in the lease holder, quiet when idle, stopped
with its scheduler."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from groupbuy import errors
from groupbuy.ops.jobs import Job, JobRunner, Prompt, Report, Wakeup
from groupbuy.ops.scheduler import LEASE, Scheduler
from groupbuy.redpacket.models import GrabRow
from groupbuy.services import Services, build_scheduler, build_services
from groupbuy.settings import Settings
from groupbuy.storage.calls import lease_hold, lease_release
from groupbuy.storage.db import Database
from tests.support.counting import commands_processed
from tests.support.fixtures import SendPacketViaServices
from tests.support.money import count

# Far longer than any test here waits: a credit that arrives was not brought by the interval.
LONG_INTERVAL_S = 30.0
# A poll longer than the tests: only a wakeup can explain a flush (or a prompt stop).
NO_POLL_S = 60.0
# The poll of the tests that rely on it: a few of them fit in a short wait.
SHORT_POLL_S = 0.02
# How long a credit may take here (the machine may be slow): far below LONG_INTERVAL_S.
CREDIT_WITHIN_S = 3.0
# How long a stop may take with nothing running: far below NO_POLL_S.
STOP_WITHIN_S = 5.0
LEASE_TTL_S = 30.0  # renewed every 10 s: no renewal inside a counted window


def flush_settings(settings: Settings, poll_s: float) -> Settings:
    """The test's settings with a long flush interval, the given poll and a long lease."""
    return settings.replace(
        "outbox", flush_interval_s=LONG_INTERVAL_S, flush_poll_s=poll_s
    ).replace("scheduler", lease_ttl_s=LEASE_TTL_S)


def flush_only(services: Services) -> Scheduler:
    """A scheduler running flush_records alone (the other jobs' Redis calls stay out of a
    count), under the shared lease."""
    return Scheduler(
        JobRunner([services.jobs.jobs["flush_records"]]),
        services.scripts,
        services.keys.lease(LEASE),
        services.settings.scheduler,
    )


async def until(check: Any, seconds: float, what: str) -> None:
    """Wait until the async `check()` is true; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def leading(scheduler: Scheduler) -> None:
    """Wait until the started scheduler has taken the lease (its first renewal is at once)."""

    async def leads() -> bool:
        return scheduler.is_leader

    await until(leads, CREDIT_WITHIN_S, "the lease")


async def credited(services: Services, grabs: int) -> bool:
    """Whether SQL holds this many grab rows."""
    return await count(services, GrabRow) == grabs


@pytest.fixture
async def other_process(services: Services) -> AsyncIterator[Services]:
    """A second set of services on the same Redis and database, as another process has."""
    database = Database(services.settings.database.effective_url)
    other = build_services(services.settings, redis=services.redis, database=database)
    await other.scripts.load()
    try:
        yield other
    finally:
        await other.scripts.aclose()
        await database.dispose()


class TestWokenByWork:
    """A leader with a long interval and no poll: only the grab's wakeup can flush."""

    @pytest.fixture
    def settings(self, settings: Settings) -> Settings:
        return flush_settings(settings, NO_POLL_S)

    async def test_a_grab_is_credited_long_before_the_interval_and_stop_is_prompt(
        self, services: Services, sent_packet_via_services: SendPacketViaServices
    ) -> None:
        """The leader's grab wakes flush_records: its row and credit are in SQL within
        seconds of a 30 s interval; stop() ends the follower at once, not at its poll."""
        await sent_packet_via_services(100, 4, funds=100)
        scheduler = build_scheduler(services)
        scheduler.start()
        try:
            await leading(scheduler)
            answer = await services.packets.grabs.grab("pk", "u1")
            assert answer["status"] == "grabbed"
            await until(lambda: credited(services, 1), CREDIT_WITHIN_S, "the grab row")
            balance = (await services.packets.accounts.account("u1"))["balance_cents"]
            assert balance == answer["amount_cents"]
        finally:
            await asyncio.wait_for(scheduler.stop(), STOP_WITHIN_S)
        assert not scheduler.is_leader


@pytest.mark.parametrize("database", ["sqlite"])  # the database plays no part in who flushes
class TestLeaderOnly:
    """Two processes: only the lease holder flushes, and its poll finds the other's work."""

    @pytest.fixture
    def settings(self, settings: Settings) -> Settings:
        return flush_settings(settings, SHORT_POLL_S)

    async def test_a_follower_does_not_flush_and_the_holder_polls_its_work(
        self,
        services: Services,
        other_process: Services,
        sent_packet_via_services: SendPacketViaServices,
    ) -> None:
        """A grab in a process without the lease wakes its follower, which leaves it (its
        job never runs); once the other process holds the lease, its poll finds the record
        and flushes it, long before the interval."""
        await sent_packet_via_services(100, 4, funds=100)
        lease = services.keys.lease(LEASE)
        assert await lease_hold(services.scripts, lease, "a stalled holder", 60_000)
        follower = build_scheduler(services)
        follower.start()
        holder = build_scheduler(other_process)
        try:
            await services.packets.grabs.grab("pk", "u1")
            polls = 15  # the follower is woken, then polls this often with the record waiting
            await asyncio.sleep(polls * SHORT_POLL_S)
            assert not follower.is_leader
            assert "flush_records" not in services.jobs.last_reports
            assert await services.packets.writer.backlog() == 1
            assert await count(services, GrabRow) == 0

            assert await lease_release(services.scripts, lease, "a stalled holder")
            holder.start()
            await until(lambda: credited(services, 1), CREDIT_WITHIN_S, "the grab row")
            assert holder.is_leader and not follower.is_leader
            assert "flush_records" not in services.jobs.last_reports
        finally:
            await follower.stop()
            await holder.stop()


@pytest.mark.parametrize("database", ["sqlite"])
@pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])
class TestIdle:
    """An idle leader polls at its pace and no faster; after stop() it sends nothing."""

    @pytest.fixture
    def settings(self, settings: Settings) -> Settings:
        return flush_settings(settings, SHORT_POLL_S * 5)

    async def test_an_idle_leader_reads_the_indexes_once_per_poll_and_stops(
        self, services: Services
    ) -> None:
        """Over an idle window the server sees about one read per writer per poll (a loop
        that spun would send thousands); once stopped, none."""
        poll_s = services.settings.outbox.flush_poll_s
        window_s = 1.0
        writers = len(services.writers)
        scheduler = flush_only(services)
        scheduler.start()
        try:
            await leading(scheduler)
            before = await commands_processed(services.redis)
            await asyncio.sleep(window_s)
            idle = await commands_processed(services.redis) - before
        finally:
            await asyncio.wait_for(scheduler.stop(), STOP_WITHIN_S)
        polls_at_most = window_s / poll_s + 1
        assert writers <= idle <= writers * polls_at_most, idle
        before = await commands_processed(services.redis)
        await asyncio.sleep(window_s / 2)
        assert await commands_processed(services.redis) - before == 0


@pytest.mark.parametrize("database", ["sqlite"])
@pytest.mark.parametrize("backend", ["fake"])  # Redis only holds the lease here
async def test_a_woken_run_that_outlasts_its_interval_is_late_as_a_ticked_one_was(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """A prompt job's run that goes on past its interval counts a skipped tick per interval
    and is said once, as APScheduler's ticks made it; the next run starts after it ends."""
    interval_s = 0.05
    release = asyncio.Event()
    runs: list[float] = []

    async def slow(seconds: float) -> Report:
        runs.append(seconds)
        if len(runs) == 1:
            await release.wait()
        return {}

    async def skipped_at_least(ticks: float) -> bool:
        return (REGISTRY.get_sample_value("groupbuy_job_ticks_skipped_total", labels) or 0) >= ticks

    labels = {"job": "slow_prompt"}
    before = REGISTRY.get_sample_value("groupbuy_job_ticks_skipped_total", labels) or 0
    wakeup = Wakeup()
    scheduler = prompt_scheduler(services, "slow_prompt", interval_s, slow, wakeup, busy=False)
    caplog.set_level(logging.INFO)
    scheduler.start()
    try:
        await leading(scheduler)
        wakeup()
        await until(lambda: skipped_at_least(before + 3), CREDIT_WITHIN_S, "skipped ticks")
        release.set()
        wakeup()

        async def ran_again() -> bool:
            return len(runs) >= 2

        await until(ran_again, CREDIT_WITHIN_S, "the next run")
    finally:
        await asyncio.wait_for(scheduler.stop(), STOP_WITHIN_S)
    late = [r.getMessage() for r in caplog.records if "has been running for" in r.getMessage()]
    assert len(late) == 1, late
    assert late[0].endswith(" s (interval 0.05 s); its next run waits"), late
    assert all(0 < seconds < interval_s for seconds in runs), runs


@pytest.mark.parametrize("database", ["sqlite"])
@pytest.mark.parametrize("backend", ["fake"])  # Redis only holds the lease here
async def test_a_failing_run_is_retried_at_its_interval_however_often_work_wakes_it(
    services: Services,
) -> None:
    """SQL away: a woken run fails, and the next waits for the interval, not for the next
    grab's wakeup (a fast failure would otherwise repeat as fast as grabs come)."""
    interval_s, window_s, wake_every_s = 0.2, 0.6, 0.01
    runs = 0

    async def failing(seconds: float) -> Report:
        nonlocal runs
        runs += 1
        raise errors.DatabaseUnavailable("the database is away")

    wakeup = Wakeup()
    scheduler = prompt_scheduler(services, "failing_prompt", interval_s, failing, wakeup, busy=True)
    scheduler.start()
    try:
        await leading(scheduler)
        began = time.monotonic()
        while time.monotonic() - began < window_s:  # grabs waking it all along
            wakeup()
            await asyncio.sleep(wake_every_s)
    finally:
        await asyncio.wait_for(scheduler.stop(), STOP_WITHIN_S)
    assert 1 <= runs <= round(window_s / interval_s) + 1, runs


def prompt_scheduler(
    services: Services,
    name: str,
    interval_s: float,
    run_within: Callable[[float], Awaitable[Report]],
    wakeup: Wakeup,
    busy: bool,
) -> Scheduler:
    """A scheduler of one prompt job `name` that `wakeup` wakes, whose poll finds no work
    and whose every run reports work done (`busy`) or none."""

    async def nothing() -> Report:
        return {}

    async def no_work() -> bool:
        return False

    prompt = Prompt(wakeup, no_work, NO_POLL_S, lambda report: busy)
    job = Job(name, interval_s, nothing, run_within=run_within, prompt=prompt)
    return Scheduler(
        JobRunner([job]),
        services.scripts,
        services.keys.lease(LEASE),
        flush_settings(services.settings, NO_POLL_S).scheduler,
    )
