"""Whether the Redis in use keeps what the service acknowledges, checked once at start.

Money lives in Redis between a grab's answer and its SQL record, and seats live there
only. SPEC §5: that needs persistence that survives a crash (`appendonly yes`, ideally
`appendfsync always`) and `maxmemory-policy noeviction`. The service reads those three
settings when it starts and warns for each one that risks acknowledged writes, or, with
`[redis] strict = true`, refuses to start. A server that does not let us read its CONFIG
(a managed Redis often renames or forbids it) is said to be unchecked. Settings with no
URL build the in-process fakeredis, the declared non-durable fallback: it warns of itself
and `check_redis` does not check it.

On a Redis Cluster each primary keeps its own shard, so each one is checked: one warning
per primary and setting, each naming the primary.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from groupbuy.settings import RedisSettings, SettingsError
from groupbuy.storage.redis_client import every_primary, per_primary

log = logging.getLogger(__name__)


class RedisNotDurable(SettingsError):
    """`[redis] strict = true` and Redis could lose acknowledged writes: refuse to start."""


class RedisTopologyMismatch(SettingsError):
    """`[redis] cluster` says one thing and the server at the URL another: refuse to start
    (otherwise the first script call fails with MOVED, or every call with a cluster error)."""


async def check_redis(client: Any, settings: RedisSettings, where: str) -> None:
    """The start-up checks of the Redis at `where`: its topology, its durability (not for
    the in-process fakeredis, which warns of itself) and its replicas. RedisNotDurable or
    RedisTopologyMismatch refuse the start."""
    await check_topology(client, settings)
    if not settings.embedded:
        await check_durability(client, where, settings.strict)
    await check_replicas(client, settings)


async def check_topology(client: Any, settings: RedisSettings) -> None:
    """Refuse (RedisTopologyMismatch) a cluster node with `[redis] cluster = false`, and a
    server that is not a cluster node with `cluster = true`. Nothing to check behind
    Sentinels (never a cluster) or in the in-process fakeredis (settings with no URL)."""
    if settings.embedded or settings.sentinel:
        return
    if settings.cluster:
        try:
            await client.initialize()
        except redis.exceptions.RedisClusterException as error:
            if "not enabled" not in str(error):
                raise
            raise RedisTopologyMismatch(
                f"redis at {settings.url.split('@')[-1]} is not a Redis Cluster node, but "
                "[redis] cluster = true: set GROUPBUY_REDIS_CLUSTER=false, or give the URL of "
                "a cluster node"
            ) from None
        return
    if (await client.info("cluster")).get("cluster_enabled"):
        raise RedisTopologyMismatch(
            f"redis at {settings.url.split('@')[-1]} is a Redis Cluster node, but [redis] "
            "cluster = false: set GROUPBUY_REDIS_CLUSTER=true"
        )


def risks(config: dict[str, str]) -> list[str]:
    """What each setting read from CONFIG GET risks, one sentence each (none: all is well)."""
    found: list[str] = []
    appendonly = config.get("appendonly", "")
    fsync = config.get("appendfsync", "")
    policy = config.get("maxmemory-policy", "")
    if appendonly != "yes":
        found.append(
            f"appendonly is {appendonly!r}: a crash loses every write since the last RDB "
            "snapshot, acknowledged grabs and seats included (set appendonly yes)"
        )
    elif fsync == "everysec":
        found.append(
            "appendfsync is 'everysec': a crash can lose up to ~1 s of acknowledged writes "
            "(appendfsync always loses none)"
        )
    elif fsync != "always":
        found.append(
            f"appendfsync is {fsync!r}: the OS decides when the append-only file reaches the "
            "disk, so a crash can lose many seconds of acknowledged writes (set always)"
        )
    if policy != "noeviction":
        found.append(
            f"maxmemory-policy is {policy!r}: when full, Redis silently drops keys (a packet's "
            "shares, a team's seats), which loses money and seats (set noeviction: writes "
            "then answer 503 redis_out_of_memory)"
        )
    return found


async def check_durability(client: Any, where: str, strict: bool) -> list[str]:
    """Read the settings (on every primary of a cluster) and warn of each risk (raise
    RedisNotDurable instead when `strict`); returns the risks found, each prefixed with its
    primary's `host:port` on a cluster. An unreachable Redis is the caller's to report."""
    config: dict[str, dict[str, str]] = {}  # node ('' for one server) -> setting -> value
    try:
        for name in ("appendonly", "appendfsync", "maxmemory-policy"):
            reply = await client.config_get(name, **every_primary(client))
            for node, values in per_primary(client, reply).items():
                config.setdefault(node, {}).update(values)
    except redis.exceptions.ResponseError as error:
        log.warning(
            "redis at %s: cannot check persistence and eviction (CONFIG GET refused: %s); "
            "make sure it runs appendonly yes, appendfsync always and maxmemory-policy "
            "noeviction",
            where,
            error,
        )
        return []
    found = [(node, risk) for node, settings in sorted(config.items()) for risk in risks(settings)]
    described = [f"{node}: {risk}" if node else risk for node, risk in found]
    if found and strict:
        raise RedisNotDurable(
            f"redis at {where} could lose acknowledged writes, and [redis] strict = true: "
            + "; ".join(described)
        )
    for node, risk in found:
        log.warning("redis at %s: %s", f"{node}, a primary of {where}" if node else where, risk)
    return described


async def check_replicas(client: Any, settings: RedisSettings) -> list[str]:
    """Under Sentinel, check every replica the Sentinels know as the primary is checked (a
    failover makes one of them the primary); with `wait_replicas`, warn when the primary has
    fewer replicas connected than every write will wait for. Returns what was found."""
    found: list[str] = []
    if settings.sentinel:
        addresses = await client.sentinels.discover_replicas(settings.sentinel_service)
        options = client.connection_pool.connection_kwargs
        for host, port in addresses:
            replica = aioredis.Redis(
                host=host,
                port=port,
                username=options.get("username"),
                password=options.get("password"),
                socket_timeout=options.get("socket_timeout"),
                socket_connect_timeout=options.get("socket_connect_timeout"),
                decode_responses=True,
            )
            where = f"{host}:{port} (a replica of {settings.sentinel_service!r})"
            try:
                found += await check_durability(replica, where, settings.strict)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as error:
                log.warning("redis at %s: cannot check it (%s)", where, error)
            finally:
                await replica.aclose()
    if settings.wait_replicas:
        connected = int((await client.info("replication")).get("connected_slaves", 0))
        if connected < settings.wait_replicas:
            shortfall = (
                f"[redis] wait_replicas = {settings.wait_replicas} but the primary has "
                f"{connected} replica(s) connected: writes answer 503 redis_replication_timeout "
                "until enough replicas are back"
            )
            log.warning("redis: %s", shortfall)
            found.append(shortfall)
    return found
