"""Redis Cluster mode on a real 3-master cluster: the harness, the client, scripts on every
primary (SCRIPT FLUSH on one node, a slot moved to another node), coalescing per node, the
durability check on every primary, readiness, and what an unreachable cluster answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.crc import key_slot
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.services import build_services, running
from groupbuy.settings import Settings
from groupbuy.storage.durability import RedisNotDurable, RedisTopologyMismatch, check_durability
from groupbuy.storage.pipelining import AutoPipeline, ClusterAutoPipeline
from groupbuy.storage.reachability import unreachable
from groupbuy.storage.redis_client import auto_pipeline, connect_redis, primaries
from groupbuy.storage.specs import Scripts, script_names
from tests.support.backends import CLUSTER
from tests.support.database import sqlite_with_schema
from tests.support.redis_cluster import SLOTS, RedisCluster, slot_ranges, start_cluster
from tests.support.servers import free_port, start_redis
from tests.support.settings import settings_for

pytestmark = pytest.mark.parametrize("backend", [CLUSTER])

LEASE_TTL_MS = 60_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """A cluster of this module's own: these tests flush scripts on one node and move slots."""
    started = start_cluster(masters=3)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def cluster_settings(tmp_path: Path, cluster: RedisCluster) -> Settings:
    with redis.RedisCluster.from_url(cluster.url) as client:
        client.flushall()
        client.script_flush()
    settings = settings_for(cluster.url, sqlite_with_schema(tmp_path))
    return settings.replace("scheduler", enabled=False)


@pytest.fixture(params=["coalesced", "plain"])
async def scripts(request: pytest.FixtureRequest, cluster_settings: Settings) -> AsyncIterator[Any]:
    """A registry on a cluster client, with or without the per-node coalescing layer."""
    settings = cluster_settings.redis
    if request.param == "plain":
        settings = cluster_settings.replace("redis", auto_pipeline=False).redis
    client = connect_redis(settings)
    registry = Scripts(client, auto_pipeline(client, settings))
    try:
        yield registry
    finally:
        await registry.aclose()
        await client.aclose()


def key_on(cluster: RedisCluster, node: int, name: str = "lease") -> str:
    """A key whose slot the master `nodes[node]` serves right now."""
    for n in range(10_000):
        key = f"gb:{{t:{n}}}:{name}"
        if cluster.node_of_slot(key_slot(key.encode())) == node:
            return key
    raise LookupError(f"no key found on node {node}")


def scripts_on(cluster: RedisCluster, node: int, registry: Scripts) -> list[bool]:
    shas = [registry.sha(name) for name in script_names()]
    with cluster.client(node) as client:
        return [bool(x) for x in client.script_exists(*shas)]


async def hold(registry: Scripts, key: str, token: str) -> list[Any]:
    return await registry.call("lease_hold", [key], [token, LEASE_TTL_MS])


def test_the_harness_gives_every_slot_to_one_of_three_masters(
    backend: str, cluster: RedisCluster
) -> None:
    assert slot_ranges(3) == [(0, 5460), (5461, 10921), (10922, 16383)]
    with cluster.client(1) as node:
        info = node.execute_command("CLUSTER", "INFO")
    assert "cluster_state:ok" in info and f"cluster_slots_assigned:{SLOTS}" in info
    assert "cluster_size:3" in info and "cluster_known_nodes:3" in info
    assert [cluster.node_of_slot(slot) for slot in (0, 5461, 16383)] == [0, 1, 2]


async def test_the_client_is_a_cluster_client_that_finds_every_primary(
    backend: str, cluster: RedisCluster, cluster_settings: Settings
) -> None:
    client = connect_redis(cluster_settings.redis)
    try:
        assert isinstance(client, AsyncRedisCluster)
        assert await primaries(client) == sorted(f"127.0.0.1:{port}" for port in cluster.ports)
        # Keys of three tags land on three nodes, each readable through the one client.
        keys = [key_on(cluster, node) for node in range(3)]
        for key in keys:
            await client.set(key, key)
        assert [await client.get(key) for key in keys] == keys
        assert (
            cluster_settings.redis.socket_timeout_s
            == client.get_connection_kwargs()["socket_timeout"]
        )
    finally:
        await client.aclose()


async def test_scripts_are_loaded_on_every_primary(
    backend: str, cluster: RedisCluster, scripts: Scripts
) -> None:
    assert not await scripts.loaded()
    await scripts.load()
    assert await scripts.loaded()
    for node in range(3):
        assert all(scripts_on(cluster, node, scripts)), node


async def test_one_node_flushing_its_scripts_is_seen_and_reloaded_there(
    backend: str, cluster: RedisCluster, scripts: Scripts
) -> None:
    await scripts.load()
    with cluster.client(2) as node:
        node.script_flush()
    assert not await scripts.loaded()  # two primaries still have them: not enough
    assert sorted(await scripts.reload_missing()) == script_names()
    assert await scripts.loaded()
    assert all(scripts_on(cluster, 2, scripts))
    assert await scripts.reload_missing() == []


async def test_a_call_on_a_node_that_forgot_its_scripts_loads_them_and_runs(
    backend: str, cluster: RedisCluster, scripts: Scripts
) -> None:
    await scripts.load()
    keys = [key_on(cluster, node) for node in range(3)]
    with cluster.client(1) as node:
        node.script_flush()
    assert [await hold(scripts, key, "me") for key in keys] == [[1], [1], [1]]
    assert [await hold(scripts, key, "other") for key in keys] == [[0], [0], [0]]
    assert scripts_on(cluster, 1, scripts)[script_names().index("lease_hold")]


async def test_a_script_still_runs_after_its_slot_moves_to_another_node(
    backend: str, cluster: RedisCluster, scripts: Scripts
) -> None:
    """MOVED: the client learns the new owner and the call is sent there; the node the slot
    moved to had never seen the script (NOSCRIPT), so it is loaded there first."""
    await scripts.load()
    key = key_on(cluster, 0, "moving")
    slot = key_slot(key.encode())
    assert await hold(scripts, key, "me") == [1]
    with cluster.client(1) as target:
        target.script_flush()
    cluster.move_slot(slot, 1)
    try:
        assert cluster.node_of_slot(slot) == 1
        assert await hold(scripts, key, "me") == [1]  # the same holder: its key moved along
        assert await hold(scripts, key, "other") == [0]
        with cluster.client(1) as target:
            assert target.get(key) == "me"
        pipeline = scripts.pipeline
        if isinstance(pipeline, ClusterAutoPipeline):
            assert pipeline.rerouted >= 1  # the first call after the move met MOVED
            # The next calls go straight to the new owner's pipeline.
            rerouted = pipeline.rerouted
            assert await hold(scripts, key, "me") == [1]
            assert pipeline.rerouted == rerouted
    finally:
        cluster.move_slot(slot, 0)


async def test_coalesced_calls_go_out_in_one_pipeline_per_primary(
    backend: str, cluster: RedisCluster, cluster_settings: Settings
) -> None:
    client = connect_redis(cluster_settings.redis)
    pipeline = auto_pipeline(client, cluster_settings.redis)
    assert isinstance(pipeline, ClusterAutoPipeline)
    registry = Scripts(client, pipeline)
    try:
        await registry.load()
        keys = [f"gb:{{t:{n}}}:lease" for n in range(600)]
        replies = await asyncio.gather(*(hold(registry, key, "me") for key in keys))
        assert replies == [[1]] * len(keys)
        per_node = pipeline.pipelines()
        assert sorted(per_node) == sorted(f"127.0.0.1:{port}" for port in cluster.ports)
        assert all(isinstance(p, AutoPipeline) for p in per_node.values())
        assert sum(p.calls for p in per_node.values()) == len(keys)
        # Coalesced: far fewer round trips than calls, on every node.
        assert all(p.batches < p.calls / 4 for p in per_node.values()), [
            (p.batches, p.calls) for p in per_node.values()
        ]
        assert pipeline.rerouted == 0
        for key in keys:
            node = cluster.node_of_slot(key_slot(key.encode()))
            with cluster.client(node) as direct:
                assert direct.get(key) == "me"
    finally:
        await registry.aclose()
        await client.aclose()


async def test_a_lossy_cluster_is_warned_about_primary_by_primary(
    backend: str,
    cluster: RedisCluster,
    cluster_settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Node 0 runs durable settings, nodes 1 and 2 do not: one warning per primary and setting,
    each naming its primary; strict refuses and names both."""
    names = [f"127.0.0.1:{port}" for port in cluster.ports]
    with cluster.client(0) as node:
        node.config_set("appendonly", "yes")
        node.config_set("appendfsync", "always")
    with cluster.client(2) as node:
        node.config_set("maxmemory-policy", "allkeys-lru")
    client = connect_redis(cluster_settings.redis)
    try:
        with caplog.at_level(logging.WARNING, logger="groupbuy.storage.durability"):
            found = await check_durability(client, "the cluster", strict=False)
        lines = [r.getMessage() for r in caplog.records if r.name.endswith("durability")]
        assert len(found) == len(lines) == 3, lines
        by_node = {
            name: [line.split(": ", 1)[1].split(" is ")[0] for line in lines if name in line]
            for name in names
        }
        assert by_node == {
            names[0]: [],
            names[1]: ["appendonly"],
            names[2]: ["appendonly", "maxmemory-policy"],
        }
        assert all(line.startswith("redis at 127.0.0.1:") for line in lines)
        assert all(", a primary of the cluster: " in line for line in lines)
        with pytest.raises(RedisNotDurable) as refused:
            await check_durability(client, "the cluster", strict=True)
        message = str(refused.value)
        assert f"{names[1]}: appendonly is 'no'" in message
        assert f"{names[2]}: maxmemory-policy is 'allkeys-lru'" in message
        assert names[0] not in message
    finally:
        await client.aclose()
        with cluster.client(0) as node:
            node.config_set("appendonly", "no")
        with cluster.client(2) as node:
            node.config_set("maxmemory-policy", "noeviction")


async def test_the_service_starts_on_the_cluster_with_scripts_on_every_primary(
    backend: str, cluster: RedisCluster, cluster_settings: Settings
) -> None:
    async with running(build_services(cluster_settings)) as services:
        assert await services.scripts.loaded()
        for node in range(3):
            assert all(scripts_on(cluster, node, services.scripts))
        # The clock, the seen signatures and a rate-limit bucket, each on the cluster.
        assert await services.clock.now_ms(services.redis) > 0
        decision = await services.ratelimit.take("grab", "key1", "u1")
        assert decision is not None and decision.allowed


async def test_an_unreachable_cluster_is_unreachable_not_a_bug(
    backend: str, cluster_settings: Settings
) -> None:
    settings = cluster_settings.replace(
        "redis", url=f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.2
    )
    client = connect_redis(settings.redis)
    try:
        with pytest.raises(Exception) as raised:
            await client.ping()
        assert unreachable(raised.value), repr(raised.value)
    finally:
        await client.aclose()


def test_readiness_reloads_the_scripts_one_primary_forgot(
    backend: str, cluster: RedisCluster, cluster_settings: Settings
) -> None:
    with TestClient(create_app(cluster_settings)) as client:
        assert client.get("/readyz").json()["status"] == "ready"
        registry = client.app.state.services.scripts  # type: ignore[attr-defined]
        with cluster.client(2) as node:
            node.script_flush()
        assert not any(scripts_on(cluster, 2, registry))
        answer = client.get("/readyz")
        assert answer.status_code == 200, answer.json()
        assert answer.json()["checks"] == {"redis": "ok", "scripts": "ok", "database": "ok"}
        assert all(scripts_on(cluster, 2, registry))


async def test_a_call_to_a_slot_being_moved_follows_ask_to_the_importing_node(
    backend: str, cluster: RedisCluster, scripts: Scripts
) -> None:
    """Mid-resharding: the key already sits on the importing node, the slot is still the
    source's; the source answers ASK and the call is sent there with ASKING."""
    await scripts.load()
    key = key_on(cluster, 2, "asked")
    slot = key_slot(key.encode())
    assert await hold(scripts, key, "me") == [1]
    with cluster.client(2) as src, cluster.client(0) as dst:
        src_id, dst_id = (
            src.execute_command("CLUSTER", "MYID"),
            dst.execute_command("CLUSTER", "MYID"),
        )
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        src.execute_command("MIGRATE", "127.0.0.1", cluster.ports[0], key, 0, 5000)
        assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    try:
        assert await hold(scripts, key, "me") == [1]
        assert await hold(scripts, key, "other") == [0]
        pipeline = scripts.pipeline
        if isinstance(pipeline, ClusterAutoPipeline):
            assert pipeline.rerouted >= 2  # each call met ASK at the source
    finally:
        for index in range(3):
            with cluster.client(index) as node:
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        cluster.move_slot(slot, 2)


async def test_calls_survive_a_node_dropping_every_connection(
    backend: str, cluster: RedisCluster, scripts: Scripts
) -> None:
    await scripts.load()
    keys = [key_on(cluster, node, f"dropped{n}") for node in range(3) for n in range(20)]
    assert await asyncio.gather(*(hold(scripts, key, "me") for key in keys)) == [[1]] * 60
    with cluster.client(1) as node:
        node.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert await asyncio.gather(*(hold(scripts, key, "me") for key in keys)) == [[1]] * 60
    assert await asyncio.gather(*(hold(scripts, key, "x") for key in keys)) == [[0]] * 60
    pipeline = scripts.pipeline
    if isinstance(pipeline, ClusterAutoPipeline):
        # The calls whose batch died with its connection went again through the cluster
        # client; the node's pipeline then opened new connections.
        assert pipeline.rerouted >= 1


async def test_cluster_mode_that_does_not_match_the_server_refuses_to_start(
    backend: str, cluster: RedisCluster, cluster_settings: Settings, tmp_path: Path
) -> None:
    """A cluster node without [redis] cluster (the first script call would meet MOVED), and a
    single server with it: each refused at start in one line naming the setting."""
    unclustered = cluster_settings.replace("redis", cluster=False)
    with pytest.raises(RedisTopologyMismatch) as refused:
        async with running(build_services(unclustered)):
            pytest.fail("started on a cluster node with cluster = false")
    assert "is a Redis Cluster node, but [redis] cluster = false" in str(refused.value)
    assert "GROUPBUY_REDIS_CLUSTER=true" in str(refused.value)
    single = start_redis()
    try:
        clustered = cluster_settings.replace("redis", url=single.url)
        with pytest.raises(RedisTopologyMismatch) as refused:
            async with running(build_services(clustered)):
                pytest.fail("started on a single server with cluster = true")
        assert "is not a Redis Cluster node, but [redis] cluster = true" in str(refused.value)
    finally:
        single.stop()


async def test_calls_in_flight_survive_the_cluster_client_closing_every_connection(
    backend: str, cluster: RedisCluster, cluster_settings: Settings
) -> None:
    """redis-py's cluster client closes every node's connections when a command meets
    CLUSTERDOWN (and refreshes them after a slot map change): the coalescing layer's batches
    in flight must not be cut by it, whatever moment it lands (it raised AttributeError and
    RuntimeError from the closed socket, answered 500)."""
    client = connect_redis(cluster_settings.redis)
    pipeline = auto_pipeline(client, cluster_settings.redis)
    registry = Scripts(client, pipeline)
    failures: list[BaseException] = []
    try:
        await registry.load()
        keys = [key_on(cluster, node, f"closed{n}") for node in range(3) for n in range(40)]
        for turns in range(30):
            calls = asyncio.gather(
                *(hold(registry, key, "me") for key in keys), return_exceptions=True
            )
            for _ in range(turns):
                await asyncio.sleep(0)
            await client.aclose()  # what redis-py does itself on CLUSTERDOWN
            replies = await calls
            failures += [reply for reply in replies if isinstance(reply, BaseException)]
            assert all(r == [1] for r in replies if not isinstance(r, BaseException)), replies
        # Before: 201 of the 3,600 calls failed, AttributeError ('NoneType' object has no
        # attribute 'writelines') and ConnectionError.
        assert not failures, (len(failures), sorted({repr(f) for f in failures})[:5])
        pipeline = registry.pipeline
        assert isinstance(pipeline, ClusterAutoPipeline) and pipeline.rerouted == 0
    finally:
        await registry.aclose()
        await client.aclose()
