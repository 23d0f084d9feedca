"""Redis clients for the tests: fakeredis with Lua, or a real server (or cluster) by URL."""

from __future__ import annotations

from functools import cache
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from groupbuy.storage.fake_adapter import fake_redis


@cache
def is_cluster_url(url: str) -> bool:
    """Whether the server at `url` is a node of a Redis Cluster (asked once per URL)."""
    if not url:
        return False
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    finally:
        client.connection_pool.disconnect()
        client.close()


def make_async_redis(url: str) -> Any:
    """A fresh asyncio client: fakeredis on its own server when `url` is empty, a cluster
    client when `url` names a cluster node."""
    if not url:
        return fake_redis()
    if is_cluster_url(url):
        return RedisCluster.from_url(url, decode_responses=True, max_connections=512)
    return aioredis.Redis.from_url(url, decode_responses=True, max_connections=512)


def empty(url: str) -> None:
    """Remove every key and script from the server at `url` (every primary of a cluster)."""
    cluster = is_cluster_url(url)
    client: Any = redis.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    with client:
        client.flushall()
        client.script_flush()
