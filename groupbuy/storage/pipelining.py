"""Coalesced round trips (auto-pipelining) for script calls.

Under load most of a request's cost is the client's, not Redis's: one EVALSHA through
redis-py checks a connection out of the pool, packs, writes, arms a timeout, reads and
checks the connection back in. `AutoPipeline` pays that once per batch instead: a call
made while nothing is in flight goes out at once (on the next turn of the event loop,
together with whatever else was called in the same turn); calls made while batches are
in flight queue up and leave together as the next batch, one write and one read loop
on one connection. Batches grow with load and stay at one call when idle, so there is
no added latency at low load.

Each caller gets its own reply or its own error (a script error of one call does not
touch the others). NOSCRIPT (after SCRIPT FLUSH or a Redis restart) loads the script
and sends the call again. A dropped connection or a timeout fails the whole batch's
connection: the calls whose replies had not arrived are sent again with backoff, up
to the configured retries, then fail with the same ConnectionError/TimeoutError redis-py
raises (the API maps both to 503). Resending is safe because every script is
idempotent: a call that did run before the drop answers the same on the second run.

With `wait` set (`[redis] wait_replicas`), a batch carrying a call that asked for it ends
with one `WAIT n timeout` on the same connection, which covers every write of the batch;
those calls are answered only after it, and fail with RedisReplicationTimeout when fewer
than n replicas confirmed in time (their writes stay applied on the primary).

One `AutoPipeline` talks to one server (one connection pool). On a Redis Cluster,
`ClusterAutoPipeline` keeps one per primary and routes each call by the slot of its first
key (every key of a script call shares one slot), so a batch never mixes nodes. Each
node's pipeline opens connections of its own: redis-py's cluster client closes every
connection of every node when a command meets CLUSTERDOWN, and recycles them after each
slot map refresh, which cut the batches in flight on shared ones (AttributeError and
RuntimeError from the closed socket: 500s on healthy shards).

A call that meets MOVED (a resharding, a failover the map has not caught up with) learns
the slot's new owner and goes to its pipeline. A node that is gone or silent, CLUSTERDOWN
or TRYAGAIN sends the call again after a backoff, up to the configured retries, with the
slot map read again first (one read at a time, at most every REFRESH_INTERVAL_S, while
the other calls go on with the map they have); then it fails with the last error (a
503). ASK, while a slot moves, goes through redis-py's cluster client, which sends ASKING
before the call.

With Sentinel the pool is redis-py's SentinelConnectionPool: each new connection goes to
the primary the Sentinels name, and a dropped connection or a READONLY answer from a
demoted primary fails the batch's connection, so the resend finds the new primary.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis.exceptions
from hiredis import pack_command
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import AbstractBackoff, ExponentialWithJitterBackoff, NoBackoff

from groupbuy.errors import RedisReplicationTimeout
from groupbuy.metrics import REDIS_BATCH_CALLS, REPLICATION_TIMEOUTS

log = logging.getLogger(__name__)

# What a dropped or stalled connection raises; both are retried (the scripts are idempotent).
RETRIED = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
# How many times one call loads its script again on NOSCRIPT. More than once: an operator's
# SCRIPT FLUSH can land between the reload and the resend (a fault test flushes every 100 ms
# under load and saw it); a bound still, so a server that never keeps scripts fails the call.
MAX_RELOADS = 5


@dataclass(frozen=True, slots=True)
class ReplicaWait:
    """WAIT after a write: how many replicas must hold it, and how long to wait for them."""

    replicas: int
    timeout_s: float

    def command(self) -> tuple[Any, ...]:
        return ("WAIT", self.replicas, max(1, math.ceil(self.timeout_s * 1000)))

    def failure(self, acknowledged: int) -> RedisReplicationTimeout | None:
        """The error for calls whose WAIT answered `acknowledged`, or None when enough."""
        if acknowledged >= self.replicas:
            return None
        REPLICATION_TIMEOUTS.inc()
        return RedisReplicationTimeout(
            f"{acknowledged} of the {self.replicas} replicas [redis] wait_replicas asks for "
            f"confirmed the write within {self.timeout_s} s; it is applied on the primary and "
            "a retry answers the same",
            replicas_acknowledged=acknowledged,
            replicas_wanted=self.replicas,
        )


class Connections(Protocol):
    """Where a pipeline takes its connection from: a redis-py connection pool, or one node of
    a cluster (NodeConnections)."""

    async def get_connection(self) -> Any: ...

    async def release(self, connection: Any) -> Any: ...


class NodeConnections:
    """Connections to one cluster node, opened with the node's settings but owned here, lent
    the way a connection pool lends them: nothing else closes one a batch is using."""

    def __init__(self, node: ClusterNode) -> None:
        self.name = node.name
        self._connection_class = node.connection_class
        # No resends at the socket level: the pipeline and the cluster layer resend.
        self._kwargs = {**node.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
        self._free: deque[AbstractConnection] = deque()
        self._opened: list[AbstractConnection] = []

    async def get_connection(self) -> AbstractConnection:
        if self._free:
            return self._free.popleft()
        # At most one per sender of the node's pipeline ([redis] pipeline_max_in_flight).
        connection: AbstractConnection = self._connection_class(**self._kwargs)
        self._opened.append(connection)
        return connection

    async def release(self, connection: AbstractConnection) -> None:
        self._free.append(connection)  # dropped after an error: it reconnects on next use

    async def aclose(self) -> None:
        """Close every connection (none may be in use: the pipeline's senders are done)."""
        await asyncio.gather(
            *(connection.disconnect() for connection in self._opened), return_exceptions=True
        )
        self._opened.clear()
        self._free.clear()


@dataclass(slots=True)
class ScriptCall:
    """One queued EVALSHA: the script's sha and source, its keys and args, and its future."""

    sha: str
    source: str
    keys: list[str]
    args: list[Any]
    reply: asyncio.Future[Any]
    wait: bool = False  # answer only once the replicas confirmed its writes (WAIT)
    failures: int = 0
    reloads: int = field(default=0)

    def command(self) -> tuple[Any, ...]:
        return ("EVALSHA", self.sha, len(self.keys), *self.keys, *self.args)


class AutoPipeline:
    """Sends script calls to one Redis server in coalesced batches (see the module doc)."""

    def __init__(
        self,
        pool: Connections,
        *,
        max_batch: int,
        max_in_flight: int,
        socket_timeout_s: float | None,
        retries: int = 3,
        backoff: AbstractBackoff | None = None,
        wait: ReplicaWait | None = None,
    ) -> None:
        self._pool = pool
        self._wait = wait
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._timeout = socket_timeout_s
        self._retries = retries
        self._backoff = backoff or ExponentialWithJitterBackoff(base=0.01, cap=0.5)
        self._queue: deque[ScriptCall] = deque()
        self._senders_alive = 0  # sender tasks, at most max_in_flight
        self._busy = 0  # of those, how many have a batch in flight now
        self._senders: set[asyncio.Task[None]] = set()
        # Figures for tests and metrics: batches sent, calls they carried, the largest one.
        self.batches = 0
        self.calls = 0
        self.largest_batch = 0

    async def evalsha(
        self, sha: str, source: str, keys: list[str], args: list[Any], wait: bool = False
    ) -> Any:
        """Run one script by sha (loading its source on NOSCRIPT) in the next batch; with
        `wait` (and a ReplicaWait given), answer once the replicas hold its writes."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(ScriptCall(sha, source, keys, args, reply, wait and bool(self._wait)))
        self._kick()
        return await reply

    def _kick(self) -> None:
        """Start a sender if there is queued work and room for another batch in flight."""
        if self._queue and self._senders_alive < self._max_in_flight:
            self._senders_alive += 1
            sender = asyncio.get_running_loop().create_task(self._send_batches())
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)

    async def _send_batches(self) -> None:
        """Send batches from the queue until it is empty (one batch in flight per sender)."""
        try:
            while self._queue:
                batch = self._take_batch()
                if not batch:
                    continue
                self._busy += 1
                self._kick()  # what is left goes out beside this batch, not after it
                try:
                    await self._send(batch)
                finally:
                    self._busy -= 1
        finally:
            self._senders_alive -= 1
            # A call queued while this sender was finishing must not wait for a next caller.
            self._kick()

    def _take_batch(self) -> list[ScriptCall]:
        """This sender's share of the queue: split evenly over the senders free to send, so
        Redis runs one batch while this process reads the replies of another."""
        free = self._max_in_flight - self._busy
        size = min(self._max_batch, -(-len(self._queue) // free))
        batch: list[ScriptCall] = []
        while self._queue and len(batch) < size:
            call = self._queue.popleft()
            if not call.reply.done():  # a caller cancelled while queued is not sent
                batch.append(call)
        return batch

    async def _send(self, batch: list[ScriptCall]) -> None:
        connection = None
        try:
            connection = await self._pool.get_connection()
            missing = await self._round_trip(connection, batch)
            if missing:
                await self._reload(connection, missing)
        except BaseException as error:
            # The socket is in an unknown state: drop it (none yet when Redis refused us).
            if connection is not None:
                await connection.disconnect(nowait=True)
            unanswered = [call for call in batch if not call.reply.done()]
            if isinstance(error, RETRIED):
                await self._retry_later(unanswered, error)
                return
            # Anything else (a bug, a cancelled sender): fail the waiting calls, never hang
            # them; the sender carries on unless it was itself cancelled.
            failure = error if isinstance(error, Exception) else asyncio.CancelledError()
            for call in unanswered:
                call.reply.set_exception(failure)
            if not isinstance(error, Exception):
                raise
        finally:
            if connection is not None:
                await self._pool.release(connection)

    async def _round_trip(self, connection: Any, batch: list[ScriptCall]) -> list[ScriptCall]:
        """Write the batch in one send, read every reply in order; returns the NOSCRIPT calls."""
        self.batches += 1
        self.calls += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        REDIS_BATCH_CALLS.observe(len(batch))
        # hiredis packs in C, far faster than the pure-Python packer redis-py uses.
        commands = [call.command() for call in batch]
        wait = self._wait if any(call.wait for call in batch) else None
        timeout = self._timeout
        if wait is not None:
            # One WAIT after the batch's scripts covers every write they made on this
            # connection; the batch may take that much longer to answer.
            commands.append(wait.command())
            timeout = None if timeout is None else timeout + wait.timeout_s
        packed = b"".join([pack_command(command) for command in commands])
        missing: list[ScriptCall] = []
        held: list[tuple[ScriptCall, Any]] = []  # replies kept until the WAIT has answered
        # One timeout for the batch's replies instead of one per reply (math.inf turns off
        # the per-read timeout): a stalled server still fails the batch after the timeout.
        try:
            async with asyncio.timeout(timeout):
                await connection.send_packed_command(packed, check_health=False)
                for call in batch:
                    try:
                        reply = await connection.read_response(timeout=math.inf)
                    except redis.exceptions.NoScriptError:
                        missing.append(call)
                        continue
                    except redis.exceptions.ResponseError as error:
                        reply = error
                    if wait is None:
                        _answer(call, reply)
                    else:
                        held.append((call, reply))
                if wait is not None:
                    await self._answer_after_wait(connection, wait, held)
        except TimeoutError:
            raise redis.exceptions.TimeoutError(f"no reply from Redis within {timeout} s") from None
        return missing

    @staticmethod
    async def _answer_after_wait(
        connection: Any, wait: ReplicaWait, held: list[tuple[ScriptCall, Any]]
    ) -> None:
        """Read the WAIT's answer, then answer the batch: a call that asked to wait fails
        with RedisReplicationTimeout when too few replicas confirmed."""
        try:
            acknowledged = int(await connection.read_response(timeout=math.inf))
            refused: Exception | None = None
        except redis.exceptions.ResponseError as error:  # WAIT itself refused
            acknowledged, refused = 0, error
        for call, reply in held:
            if call.wait and not isinstance(reply, redis.exceptions.ResponseError):
                failure = refused or wait.failure(acknowledged)
                if failure is not None:
                    reply = failure
            _answer(call, reply)

    async def _reload(self, connection: Any, missing: list[ScriptCall]) -> None:
        """Load the scripts Redis forgot and queue their calls again (up to MAX_RELOADS
        times per call)."""
        for source in {call.source for call in missing}:
            await connection.send_command("SCRIPT", "LOAD", source, check_health=False)
            await connection.read_response()
        for call in missing:
            if call.reply.done():
                continue
            if call.reloads >= MAX_RELOADS:
                call.reply.set_exception(
                    redis.exceptions.NoScriptError(
                        f"script missing again after loading it {MAX_RELOADS} times"
                    )
                )
                continue
            call.reloads += 1
            self._queue.appendleft(call)

    async def _retry_later(self, calls: list[ScriptCall], error: Exception) -> None:
        """Queue unanswered calls again after a backoff, or fail them when out of retries."""
        again: list[ScriptCall] = []
        for call in calls:
            call.failures += 1
            if call.failures > self._retries:
                call.reply.set_exception(error)
            else:
                again.append(call)
        if not again:
            return
        delay = self._backoff.compute(max(call.failures for call in again))
        if delay > 0:
            await asyncio.sleep(delay)
        # Ahead of calls queued later: a retried call keeps its place in line.
        self._queue.extendleft(reversed(again))

    async def aclose(self) -> None:
        """Wait for the batches in flight (callers still get their replies)."""
        if self._senders:
            await asyncio.gather(*self._senders, return_exceptions=True)


def _answer(call: ScriptCall, reply: Any) -> None:
    """Hand a reply (or an error) to its caller, unless the caller was cancelled."""
    if call.reply.done():  # its caller was cancelled: the reply is dropped
        return
    if isinstance(reply, Exception):
        call.reply.set_exception(reply)
    else:
        call.reply.set_result(reply)


# What sends a call again after a backoff, with the slot map read again first: the node is
# gone or silent, the cluster is changing its mind (a failover), a multi-key command met a
# slot being moved, or the map names no node for the slot.
RESENT = (
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
    *RETRIED,
)
# How many MOVED redirections one call follows (redis-py's cluster client allows as many).
MAX_REDIRECTIONS = 16
# The slot map is read again at most this often: a failover fails calls by the hundred, one
# read serves them all, and reading it costs a few ms of this process's CPU.
REFRESH_INTERVAL_S = 0.2


class ClusterAutoPipeline:
    """Script calls to a Redis Cluster, coalesced per primary (see the module doc)."""

    def __init__(
        self,
        redis: RedisCluster,
        *,
        max_batch: int,
        max_in_flight: int,
        socket_timeout_s: float | None,
        retries: int = 3,
        backoff: AbstractBackoff | None = None,
    ) -> None:
        self._redis = redis
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._timeout = socket_timeout_s
        self._retries = retries
        self._backoff = backoff or ExponentialWithJitterBackoff(base=0.01, cap=0.5)
        self._pipelines: dict[str, tuple[NodeConnections, AutoPipeline]] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._refreshed_at = -math.inf
        # Calls sent again after a redirection or a node error, and slot map reads.
        self.rerouted = 0
        self.refreshes = 0

    def pipelines(self) -> dict[str, AutoPipeline]:
        """The pipeline of each node that was sent calls, by node name (tests, figures)."""
        return {name: pipeline for name, (_pool, pipeline) in self._pipelines.items()}

    def _pipeline(self, node: ClusterNode) -> AutoPipeline:
        known = self._pipelines.get(node.name)
        if known is not None:
            return known[1]
        # No resends of its own: a node that fails is retried here, after the slot map is
        # read again (the slot may live elsewhere now).
        connections = NodeConnections(node)
        pipeline = AutoPipeline(
            connections,
            max_batch=self._max_batch,
            max_in_flight=self._max_in_flight,
            socket_timeout_s=self._timeout,
            retries=0,
        )
        self._pipelines[node.name] = (connections, pipeline)
        return pipeline

    async def _node_of(self, keys: list[str]) -> ClusterNode:
        """The primary serving the slot of the call's keys, by the slot map as it is now."""
        if not self._redis.nodes_manager.slots_cache or not keys:
            await self._redis.initialize()  # reads the slot map the first time
        node = self._redis.get_node_from_key(keys[0]) if keys else self._redis.get_default_node()
        if node is None:
            raise redis.exceptions.SlotNotCoveredError(f"no node serves the slot of {keys[:1]}")
        return node

    async def evalsha(
        self, sha: str, source: str, keys: list[str], args: list[Any], wait: bool = False
    ) -> Any:
        """Run one script by sha in the next batch of the primary serving its keys' slot.
        (`wait` is accepted for the one-server signature; [redis] wait_replicas is refused
        with cluster mode, so the node pipelines carry no ReplicaWait.)"""
        failures = redirections = 0
        while True:
            try:
                node = await self._node_of(keys)
                return await self._pipeline(node).evalsha(sha, source, keys, args, wait=wait)
            except redis.exceptions.MovedError as moved:
                self.rerouted += 1
                redirections += 1
                if redirections > MAX_REDIRECTIONS:
                    raise
                await self._redis.nodes_manager.move_slot(moved)
            except redis.exceptions.AskError:
                self.rerouted += 1
                return await self._resend(sha, source, keys, args)
            except RESENT:
                self.rerouted += 1
                failures += 1
                if failures > self._retries:
                    raise
                await asyncio.sleep(self._backoff.compute(failures))
                await self._refresh()

    async def _refresh(self) -> None:
        """Read the slot map again, unless it was read less than REFRESH_INTERVAL_S ago; the
        calls that come while it is read wait for that read."""
        if self._refreshing is None or self._refreshing.done():
            if time.monotonic() - self._refreshed_at < REFRESH_INTERVAL_S:
                return
            self._refreshed_at = time.monotonic()
            self._refreshing = asyncio.get_running_loop().create_task(self._read_slot_map())
        # Shielded: a caller cancelled while waiting does not cancel the read for the others.
        await asyncio.shield(self._refreshing)

    async def _read_slot_map(self) -> None:
        self.refreshes += 1
        try:
            # The nodes manager's own read: unlike the client's initialize(), it closes no
            # connection (it marks redis-py's own for a reconnect at their next use).
            await self._redis.nodes_manager.initialize()
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as error:
            # No node answered, or not every slot is served: the map stays as it was and
            # the call's own retries decide.
            log.debug("reading the cluster's slot map failed: %r", error)

    async def _resend(self, sha: str, source: str, keys: list[str], args: list[Any]) -> Any:
        """One call through redis-py's cluster path (ASK: it sends ASKING then the call on one
        connection); NOSCRIPT loads the script on every primary first."""
        for _attempt in range(MAX_RELOADS):
            try:
                return await self._redis.evalsha(sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                await self._redis.execute_command(
                    "SCRIPT LOAD", source, target_nodes=RedisCluster.PRIMARIES
                )
        return await self._redis.evalsha(sha, len(keys), *keys, *args)

    async def aclose(self) -> None:
        """Wait for every node's batches in flight, then close the connections (they are not
        the cluster client's: close this before it, as `Scripts.aclose` does)."""
        for _connections, pipeline in list(self._pipelines.values()):
            await pipeline.aclose()
        if self._refreshing is not None:
            await asyncio.gather(self._refreshing, return_exceptions=True)
        for connections, _pipeline in list(self._pipelines.values()):
            await connections.aclose()
