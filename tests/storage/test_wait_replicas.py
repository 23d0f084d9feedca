"""`[redis] wait_replicas`: a mutating script call answers only once that many replicas hold
its writes (WAIT on the same connection), else 503 redis_replication_timeout with the write
applied on the primary; read-only scripts and the unreplicated ones never wait. The
write-behind writes to SQL only records the replicas hold."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import select

from groupbuy import errors, metrics
from groupbuy.locks.models import TeamRow
from groupbuy.redpacket.models import GrabRow
from groupbuy.services import Services, build_services, running
from groupbuy.settings import Settings
from groupbuy.storage.pipelining import AutoPipeline, ReplicaWait
from groupbuy.storage.specs import UNREPLICATED, script_names, waits_for_replicas
from tests.support.http import ADMIN, SERVICE
from tests.support.servers import RedisProcess, server_binary, start_redis
from tests.support.settings import settings_for
from tests.support.storm import running_app

needs_server = pytest.mark.skipif(
    server_binary() is None and not os.environ.get("CI"), reason="needs a server binary"
)
# Long enough for a healthy replica on a loaded machine (load 13 on 2 cores saw 300 ms
# go by without an acknowledgement); the stopped replica costs it once per refused call.
WAIT_TIMEOUT_S = 1.5


@dataclass
class Replicated:
    """A primary and one replica; the replica can be stopped (SIGSTOP) and resumed."""

    primary: RedisProcess
    replica: RedisProcess

    def replica_client(self) -> redis.Redis:
        return redis.Redis(port=self.replica.port, decode_responses=True, socket_timeout=5)

    def primary_client(self) -> redis.Redis:
        return redis.Redis(port=self.primary.port, decode_responses=True, socket_timeout=5)

    def caught_up(self, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with self.primary_client() as client:
                info = client.info("replication")
            replica = info.get("slave0")
            if (
                isinstance(replica, dict)
                and replica["state"] == "online"
                and int(replica["offset"]) >= int(info["master_repl_offset"])
            ):
                return
            assert time.monotonic() < deadline, info
            time.sleep(0.02)

    def pause_replica(self) -> None:
        os.kill(self.replica.process.pid, signal.SIGSTOP)

    def resume_replica(self) -> None:
        os.kill(self.replica.process.pid, signal.SIGCONT)


@pytest.fixture
def replicated() -> Iterator[Replicated]:
    primary = start_redis("--repl-diskless-sync-delay", "0")  # the replica syncs at once
    replica = None
    try:
        replica = start_redis("--replicaof", "127.0.0.1", str(primary.port))
        pair = Replicated(primary, replica)
        pair.caught_up()
        yield pair
    finally:
        if replica is not None:
            os.kill(replica.process.pid, signal.SIGCONT)
            replica.stop()
        primary.stop()


def wait_settings(database_url: str, pair: Replicated, coalesced: bool) -> Settings:
    base = settings_for(pair.primary.url, database_url)
    redis_settings = base.redis.model_copy(
        update={
            "wait_replicas": 1,
            "wait_timeout_s": WAIT_TIMEOUT_S,
            "auto_pipeline": coalesced,
            "socket_timeout_s": 2.0,
        }
    )
    return base.model_copy(update={"redis": redis_settings})


@pytest.fixture(params=[True, False], ids=["coalesced", "one-evalsha-each"])
async def services(
    request: pytest.FixtureRequest, database_url: str, replicated: Replicated
) -> AsyncIterator[Services]:
    async with running(
        build_services(wait_settings(database_url, replicated, request.param)), scheduler=False
    ) as started:
        yield started


def test_every_script_that_may_write_waits_but_the_unreplicated_ones() -> None:
    waited = {name for name in script_names() if waits_for_replicas(name)}
    assert "packet_grab" in waited and "team_lock" in waited and "team_confirm" in waited
    assert "user_lock_read" not in waited  # flags=no-writes
    assert not (UNREPLICATED & waited)
    assert "outbox_ack" in UNREPLICATED  # a lost acknowledgement only applies records again
    reads = {"user_lock_read", "waitlist_read", "waitlist_lines"}  # flags=no-writes
    assert waited | UNREPLICATED | reads == set(script_names())


@pytest.mark.real
@needs_server
async def test_a_grab_is_on_the_replica_when_answered_and_503s_when_it_cannot_be(
    services: Services, replicated: Replicated
) -> None:
    packets = services.packets
    await packets.accounts.deposit("sender", 1_000, "funds")
    await packets.sending.send("sender", 1_000, 10, packet_id="pk")
    await services.teams.activities.create_activity("act")
    grabs_key = services.keys.packet_keys("pk").grabs
    answer = await packets.grabs.grab("pk", "u1")
    assert answer["status"] == "grabbed"
    with replicated.replica_client() as replica:
        assert replica.hexists(grabs_key, "u1")  # there before the answer left

    timeouts = metrics.REPLICATION_TIMEOUTS._value.get()
    replicated.pause_replica()
    try:
        with pytest.raises(errors.RedisReplicationTimeout) as refused:
            await packets.grabs.grab("pk", "u2")
        assert metrics.REPLICATION_TIMEOUTS._value.get() == timeouts + 1
        assert refused.value.status_code == 503
        assert refused.value.extra == {"replicas_acknowledged": 0, "replicas_wanted": 1}
        with replicated.primary_client() as primary:
            assert primary.hexists(grabs_key, "u2")  # applied on the primary
        # A read-only script and the rate limits do not wait for the replica.
        with pytest.raises(errors.NoLock):
            await services.teams.seats.current_lock("act", "u2")
        assert await services.ratelimit.take("grab", "key", "u2") is not None
    finally:
        replicated.resume_replica()
    replicated.caught_up()
    # The client's retry answers the same share, now confirmed by the replica.
    again = await packets.grabs.grab("pk", "u2")
    assert again["status"] == "already_grabbed"
    view = await packets.reads.get("pk")
    amounts = {g["user_id"]: g["amount_cents"] for g in view["grabs"]}
    assert again["amount_cents"] == amounts["u2"]
    with replicated.replica_client() as replica:
        assert replica.hexists(grabs_key, "u2")


@pytest.mark.real
@needs_server
async def test_the_api_answers_503_redis_replication_timeout_and_the_retry_the_same(
    database_url: str, replicated: Replicated
) -> None:
    settings = wait_settings(database_url, replicated, coalesced=True)
    async with running_app(settings) as (_app, client):
        deposit = {"amount_cents": 1_000, "reference": "funds"}
        assert (
            await client.post("/v1/accounts/sender/deposits", json=deposit, headers=ADMIN)
        ).status_code == 201
        body = {"sender_id": "sender", "amount_cents": 1_000, "count": 10, "packet_id": "pk"}
        sent = await client.post("/v1/redpackets", json=body, headers=SERVICE)
        assert sent.status_code == 201, sent.text
        replicated.pause_replica()
        try:
            response = await grab(client, "u1")
        finally:
            replicated.resume_replica()
        assert response.status_code == 503, response.text
        problem = response.json()
        assert response.headers["content-type"] == "application/problem+json"
        assert (problem["code"], problem["replicas_acknowledged"]) == (
            "redis_replication_timeout",
            0,
        )
        replicated.caught_up()
        retry = await grab(client, "u1")
        assert retry.status_code == 200 and retry.json()["status"] == "already_grabbed"


@pytest.mark.real
@needs_server
async def test_the_write_behind_writes_to_sql_only_what_the_replica_holds(
    services: Services, replicated: Replicated
) -> None:
    """A record the replica has not confirmed stays out of SQL: a failover could take it
    back from Redis, and the grab retried on the promoted replica would then get another
    share than the row SQL kept. It goes in once the replica has it."""
    packets, teams = services.packets, services.teams
    await packets.accounts.deposit("sender", 1_000, "funds")
    await packets.sending.send("sender", 1_000, 10, packet_id="pk")
    await teams.activities.create_activity("act")
    assert (await packets.grabs.grab("pk", "u1"))["status"] == "grabbed"
    await services.jobs.run("flush_records")
    assert await recorded(services) == ({"u1"}, set())

    replicated.pause_replica()
    try:
        with pytest.raises(errors.RedisReplicationTimeout):
            await packets.grabs.grab("pk", "u2")  # applied on the primary only
        with pytest.raises(errors.RedisReplicationTimeout):
            await teams.activities.open_team("act", "leader", team_id="t1")
        # Each writer reads the records, and neither writes them: the replica lacks them.
        with pytest.raises(errors.RedisReplicationTimeout) as refused:
            await packets.writer.drain("pk")
        assert refused.value.extra == {"replicas_acknowledged": 0, "replicas_wanted": 1}
        with pytest.raises(errors.RedisReplicationTimeout):
            await services.team_writer.drain("act")
        assert await recorded(services) == ({"u1"}, set())
        with pytest.raises(errors.RedisReplicationTimeout):  # the job, likewise
            await services.jobs.run("flush_records")
    finally:
        replicated.resume_replica()
    replicated.caught_up()
    report = await services.jobs.run("flush_records")
    assert report["backlog"] == 0, report
    assert await recorded(services) == ({"u1", "u2"}, {"t1"})


async def recorded(services: Services) -> tuple[set[str], set[str]]:
    """The users with a grab row of packet pk, and the teams of activity act, in SQL."""
    async with services.database.sessions() as session:
        grabs = await session.scalars(select(GrabRow.user_id).where(GrabRow.packet_id == "pk"))
        teams = await session.scalars(select(TeamRow.team_id).where(TeamRow.activity_id == "act"))
        return set(grabs), set(teams)


async def grab(client: httpx.AsyncClient, user_id: str) -> httpx.Response:
    return await client.post("/v1/redpackets/pk/grab", json={"user_id": user_id}, headers=SERVICE)


WRITE = "redis.call('INCR', KEYS[1]) return redis.call('GET', KEYS[1])"
READ = "return redis.call('GET', KEYS[1])"


@pytest.mark.real
@needs_server
async def test_one_wait_per_batch_covers_its_writes_and_spares_the_calls_that_need_none(
    replicated: Replicated,
) -> None:
    client = redis.asyncio.Redis(port=replicated.primary.port, decode_responses=True)
    try:
        write, read = client.register_script(WRITE), client.register_script(READ)
        await client.script_load(WRITE)
        await client.script_load(READ)
        await client.config_resetstat()
        pipeline = AutoPipeline(
            client.connection_pool,
            max_batch=256,
            max_in_flight=1,  # calls made together leave together
            socket_timeout_s=5.0,
            wait=ReplicaWait(1, WAIT_TIMEOUT_S),
        )

        async def call(script: Any, waits: bool) -> Any:
            return await pipeline.evalsha(script.sha, script.script, ["n"], [], wait=waits)

        answers = await asyncio.gather(*(call(write, True) for _ in range(100)))
        assert sorted(int(str(a)) for a in answers) == list(range(1, 101))
        stats = await client.info("commandstats")
        waits = int(stats["cmdstat_wait"]["calls"])
        assert waits == pipeline.batches < 100  # one WAIT per batch, not per call

        batches = pipeline.batches
        replicated.pause_replica()
        try:
            mixed = await asyncio.gather(
                call(write, True), call(read, False), return_exceptions=True
            )
        finally:
            replicated.resume_replica()
        assert isinstance(mixed[0], errors.RedisReplicationTimeout)
        assert mixed[1] == "101"  # in the same batch, answered: it asked for no WAIT
        assert pipeline.batches == batches + 1
        await pipeline.aclose()
    finally:
        await client.aclose()
