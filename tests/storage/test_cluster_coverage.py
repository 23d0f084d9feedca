"""What a dead primary does to the other shards' script calls, by the nodes'
`cluster-require-full-coverage` (docs/deploy.md has the table):

- `no`: the other shards' calls go on answering;
- `yes` (Redis's default): once the cluster marks the primary failed, every node refuses
  every key with CLUSTERDOWN, which the service answers 503 `redis_unavailable`.

The dead shard's own calls fail as Redis unreachable (503) either way. The clusters here have
no replica, so no promotion ends the state while the test looks at it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions
from redis.crc import key_slot

from groupbuy.storage.reachability import unreachable
from groupbuy.storage.redis_client import auto_pipeline, connect_redis
from groupbuy.storage.specs import Scripts
from tests.support.backends import CLUSTER
from tests.support.database import sqlite_with_schema
from tests.support.redis_cluster import RedisCluster, start_cluster
from tests.support.settings import settings_for

pytestmark = [pytest.mark.parametrize("backend", [CLUSTER]), pytest.mark.slow]

DEAD = 2
FAIL_SEEN_S = 20.0  # the node timeout is 2 s; the FAIL flag then spreads by gossip


@pytest.fixture(params=["no", "yes"])
def cluster(request: pytest.FixtureRequest) -> Any:
    started = start_cluster(masters=3, extra=("--cluster-require-full-coverage", request.param))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def registry(cluster: RedisCluster, tmp_path: Path) -> AsyncIterator[Scripts]:
    settings = settings_for(cluster.url, sqlite_with_schema(tmp_path)).redis
    client = connect_redis(settings)
    scripts = Scripts(client, auto_pipeline(client, settings))
    await scripts.load()
    try:
        yield scripts
    finally:
        await scripts.aclose()
        await client.aclose()


def key_on(cluster: RedisCluster, node: int) -> str:
    for n in range(10_000):
        key = f"gb:{{c:{n}}}:lease"
        if cluster.node_of_slot(key_slot(key.encode())) == node:
            return key
    raise LookupError(f"no key found on node {node}")


def wait_until_marked_failed(cluster: RedisCluster, dead: int) -> None:
    """Until every live node flags the dead one `fail` (not only `fail?`)."""
    port = f":{cluster.ports[dead]}@"
    deadline = time.monotonic() + FAIL_SEEN_S
    for index in cluster.alive():
        with cluster.client(index) as client:
            while True:
                lines = str(client.execute_command("CLUSTER", "NODES"))
                line = next(line for line in lines.splitlines() if port in line)
                if "fail" in line.split()[2].split(","):
                    break
                assert time.monotonic() < deadline, line
                time.sleep(0.05)


async def hold(registry: Scripts, key: str) -> Any:
    return await registry.call("lease_hold", [key], ["me", 60_000])


async def test_a_dead_primary_stops_the_other_shards_only_with_full_coverage(
    backend: str, cluster: RedisCluster, registry: Scripts
) -> None:
    full_coverage = cluster.extra[-1]  # the fixture's parameter, the setting's value
    keys = [key_on(cluster, node) for node in range(3)]
    assert [await hold(registry, key) for key in keys] == [[1]] * 3
    cluster.kill(DEAD)
    wait_until_marked_failed(cluster, DEAD)

    with pytest.raises(redis.exceptions.RedisError) as dead:
        await hold(registry, keys[DEAD])
    assert unreachable(dead.value), repr(dead.value)  # 503 redis_unavailable
    for key in keys[:DEAD]:
        if full_coverage == "no":
            assert await hold(registry, key) == [1]
        else:
            with pytest.raises(redis.exceptions.ClusterDownError) as down:
                await hold(registry, key)
            assert unreachable(down.value)
