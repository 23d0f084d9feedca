"""Services laid out for Redis Cluster (`[redis] cluster = true`) on a server the tests run.

A real redis-server started with `--cluster-enabled yes` that owns all 16,384 slots is a
cluster of one node: a plain client reaches every key without redirections, and the
server still refuses what a cluster refuses, a script call or a MULTI whose keys span
slots (CROSSSLOT). So the key layout of cluster mode is checked by Redis itself, on one
process that starts in ~2 s. (fakeredis knows no slots: there the tests check the keys
with `redis.crc.key_slot`.)
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from groupbuy.services import Services, build_services
from groupbuy.settings import load_settings
from groupbuy.storage.db import Database
from tests.support.redis import make_async_redis
from tests.support.schema import database_with_schema
from tests.support.servers import RedisProcess, free_port, start_redis
from tests.support.settings import API_KEYS, TEST_RATE_LIMITS
from tests.support.starting import NO_REDIS, started_or_skip

# A cluster node also listens on its port + 10,000 (the cluster bus).
_BUS_OFFSET = 10_000


def cluster_port() -> int:
    """A free port whose cluster-bus port (+10,000) exists and is free too."""
    while True:
        port = free_port()
        if port + _BUS_OFFSET > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + _BUS_OFFSET))
            except OSError:
                continue
        return port


def start_one_node_cluster() -> RedisProcess:
    """A cluster-enabled server owning every slot, once its cluster state is ok."""
    server = start_redis(
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", port=cluster_port()
    )
    try:
        with redis.Redis(port=server.port, decode_responses=True) as client:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            deadline = time.monotonic() + 20
            while "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the one-node cluster did not reach cluster_state:ok")
                time.sleep(0.05)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def one_node_cluster_url() -> Iterator[str]:
    """The URL of a one-node cluster shared by the session's tests (emptied by each)."""
    server = started_or_skip(start_one_node_cluster, NO_REDIS)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.real)])
def cluster_redis_url(request: pytest.FixtureRequest) -> str:
    """'' for fakeredis, or the one-node cluster's URL, emptied for this test."""
    if request.param == "fake":
        return ""
    url = str(request.getfixturevalue("one_node_cluster_url"))
    with redis.Redis.from_url(url) as client:
        client.flushall()
        client.script_flush()
    return url


def cluster_settings(tmp_path: Path, redis_url: str, **environ: str) -> Any:
    """Test settings with `[redis] cluster = true` (and any GROUPBUY_* given)."""
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": database_with_schema(tmp_path),
            "GROUPBUY_REDIS_URL": redis_url,
            "GROUPBUY_REDIS_CLUSTER": "true",
            **TEST_RATE_LIMITS,
            **environ,
        },
    )


@pytest.fixture
async def cluster_services(tmp_path: Path, cluster_redis_url: str) -> AsyncIterator[Services]:
    """Services with the cluster key layout, on fakeredis or the one-node cluster."""
    settings = cluster_settings(
        tmp_path,
        cluster_redis_url,
        GROUPBUY_REDPACKETS_SENDER_DAILY_COUNT="1000",  # packet_admit counts, unadmit takes back
    )
    client = make_async_redis(cluster_redis_url)
    database = Database(settings.database.effective_url)
    built = build_services(settings, redis=client, database=database)
    await built.scripts.load()
    try:
        yield built
    finally:
        await built.scripts.aclose()  # the coalescing layer's connections are its own
        await database.dispose()
        await client.aclose()
