"""The composition root: every service built once, and the one start/stop path.

Both `groupbuy serve` (the app's lifespan) and `groupbuy worker` build their services
here and run them inside `running(...)`; nothing else wires objects together, and
nothing imports the HTTP app to reach a service.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from groupbuy import metrics, migrations
from groupbuy.locks.engine import TeamEngine
from groupbuy.locks.funnel import FunnelFlusher, FunnelStore
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.ops.audit import AuditLog
from groupbuy.ops.blocklist import BlocklistService
from groupbuy.ops.jobs import JobRunner, Wakeup, build_jobs
from groupbuy.ops.reconcile import Reconciler
from groupbuy.ops.scheduler import LEASE, Scheduler
from groupbuy.redpacket.acks import AckJournal
from groupbuy.redpacket.engine import RedPackets
from groupbuy.redpacket.writer import PacketRecordWriter
from groupbuy.settings import Settings
from groupbuy.storage.backends import Backends
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.db import Database
from groupbuy.storage.deadletters import DeadLetters
from groupbuy.storage.durability import RedisNotDurable, RedisTopologyMismatch, check_redis
from groupbuy.storage.keys import Keys
from groupbuy.storage.outbox import RecordWriter
from groupbuy.storage.reachability import Reachability
from groupbuy.storage.redis_client import (
    auto_pipeline,
    connect_redis,
    describe,
    replica_wait,
    resend_window_ms,
)
from groupbuy.storage.specs import Scripts
from groupbuy.storage.throttles import GuessThrottle, RateLimitService
from groupbuy.webhooks.service import WebhookService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Services:
    """Everything the API and the scheduler use, built once per process."""

    settings: Settings
    redis: Any
    database: Database
    scripts: Scripts
    keys: Keys
    clock: RedisClock
    team_writer: TeamRecordWriter
    teams: TeamEngine
    packets: RedPackets  # the packet writer and the grab journal are its `writer`, `acks`
    reconciler: Reconciler
    jobs: JobRunner
    reachability: Reachability  # logs each change of Redis's reachability once
    blocklist: BlocklistService
    ratelimit: RateLimitService
    dead_letters: DeadLetters
    webhooks: WebhookService
    audit: AuditLog  # who changed what, why and when (SQL)
    guesses: GuessThrottle  # failed authentications per client address (SPEC §3)
    funnel: FunnelFlusher  # the console's sale funnel: this process's counts into Redis

    @property
    def writers(self) -> tuple[RecordWriter, ...]:
        """Each engine's write-behind: teams, then packets."""
        return (self.team_writer, self.packets.writer)


def build_services(
    settings: Settings, redis: Any = None, database: Database | None = None
) -> Services:
    """Wire the services; `redis` and `database` may be handed in (tests, tools)."""
    redis = redis if redis is not None else connect_redis(settings.redis)
    database = database or Database(settings.database.effective_url, settings.database.timeout_s)
    scripts = Scripts(
        redis, auto_pipeline(redis, settings.redis), wait=replica_wait(settings.redis)
    )
    keys = Keys(settings.redis.key_prefix, cluster=settings.redis.cluster)
    clock = RedisClock()
    reachability = Reachability(describe(settings.redis))
    backends = Backends(redis, scripts, database, keys, clock)
    dead_letters = DeadLetters(backends)
    batch_size, limits = settings.outbox.batch_size, settings.redpackets
    team_writer = TeamRecordWriter(backends, batch_size, dead_letters, reachability)
    teams = TeamEngine.build(backends, settings.teams, team_writer)
    packet_writer = PacketRecordWriter(
        backends, batch_size, limits.reclaim_idle_s, dead_letters=dead_letters
    )
    acks = AckJournal(database, settings.outbox.ack_journal_interval_s)
    recorded = Wakeup()  # a grab's record written: flush_records runs now in the lease holder
    packets = RedPackets.build(
        backends,
        limits,
        packet_writer,
        acks,
        resend_window_ms=resend_window_ms(settings.redis),
        recorded=recorded,
    )
    reconciler = Reconciler(redis, database, keys, clock=clock)
    blocklist = BlocklistService(backends)
    jobs = JobRunner(
        build_jobs(
            settings,
            teams,
            packets,
            team_writer,
            packet_writer,
            reconciler,
            redis,
            blocklist,
            recorded,
        )
    )
    return Services(
        settings,
        redis,
        database,
        scripts,
        keys,
        clock,
        team_writer,
        teams,
        packets,
        reconciler,
        jobs,
        reachability,
        blocklist=blocklist,
        ratelimit=RateLimitService(settings.ratelimit, scripts, keys, clock),
        dead_letters=dead_letters,
        webhooks=WebhookService(database, settings.webhooks),
        audit=AuditLog(database),
        guesses=GuessThrottle(settings.auth, scripts, keys),
        funnel=FunnelFlusher(FunnelStore(redis, keys, clock)),
    )


def build_scheduler(services: Services) -> Scheduler:
    """The scheduler of this process: the jobs, under the shared lease."""
    return Scheduler(
        services.jobs,
        services.scripts,
        services.keys.lease(LEASE),
        services.settings.scheduler,
        services.reachability,
        services.database.reachability,
    )


@contextlib.asynccontextmanager
async def running(services: Services, scheduler: bool = True) -> AsyncIterator[Services]:
    """Start the services (the schema, the Redis durability check, scripts, the scheduler
    when `scheduler` and enabled), yield them, and stop everything in reverse order,
    whatever happened inside. SchemaNotCurrent when the database is not at this version's
    revision (SQLite upgrades itself instead); RedisNotDurable when `[redis] strict` and
    Redis could lose writes; RedisTopologyMismatch when `[redis] cluster` does not match the
    server."""
    try:
        await migrations.prepare(services.database)
    except BaseException:  # not started: nothing else will close them
        await services.database.dispose()
        await services.redis.aclose()
        raise
    try:
        await check_redis(services.redis, services.settings.redis, services.reachability.where)
    except (RedisNotDurable, RedisTopologyMismatch):
        await services.database.dispose()
        await services.redis.aclose()
        raise
    except Exception as error:  # Redis away: said once below, and the service starts anyway
        if not services.reachability.failed(error):
            log.warning("could not check Redis's persistence settings", exc_info=True)
    try:
        await services.scripts.load()
        services.reachability.answered()
    except Exception as error:
        # Start anyway: /readyz loads them, and scripts load themselves on first use.
        if not services.reachability.failed(error):
            log.warning("could not load the Lua scripts at start-up", exc_info=True)
    try:
        await services.blocklist.sync()
    except Exception as error:
        # Start anyway: the repair job rebuilds Redis's copy of the blocked users.
        if not services.reachability.failed(error):
            log.warning("could not copy the blocked users into Redis at start-up", exc_info=True)
    services.funnel.start()
    jobs = build_scheduler(services)
    if scheduler and services.settings.scheduler.enabled:
        jobs.start()
    services.packets.acks.start()
    if services.settings.webhooks.enabled:
        services.webhooks.start_delivering()
    settle_heap()
    try:
        yield services
    finally:
        await jobs.stop()
        await services.funnel.stop()
        await services.webhooks.stop_delivering()
        await services.packets.acks.stop()
        await services.database.dispose()
        await services.scripts.aclose()
        await services.redis.aclose()
        metrics.process_exited()


def settle_heap() -> None:
    """Move everything allocated at start-up out of the garbage collector's reach.

    Imports and wiring leave a few hundred thousand long-lived objects; every full
    collection walked them all, which showed as stalls at the 99th percentile of grabs
    offered at half the maximum rate (docs/benchmarks-findings.md).
    """
    gc.collect()
    gc.freeze()
