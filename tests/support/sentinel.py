"""A primary, one replica and three Sentinels on free loopback ports (tests and benchmarks).

Every process is the server binary of tests/support/servers.py, in its own temporary
directory, stopped by PID. The Sentinels watch the primary under one service name with a
quorum of 2 and a short `down-after-milliseconds`, so killing the primary (`kill_primary`,
SIGKILL) promotes the replica within a few seconds (`wait_for_promotion`). The killed
server can come back as a replica of the new primary (`restart_as_replica`), which is
what a failover leaves an operator to do, and what `wait_replicas = 1` needs to accept
writes again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support.servers import (
    BINARY_VARIABLE,
    RedisProcess,
    free_port,
    server_binary,
    start_redis,
)

SERVICE = "groupbuy"
# How long the Sentinels wait before they call the primary down, and before they retry a
# failover that did not complete: short, so a test's failover takes a few seconds.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
# A replica's full sync starts at once (Redis waits 5 s by default for more replicas to
# share one diskless transfer).
SYNC_AT_ONCE = ("--repl-diskless-sync-delay", "0")


@dataclass
class SentinelProcess:
    """One Sentinel we started; `stop()` ends it by PID and removes its directory."""

    port: int
    process: subprocess.Popen[bytes]
    directory: Path

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class SentinelSet:
    """The servers of one Sentinel-watched service; `servers` holds the data servers by
    port (the first primary and its replica, then whatever comes back)."""

    service: str
    servers: dict[int, RedisProcess]
    sentinels: list[SentinelProcess]
    extra: tuple[str, ...] = ()
    killed: dict[int, RedisProcess] = field(default_factory=dict)

    @property
    def sentinel_setting(self) -> str:
        """The value of `[redis] sentinel` (GROUPBUY_REDIS_SENTINEL) for these Sentinels."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def primary_port(self) -> int:
        """The port of the server the Sentinels name as primary right now."""
        with self.sentinels[0].client() as client:
            _host, port = client.sentinel_get_master_addr_by_name(self.service)
        return int(port)

    def replica_ports(self) -> list[int]:
        """The ports of the live data servers that are not the primary."""
        primary = self.primary_port()
        return sorted(port for port in self.servers if port != primary)

    def failovers(self) -> int:
        """How many failovers the Sentinels have made of the service: its configuration
        epoch, which each promotion raises by one."""
        with self.sentinels[0].client() as client:
            return int(client.sentinel_master(self.service)["config-epoch"])

    def client(self, port: int) -> redis.Redis:
        """A plain client of one data server."""
        return redis.Redis(port=port, decode_responses=True, socket_timeout=5)

    def kill_primary(self) -> int:
        """SIGKILL the current primary (nothing flushed on the way out); returns its port."""
        port = self.primary_port()
        server = self.servers.pop(port)
        server.process.kill()
        server.process.wait()
        self.killed[port] = server
        return port

    def wait_for_promotion(self, old_port: int, timeout_s: float = 30) -> int:
        """Until every Sentinel names another primary than `old_port` and that server says it
        is a primary; returns its port."""
        deadline = time.monotonic() + timeout_s
        while True:
            named = set()
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    try:
                        named.add(int(client.sentinel_get_master_addr_by_name(self.service)[1]))
                    except redis.ConnectionError:
                        named.add(old_port)
            if len(named) == 1 and old_port not in named:
                (port,) = named
                with self.client(port) as client:
                    if client.info("replication")["role"] == "master":
                        return port
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica promoted within {timeout_s} s (named {named})")
            time.sleep(0.05)

    def restart_as_replica(self, old_port: int) -> RedisProcess:
        """Start a killed server again on its port and data, as a replica of the current
        primary (its own writes are replaced by the primary's on the first sync)."""
        dead = self.killed.pop(old_port)
        primary = self.primary_port()
        server = start_redis(
            *self.extra,
            "--replicaof",
            "127.0.0.1",
            str(primary),
            port=old_port,
            directory=dead.directory,
        )
        server.owns_directory = dead.owns_directory
        self.servers[old_port] = server
        return server

    def wait_for_replicas(self, replicas: int, timeout_s: float = 30) -> None:
        """Until the primary has this many replicas online and caught up with it."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.client(self.primary_port()) as client:
                info = client.info("replication")
            offset = int(info.get("master_repl_offset", 0))
            online = [
                value
                for key, value in info.items()
                if key.startswith("slave")
                and isinstance(value, dict)
                and value.get("state") == "online"
                and int(value.get("offset", -1)) >= offset
            ]
            if len(online) >= replicas:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(online)} of {replicas} replicas online: {info}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop every process we started (Sentinels first, so they promote nothing more)."""
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers.values():
            server.stop()
        for server in self.killed.values():
            if server.owns_directory:
                shutil.rmtree(server.directory, ignore_errors=True)


def start_sentinel_set(*extra: str, service: str = SERVICE) -> SentinelSet:
    """A primary with one replica (`extra`: more server arguments for both, persistence for
    instance) and three Sentinels watching it under `service`; returns once every Sentinel
    knows the replica and the two other Sentinels, so a failover can start at once."""
    extra = (*SYNC_AT_ONCE, *extra)
    primary = start_redis(*extra)
    servers = {primary.port: primary}
    sentinels: list[SentinelProcess] = []
    try:
        replica = start_redis(*extra, "--replicaof", "127.0.0.1", str(primary.port))
        servers[replica.port] = replica
        for _ in range(3):
            sentinels.append(_start_sentinel(service, primary.port))
        watched = SentinelSet(service, servers, sentinels, extra)
        watched.wait_for_replicas(1)
        _wait_until_acquainted(watched)
    except BaseException:
        for sentinel in sentinels:
            sentinel.stop()
        for server in servers.values():
            server.stop()
        raise
    return watched


def _start_sentinel(service: str, primary_port: int) -> SentinelProcess:
    binary = server_binary()
    if binary is None:
        raise FileNotFoundError(
            f"no Redis-compatible server can run here (redis-server, valkey-server, or "
            f"{BINARY_VARIABLE})"
        )
    directory = Path(tempfile.mkdtemp(prefix="groupbuy-sentinel-"))
    port = free_port()
    config = directory / "sentinel.conf"  # a Sentinel rewrites its file: it must be its own
    config.write_text(
        "\n".join(
            [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {directory}",
                f"sentinel monitor {service} 127.0.0.1 {primary_port} 2",
                f"sentinel down-after-milliseconds {service} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {service} 1",
                "",
            ]
        ),
        encoding="utf-8",
    )
    process = subprocess.Popen(
        [binary.path, str(config), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    sentinel = SentinelProcess(port, process, directory)
    deadline = time.monotonic() + 10
    with redis.Redis(port=port, socket_connect_timeout=0.2) as client:
        while True:
            try:
                client.ping()
                return sentinel
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    sentinel.stop()
                    raise RuntimeError(f"{binary} --sentinel did not start on {port}") from None
                time.sleep(0.05)


def _wait_until_acquainted(watched: SentinelSet, timeout_s: float = 30) -> None:
    """Until each Sentinel sees the replica and the other Sentinels (they find each other
    through the primary's hello channel, every 2 s)."""
    others = len(watched.sentinels) - 1
    deadline = time.monotonic() + timeout_s
    for sentinel in watched.sentinels:
        with sentinel.client() as client:
            while True:
                state = client.sentinel_master(watched.service)
                if int(state["num-other-sentinels"]) >= others and int(state["num-slaves"]) >= 1:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Sentinel on {sentinel.port} still sees {state}")
                time.sleep(0.1)
