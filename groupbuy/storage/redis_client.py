"""Connect to the configured Redis; with no URL, an in-process fakeredis server.

`groupbuy serve` with no URL runs the embedded engine (storage/embedded.py) and hands its
socket URL here; an empty URL reaching this module means fakeredis: the tests' backend,
or the service's fallback where no server binary can run. fakeredis and lupa are test
dependencies, not the service's: storage/fake_adapter.py, the one module that imports them,
is imported only here, only when that fallback is asked for (FakeRedisMissing otherwise).

With `[redis] sentinel`, the client is redis-py's Sentinel `master_for(sentinel_service)`:
its pool asks the Sentinels for the primary each time it opens a connection, so after a
failover the resends of the calls that failed (a dropped connection, READONLY from the
demoted primary) reach the promoted replica, with no restart.

With `[redis] cluster = true` the URL names any node of a Redis Cluster and the client is
redis-py's asyncio `RedisCluster`: it reads the slot map from that node, sends each
command to the primary serving its keys' slot and follows MOVED/ASK redirections. The
few things that concern every primary (scripts, the durability check, readiness) ask
each one (`primaries`).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialWithJitterBackoff

from groupbuy.settings import RedisSettings
from groupbuy.storage.pipelining import AutoPipeline, ClusterAutoPipeline, ReplicaWait

# Resends after a dropped connection, for plain commands and coalesced script calls alike.
RETRIES = 3
# The longest pause between two attempts (seconds): the cap of the exponential backoff.
BACKOFF_CAP_S = 0.5
FAKEREDIS_DESCRIPTION = "in-process fakeredis (not durable, one process)"
FAKEREDIS_MISSING = (
    "the in-process fakeredis is not installed (a test dependency): "
    "pip install 'groupbuy[test]', or fakeredis[lua] and lupa"
)


class FakeRedisMissing(RuntimeError):
    """The in-process fakeredis was asked for where fakeredis or lupa is not installed."""


def fake_adapter() -> ModuleType:
    """groupbuy.storage.fake_adapter, imported now (it imports fakeredis and lupa);
    FakeRedisMissing, saying how to install them, where either is missing."""
    try:
        from groupbuy.storage import fake_adapter as adapter
    except ModuleNotFoundError as error:
        if error.name not in ("fakeredis", "lupa"):
            raise
        raise FakeRedisMissing(FAKEREDIS_MISSING) from error
    return adapter


def connect_redis(settings: RedisSettings) -> Any:
    """An asyncio Redis client (a `RedisCluster` when `[redis] cluster`); with no URL, one on
    a fresh fakeredis server (Lua via lupa; groupbuy/storage/fake_adapter.py)."""
    if settings.embedded:
        return fake_adapter().fake_redis()
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.socket_timeout_s,
        # Per node in a cluster.
        "max_connections": settings.max_connections,
        "health_check_interval": 30,
        # Resend after a dropped connection (a Redis restart, a failover): every script
        # is idempotent, so a command that did run before the drop is not applied twice.
        # A cluster client also reads the slot map again before each resend.
        "retry": Retry(ExponentialWithJitterBackoff(base=0.01, cap=BACKOFF_CAP_S), RETRIES),
        "retry_on_error": [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    }
    if settings.sentinel:
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            settings.sentinel_addresses,
            sentinel_kwargs={
                "socket_timeout": settings.socket_timeout_s,
                "socket_connect_timeout": settings.socket_timeout_s,
                "decode_responses": True,
            },
        )
        return sentinel.master_for(
            settings.sentinel_service, redis_class=SentinelPrimary, **options
        )
    if settings.cluster:
        return RedisCluster.from_url(settings.url, **options)
    return aioredis.Redis.from_url(settings.url, **options)


class SentinelPrimary(aioredis.Redis):
    """The client of the primary a Sentinel set names; closing it closes the connections to
    the Sentinels too (redis-py leaves those to whoever made the Sentinel object)."""

    @property
    def sentinels(self) -> Sentinel:
        """The Sentinels this client asks for the primary (and the replicas)."""
        manager: Sentinel = self.connection_pool.sentinel_manager  # type: ignore[attr-defined]
        return manager

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            await self.sentinels.aclose()


def replica_wait(settings: RedisSettings) -> ReplicaWait | None:
    """What every mutating script call waits for (`[redis] wait_replicas`), or None."""
    if not settings.wait_replicas:
        return None
    return ReplicaWait(settings.wait_replicas, settings.wait_timeout_s)


def is_cluster(redis: Any) -> bool:
    """Whether `redis` is a Redis Cluster client."""
    return isinstance(redis, RedisCluster)


def every_primary(redis: Any) -> dict[str, Any]:
    """The keyword that sends a command to every primary of a cluster (none for one server);
    on a cluster the command then answers a dict of each primary's reply by node name."""
    return {"target_nodes": RedisCluster.PRIMARIES} if is_cluster(redis) else {}


async def primaries(redis: Any) -> list[str]:
    """The `host:port` of each primary a cluster client knows (the slot map read first if it
    was not yet), or `['']` for one server."""
    if not is_cluster(redis):
        return [""]
    await redis.initialize()
    return sorted(node.name for node in redis.get_primaries())


def per_primary(redis: Any, reply: Any) -> dict[str, Any]:
    """A reply of a command sent with `every_primary`, as {node name: reply}; one server's
    reply under ''."""
    if is_cluster(redis):
        return dict(reply)
    return {"": reply}


def auto_pipeline(redis: Any, settings: RedisSettings) -> AutoPipeline | ClusterAutoPipeline | None:
    """The coalescing layer for script calls on this client, or None when turned off; on a
    cluster, one coalescing pipeline per primary with calls routed by their keys' slot."""
    if not settings.auto_pipeline:
        return None
    if is_cluster(redis):
        return ClusterAutoPipeline(
            redis,
            max_batch=settings.pipeline_max_batch,
            max_in_flight=settings.pipeline_max_in_flight,
            socket_timeout_s=settings.socket_timeout_s,
            retries=RETRIES,
        )
    return AutoPipeline(
        redis.connection_pool,
        max_batch=settings.pipeline_max_batch,
        max_in_flight=settings.pipeline_max_in_flight,
        socket_timeout_s=None if settings.embedded else settings.socket_timeout_s,
        retries=RETRIES,
        wait=replica_wait(settings),
    )


def resend_window_ms(settings: RedisSettings) -> int:
    """How long after a call its resends can still arrive, with a margin of 2x: every attempt
    waits up to the socket timeout and the pauses between them up to the backoff cap (at
    least 10 s). A script that recognises a resend (packet_grab's request token) does so for
    this long."""
    attempts = RETRIES + 1
    worst_s = attempts * settings.socket_timeout_s + RETRIES * BACKOFF_CAP_S
    return max(10_000, math.ceil(2 * worst_s * 1000))


def describe(settings: RedisSettings) -> str:
    """Where Redis is, for start-up messages (no credentials)."""
    if settings.embedded:
        return FAKEREDIS_DESCRIPTION
    if settings.sentinel:
        return f"the primary of {settings.sentinel_service!r} (Sentinels {settings.sentinel})"
    where = settings.url.split("@")[-1]
    return f"{where} (cluster)" if settings.cluster else where
