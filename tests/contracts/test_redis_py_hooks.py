"""redis-py's connection, pool, cluster and Sentinel internals that groupbuy/storage uses.

The connection hooks run on fakeredis too: with no Redis URL, `AutoPipeline` writes to a
fakeredis connection the same way (its fake socket parses the packed bytes).
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
import redis.exceptions
from hiredis import pack_command
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from tests.support.servers import free_port


def packed(*commands: tuple[Any, ...]) -> bytes:
    """Commands packed the way AutoPipeline._round_trip packs a batch."""
    return b"".join(pack_command(command) for command in commands)


def sha1(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


# -- connections and pools (one server; fakeredis and a real server) ----------------------


async def test_connection_pool_get_connection_and_release_lend_a_connected_connection(
    redis_client: Any,
) -> None:
    """groupbuy/storage/pipelining.py, AutoPipeline._send: takes `redis.connection_pool`
    (redis_client.auto_pipeline), calls get_connection() with no arguments and
    release(connection); a connection dropped with disconnect(nowait=True) is released as
    it is and must come back connected."""
    pool = redis_client.connection_pool
    connection = await pool.get_connection()
    assert connection.is_connected
    await connection.disconnect(nowait=True)
    assert not connection.is_connected
    await pool.release(connection)

    again = await pool.get_connection()
    try:
        assert again.is_connected
        await again.send_packed_command(packed(("ECHO", "lent")), check_health=False)
        assert await again.read_response(timeout=math.inf) == "lent"
    finally:
        await pool.release(again)


async def test_connection_send_packed_command_writes_a_packed_pipeline(redis_client: Any) -> None:
    """groupbuy/storage/pipelining.py, AutoPipeline._round_trip: one
    send_packed_command(bytes, check_health=False) carries a batch packed by hiredis, then
    read_response(timeout=math.inf) reads each reply in order. An error reply raises from
    its own read (NOSCRIPT as NoScriptError, others as ResponseError) and the next read gets
    the next reply."""
    source = "return ARGV[1]"
    sha = await redis_client.script_load(source)
    never_loaded = sha1(f"return '{uuid.uuid4().hex}'")
    pool = redis_client.connection_pool
    connection = await pool.get_connection()
    try:
        await connection.send_packed_command(
            packed(
                ("EVALSHA", sha, 1, "k", "first"),
                ("EVALSHA", never_loaded, 0),
                ("EVAL", "return redis.error_reply('ERR contract refusal')", 0),
                ("EVALSHA", sha, 1, "k", 7),
            ),
            check_health=False,
        )
        first = await connection.read_response(timeout=math.inf)
        with pytest.raises(redis.exceptions.NoScriptError):
            await connection.read_response(timeout=math.inf)
        with pytest.raises(redis.exceptions.ResponseError) as refused:
            await connection.read_response(timeout=math.inf)
        last = await connection.read_response(timeout=math.inf)
        assert (first, last) == ("first", "7")
        assert not isinstance(refused.value, redis.exceptions.NoScriptError)
        assert "contract refusal" in str(refused.value)
        # Nothing is left over on the connection: the next reply is the next command's.
        await connection.send_packed_command(packed(("ECHO", "after")), check_health=False)
        assert await connection.read_response(timeout=math.inf) == "after"
    finally:
        await pool.release(connection)


async def test_connection_send_command_script_load_answers_the_sha(redis_client: Any) -> None:
    """groupbuy/storage/pipelining.py, AutoPipeline._reload: send_command("SCRIPT", "LOAD",
    source, check_health=False) then read_response() answers the script's sha, the one its
    EVALSHA calls use."""
    token = uuid.uuid4().hex
    source = f"return '{token}'"
    pool = redis_client.connection_pool
    connection = await pool.get_connection()
    try:
        await connection.send_command("SCRIPT", "LOAD", source, check_health=False)
        assert await connection.read_response() == sha1(source)
        await connection.send_packed_command(
            packed(("EVALSHA", sha1(source), 0)), check_health=False
        )
        assert await connection.read_response(timeout=math.inf) == token
    finally:
        await pool.release(connection)


async def test_connection_disconnect_nowait_drops_the_socket_and_send_reconnects(
    redis_client: Any,
) -> None:
    """groupbuy/storage/pipelining.py, AutoPipeline._send (and NodeConnections.release): a
    batch that failed midway leaves replies unread; disconnect(nowait=True) drops them with
    the socket, and the next send_packed_command reconnects by itself."""
    pool = redis_client.connection_pool
    connection = await pool.get_connection()
    try:
        await connection.send_packed_command(packed(("ECHO", "stale")), check_health=False)
        await connection.disconnect(nowait=True)
        assert not connection.is_connected
        await connection.send_packed_command(packed(("ECHO", "fresh")), check_health=False)
        assert connection.is_connected
        assert await connection.read_response(timeout=math.inf) == "fresh"
    finally:
        await pool.release(connection)


@pytest.mark.real
async def test_connection_read_response_timeout_inf_outlasts_the_socket_timeout(
    real_redis_url: str,
) -> None:
    """groupbuy/storage/pipelining.py, AutoPipeline._round_trip and _answer_after_wait:
    read_response(timeout=math.inf) reads without the client's socket_timeout (one
    asyncio.timeout covers the whole batch instead); a read with no timeout given still
    uses socket_timeout."""
    client: Any = aioredis.Redis.from_url(
        real_redis_url, decode_responses=True, socket_timeout=0.05
    )
    pool = client.connection_pool
    connection = await pool.get_connection()
    try:
        # BLPOP on a missing key answers nil after 0.5 s: ten socket timeouts.
        await connection.send_packed_command(
            packed(("BLPOP", f"contract:{uuid.uuid4().hex}", 0.5)), check_health=False
        )
        began = time.monotonic()
        assert await connection.read_response(timeout=math.inf) is None
        assert time.monotonic() - began >= 0.4

        await connection.send_packed_command(
            packed(("BLPOP", f"contract:{uuid.uuid4().hex}", 0.5)), check_health=False
        )
        with pytest.raises(redis.exceptions.TimeoutError):
            await connection.read_response()
    finally:
        await pool.release(connection)
        await client.aclose()


@pytest.mark.real
async def test_connection_read_response_raises_the_error_class_of_the_reply_prefix(
    real_redis_url: str,
) -> None:
    """groupbuy/storage/pipelining.py, AutoPipeline._round_trip hands each error reply to its
    caller as the exception read_response raises; ClusterAutoPipeline.evalsha then tells
    MOVED (caught before ASK: MovedError is an AskError), ASK, CLUSTERDOWN and TRYAGAIN
    apart; groupbuy/api/problems.py maps OOM. Each is a ResponseError, so one of them does
    not fail the rest of the batch."""
    expected: list[tuple[str, type[Exception]]] = [
        ("NOSCRIPT No matching script.", redis.exceptions.NoScriptError),
        ("MOVED 3999 127.0.0.1:6381", redis.exceptions.MovedError),
        ("ASK 3999 127.0.0.1:6381", redis.exceptions.AskError),
        ("CLUSTERDOWN The cluster is down", redis.exceptions.ClusterDownError),
        ("TRYAGAIN Multiple keys request during rehashing", redis.exceptions.TryAgainError),
        ("READONLY You can't write against a read only replica.", redis.exceptions.ReadOnlyError),
        (
            "OOM command not allowed when used memory > 'maxmemory'.",
            redis.exceptions.OutOfMemoryError,
        ),
    ]
    client: Any = aioredis.Redis.from_url(real_redis_url, decode_responses=True)
    pool = client.connection_pool
    connection = await pool.get_connection()
    raised: list[Exception] = []
    try:
        error_reply = "return redis.error_reply(ARGV[1])"
        await connection.send_packed_command(
            packed(*(("EVAL", error_reply, 0, text) for text, _cls in expected), ("ECHO", "end")),
            check_health=False,
        )
        for _text, _cls in expected:
            with pytest.raises(redis.exceptions.ResponseError) as caught:
                await connection.read_response(timeout=math.inf)
            raised.append(caught.value)
        assert await connection.read_response(timeout=math.inf) == "end"
    finally:
        await pool.release(connection)
        await client.aclose()
    assert [type(error) for error in raised] == [cls for _text, cls in expected]
    moved = raised[1]
    assert isinstance(moved, redis.exceptions.MovedError)
    assert (moved.slot_id, moved.host, moved.port) == (3999, "127.0.0.1", 6381)
    assert isinstance(moved, redis.exceptions.AskError)
    assert not isinstance(raised[2], redis.exceptions.MovedError)


# -- Sentinel -------------------------------------------------------------------------------


async def test_sentinel_master_for_pool_carries_the_sentinel_and_the_connection_options() -> None:
    """groupbuy/storage/redis_client.py, connect_redis and SentinelPrimary.sentinels /
    aclose: master_for(service, redis_class=..., **options) builds that class on a pool
    whose `sentinel_manager` is the Sentinel; groupbuy/storage/durability.py,
    check_replicas, reads the options back from `connection_pool.connection_kwargs`."""
    closed: list[bool | None] = []

    class Primary(aioredis.Redis):
        async def aclose(self, close_connection_pool: bool | None = None) -> None:
            closed.append(close_connection_pool)
            await super().aclose(close_connection_pool)

    sentinel = Sentinel([("127.0.0.1", free_port())])  # type: ignore[no-untyped-call]
    client = sentinel.master_for(
        "contract",
        redis_class=Primary,
        username="someone",
        password="secret",
        socket_timeout=0.5,
        socket_connect_timeout=0.25,
        decode_responses=True,
    )
    try:
        assert isinstance(client, Primary)
        pool = client.connection_pool
        assert pool.sentinel_manager is sentinel  # type: ignore[attr-defined]
        options = pool.connection_kwargs
        assert (
            options["username"],
            options["password"],
            options["socket_timeout"],
            options["socket_connect_timeout"],
        ) == ("someone", "secret", 0.5, 0.25)
    finally:
        await client.aclose()
        await sentinel.aclose()
    assert closed == [None]


@pytest.mark.real
async def test_sentinel_managed_connection_read_response_turns_readonly_into_connection_error(
    real_redis_url: str,
) -> None:
    """groupbuy/storage/pipelining.py, AutoPipeline._send: with Sentinel, a READONLY answer
    from a demoted primary fails the batch's connection as a ConnectionError (which the
    pipeline resends), and the connection is dropped so that the next one asks the
    Sentinels again. Only the Sentinels' answer is stubbed: the primary is a real server."""
    host, port = address(real_redis_url)

    class OneServer(Sentinel):
        async def discover_master(self, service_name: str) -> tuple[str, int]:
            return host, port

    sentinel = OneServer([])  # type: ignore[no-untyped-call]
    client = sentinel.master_for("contract", decode_responses=True)
    pool = client.connection_pool
    connection = await pool.get_connection()
    try:
        readonly = "READONLY You can't write against a read only replica."
        await connection.send_packed_command(
            packed(("EVAL", "return redis.error_reply(ARGV[1])", 0, readonly)),
            check_health=False,
        )
        with pytest.raises(redis.exceptions.ConnectionError):
            await connection.read_response(timeout=math.inf)
        assert not connection.is_connected
    finally:
        await pool.release(connection)
        await client.aclose()


# -- Redis Cluster --------------------------------------------------------------------------


async def test_cluster_client_with_no_reachable_node_raises_cluster_exception_caused_by_it() -> (
    None
):
    """groupbuy/storage/reachability.py, unreachable: a cluster client that reaches no node
    raises a bare RedisClusterException (not a RedisError) whose __cause__ is the
    ConnectionError; that cause is what makes it a 503 rather than a 500."""
    client = RedisCluster.from_url(
        f"redis://127.0.0.1:{free_port()}",
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    )
    try:
        with pytest.raises(redis.exceptions.RedisClusterException) as caught:
            await client.ping()
    finally:
        await client.aclose()
    assert not isinstance(caught.value, redis.exceptions.RedisError)
    assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)


@pytest.fixture
async def cluster(cluster_url: str) -> AsyncIterator[RedisCluster]:
    """A cluster client as connect_redis makes one, its slot map not read yet."""
    client = RedisCluster.from_url(cluster_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


def name_of(client: RedisCluster, key: str) -> str:
    """The name of the node the client's slot map names for `key`."""
    node = client.get_node_from_key(key)
    assert node is not None
    return node.name


def key_per_primary(client: RedisCluster) -> dict[str, str]:
    """One key for each primary, by node name, as the client's slot map places them."""
    found: dict[str, str] = {}
    primaries = {node.name for node in client.get_primaries()}
    for n in range(10_000):
        key = f"contract:{{{n}}}"
        found.setdefault(name_of(client, key), key)
        if set(found) == primaries:
            return found
    raise LookupError("no key found for every primary")


def own_connection(node: ClusterNode) -> Any:
    """A connection to `node` opened the way NodeConnections.get_connection opens one."""
    return node.connection_class(**{**node.connection_kwargs, "retry": Retry(NoBackoff(), 0)})


@pytest.mark.real
@pytest.mark.cluster
async def test_redis_cluster_get_node_from_key_names_the_primary_serving_the_key(
    cluster: RedisCluster,
) -> None:
    """groupbuy/storage/pipelining.py, ClusterAutoPipeline._node_of: the slot map
    (`nodes_manager.slots_cache`) is empty until initialize() reads it; then
    get_node_from_key(key) is the primary that serves the key's slot."""
    assert not cluster.nodes_manager.slots_cache
    await cluster.initialize()
    assert len(cluster.nodes_manager.slots_cache) == REDIS_CLUSTER_HASH_SLOTS
    keys = key_per_primary(cluster)
    assert len(keys) >= 2
    for name, key in keys.items():
        node = cluster.get_node_from_key(key)
        assert node is not None
        assert node.server_type == "primary"
        # The node itself serves the key: a plain client on it gets no MOVED.
        plain = aioredis.Redis(host=node.host, port=int(node.port), decode_responses=True)
        try:
            assert await plain.set(key, name)
            assert await plain.get(key) == name
        finally:
            await plain.aclose()


@pytest.mark.real
@pytest.mark.cluster
async def test_cluster_node_connection_class_and_kwargs_open_a_connection_to_that_node(
    cluster: RedisCluster,
) -> None:
    """groupbuy/storage/pipelining.py, NodeConnections.__init__ / get_connection: a
    connection made from a ClusterNode's `connection_class(**connection_kwargs)` (with a
    Retry of its own) talks to that node, with the client's options (decoded replies); the
    wrong node answers MOVED naming the right one."""
    await cluster.initialize()
    keys = key_per_primary(cluster)
    (right_name, key), (wrong_name, _other) = list(keys.items())[:2]
    right = cluster.get_node(node_name=right_name)
    wrong = cluster.get_node(node_name=wrong_name)
    assert right is not None and wrong is not None
    to_right, to_wrong = own_connection(right), own_connection(wrong)
    try:
        await to_right.send_packed_command(
            packed(("SET", key, "v"), ("GET", key)), check_health=False
        )
        assert await to_right.read_response(timeout=math.inf) == "OK"
        assert await to_right.read_response(timeout=math.inf) == "v"
        assert (to_right.host, to_right.port) == (right.host, right.port)
        await to_wrong.send_packed_command(packed(("GET", key)), check_health=False)
        with pytest.raises(redis.exceptions.MovedError) as moved:
            await to_wrong.read_response(timeout=math.inf)
        assert f"{moved.value.host}:{moved.value.port}" == right.name
    finally:
        await to_right.disconnect()
        await to_wrong.disconnect()


async def moved_from_the_wrong_node(cluster: RedisCluster) -> tuple[str, ClusterNode, ClusterNode]:
    """A key, the primary that serves it, and another primary whose own connection was
    just answered MOVED for it; the slot map then points the key's slot at the wrong one
    (a map gone stale after a failover or a resharding)."""
    await cluster.initialize()
    keys = key_per_primary(cluster)
    (right_name, key), (wrong_name, _other) = list(keys.items())[:2]
    right, wrong = cluster.get_node(node_name=right_name), cluster.get_node(node_name=wrong_name)
    assert right is not None and wrong is not None
    cluster.nodes_manager.slots_cache[key_slot(key.encode())] = [wrong]
    assert cluster.get_node_from_key(key) is wrong
    return key, right, wrong


@pytest.mark.real
@pytest.mark.cluster
async def test_nodes_manager_move_slot_points_the_slot_at_the_moved_target(
    cluster: RedisCluster,
) -> None:
    """groupbuy/storage/pipelining.py, ClusterAutoPipeline.evalsha: on a MovedError read from
    a node's own connection, `await nodes_manager.move_slot(moved)` points the slot at the
    node MOVED names, so the call's next try goes there."""
    key, right, wrong = await moved_from_the_wrong_node(cluster)
    connection = own_connection(wrong)
    try:
        await connection.send_packed_command(packed(("GET", key)), check_health=False)
        with pytest.raises(redis.exceptions.MovedError) as moved:
            await connection.read_response(timeout=math.inf)
    finally:
        await connection.disconnect()
    assert moved.value.slot_id == key_slot(key.encode())
    await cluster.nodes_manager.move_slot(moved.value)
    assert name_of(cluster, key) == right.name


@pytest.mark.real
@pytest.mark.cluster
async def test_nodes_manager_initialize_reads_the_slot_map_again_and_closes_no_connection(
    cluster: RedisCluster,
) -> None:
    """groupbuy/storage/pipelining.py, ClusterAutoPipeline._read_slot_map: on an initialized
    client, `nodes_manager.initialize()` reads the slot map again (a stale slot is
    corrected); a node's own connection open meanwhile still answers, and the client's
    commands still work."""
    key, right, _wrong = await moved_from_the_wrong_node(cluster)
    connection = own_connection(right)
    try:
        await connection.send_packed_command(packed(("SET", key, "before")), check_health=False)
        assert await connection.read_response(timeout=math.inf) == "OK"
        await cluster.nodes_manager.initialize()
        assert name_of(cluster, key) == right.name
        await connection.send_packed_command(packed(("GET", key)), check_health=False)
        assert await connection.read_response(timeout=math.inf) == "before"
    finally:
        await connection.disconnect()
    assert await cluster.set(key, "after")
    assert await cluster.get(key) == "after"


@pytest.mark.real
@pytest.mark.cluster
async def test_execute_command_to_every_primary_folds_script_exists_over_the_primaries(
    cluster: RedisCluster,
) -> None:
    """groupbuy/storage/specs.py, Scripts._exist / _load / reload_missing (and
    ClusterAutoPipeline._resend): SCRIPT LOAD sent with target_nodes=RedisCluster.PRIMARIES
    reaches every primary, and SCRIPT EXISTS sent so answers one flag per sha, true only
    when every primary holds the script."""
    await cluster.initialize()
    primaries = cluster.get_primaries()
    assert len(primaries) >= 2
    source = f"return 'contract {uuid.uuid4().hex}'"
    other = sha1(f"return 'never loaded {uuid.uuid4().hex}'")
    first = primaries[0]
    plain = aioredis.Redis(host=first.host, port=int(first.port), decode_responses=True)
    try:
        await plain.script_load(source)  # on one primary only
    finally:
        await plain.aclose()
    every = {"target_nodes": RedisCluster.PRIMARIES}
    assert await cluster.execute_command("SCRIPT EXISTS", sha1(source), other, **every) == [
        False,
        False,
    ]
    await cluster.execute_command("SCRIPT LOAD", source, **every)
    assert await cluster.execute_command("SCRIPT EXISTS", sha1(source), other, **every) == [
        True,
        False,
    ]


@pytest.mark.real
@pytest.mark.cluster
async def test_config_get_to_every_primary_answers_a_dict_by_node_name(
    cluster: RedisCluster,
) -> None:
    """groupbuy/storage/durability.py, check_durability, through redis_client.every_primary /
    per_primary / primaries: CONFIG GET sent with target_nodes=RedisCluster.PRIMARIES
    answers {node name: that node's reply}, the names those of get_primaries()."""
    reply: Any = await cluster.config_get("maxmemory-policy", target_nodes=RedisCluster.PRIMARIES)
    names = {node.name for node in cluster.get_primaries()}
    assert isinstance(reply, dict)
    assert set(dict(reply)) == names
    assert all(set(values) == {"maxmemory-policy"} for values in reply.values())


@pytest.mark.real
@pytest.mark.cluster
async def test_crc_key_slot_is_the_slot_the_cluster_computes(cluster: RedisCluster) -> None:
    """groupbuy/storage/keys.py, Keys.slot_of and slot_tags: redis.crc.key_slot(key bytes) is
    the slot CLUSTER KEYSLOT answers (hash tags included), out of REDIS_CLUSTER_HASH_SLOTS."""
    assert REDIS_CLUSTER_HASH_SLOTS == 16_384
    await cluster.initialize()
    node = cluster.get_primaries()[0]
    plain: Any = aioredis.Redis(host=node.host, port=int(node.port), decode_responses=True)
    keys = ["gb:{a:act-1}:team:t1", "plain-key", "{}empty-tag", "x{tag}y{other}", "ü{ß}"]
    try:
        answered = [await plain.execute_command("CLUSTER KEYSLOT", key) for key in keys]
    finally:
        await plain.aclose()
    assert [key_slot(key.encode()) for key in keys] == answered
