"""`[redis] sentinel`: the service asks the Sentinels for the primary and follows a failover
by itself, on both call paths (coalesced and one EVALSHA each)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions

from groupbuy.services import Services, build_services, running
from groupbuy.settings import Settings, load_settings
from groupbuy.storage.durability import RedisNotDurable
from groupbuy.storage.redis_client import describe
from tests.support.sentinel import SentinelSet, start_sentinel_set
from tests.support.servers import server_binary
from tests.support.settings import API_KEYS

# Each test starts five servers (~3 s) and most wait out a failover (~2-3 s).
pytestmark = [
    pytest.mark.real,
    pytest.mark.slow,
    pytest.mark.skipif(
        server_binary() is None and not os.environ.get("CI"), reason="needs a server binary"
    ),
]
DURABLE = ("--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")


@pytest.fixture
def watched() -> Iterator[SentinelSet]:
    """A durable primary, its replica and three Sentinels, stopped at the end."""
    servers = start_sentinel_set(*DURABLE)
    try:
        yield servers
    finally:
        servers.stop()


def sentinel_settings(tmp_path: Path, watched: SentinelSet, **more: str) -> Settings:
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'groupbuy.db'}",
            "GROUPBUY_REDIS_SENTINEL": watched.sentinel_setting,
            "GROUPBUY_REDIS_SOCKET_TIMEOUT_S": "0.5",
            **more,
        },
    )


@pytest.fixture(params=[True, False], ids=["coalesced", "one-evalsha-each"])
async def services(
    request: pytest.FixtureRequest, tmp_path: Path, watched: SentinelSet
) -> AsyncIterator[Services]:
    settings = sentinel_settings(
        tmp_path, watched, GROUPBUY_REDIS_AUTO_PIPELINE=str(request.param).lower()
    )
    async with running(build_services(settings), scheduler=False) as started:
        yield started


async def grab_until_answered(
    services: Services, packet_id: str, user_id: str, timeout_s: float = 30
) -> tuple[dict[str, Any], int]:
    """Grab until the call answers; returns the answer and how many calls failed first with
    Redis unreachable (the API's 503). Any other error fails the test."""
    failed = 0
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return dict(await services.packets.grabs.grab(packet_id, user_id)), failed
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            failed += 1
            assert time.monotonic() < deadline, f"{user_id}: still failing after {timeout_s} s"
            await asyncio.sleep(0.05)


def grabs_on(watched: SentinelSet, port: int, services: Services, packet_id: str) -> set[str]:
    """The users holding a grab of the packet on one server, read from its grab hash."""
    with watched.client(port) as client:
        return set(client.hkeys(services.keys.packet_keys(packet_id).grabs))


def test_settings_name_the_sentinels_and_describe_no_credentials() -> None:
    settings = load_settings(
        None, {"GROUPBUY_REDIS_SENTINEL": "10.0.0.1:26379, 10.0.0.2:26380"}
    ).redis
    assert settings.sentinel_addresses == [("10.0.0.1", 26379), ("10.0.0.2", 26380)]
    assert not settings.embedded  # no URL, but Sentinels: not the embedded engine
    assert describe(settings) == (
        "the primary of 'groupbuy' (Sentinels 10.0.0.1:26379, 10.0.0.2:26380)"
    )


async def test_the_service_follows_the_promoted_replica_after_a_kill_9(
    services: Services, watched: SentinelSet
) -> None:
    packets = services.packets
    await packets.accounts.deposit("sender", 10_000, "funds")
    await packets.sending.send("sender", 10_000, 100, packet_id="pk")
    for n in range(5):
        answer, failed = await grab_until_answered(services, "pk", f"before{n}")
        assert (answer["status"], failed) == ("grabbed", 0)
    watched.wait_for_replicas(1)  # what was answered is on the replica before the kill
    old = watched.kill_primary()
    killed_at = time.monotonic()
    failures = 0
    for n in range(5):
        answer, failed = await grab_until_answered(services, "pk", f"after{n}")
        assert answer["status"] == "grabbed", answer
        failures += failed
    recovered_s = time.monotonic() - killed_at
    new = watched.primary_port()
    assert new != old
    users = {f"before{n}" for n in range(5)} | {f"after{n}" for n in range(5)}
    assert grabs_on(watched, new, services, "pk") == users
    # Each later call goes straight to the new primary.
    answer, failed = await grab_until_answered(services, "pk", "later")
    assert (answer["status"], failed) == ("grabbed", 0)
    print(f"\n[sentinel kill -9] recovered in {recovered_s:.2f} s, {failures} calls failed first")


async def test_a_demoted_primary_answering_readonly_sends_the_calls_to_the_new_one(
    services: Services, watched: SentinelSet
) -> None:
    packets = services.packets
    await packets.accounts.deposit("sender", 10_000, "funds")
    await packets.sending.send("sender", 10_000, 100, packet_id="pk")
    answer, _failed = await grab_until_answered(services, "pk", "first")
    assert answer["status"] == "grabbed"
    old = watched.primary_port()
    with watched.sentinels[0].client() as sentinel:
        assert sentinel.sentinel_failover(watched.service)  # no kill: the old one lives on
    deadline = time.monotonic() + 30
    while watched.client(old).info("replication")["role"] != "slave":
        assert time.monotonic() < deadline, "the old primary was not demoted"
        await asyncio.sleep(0.05)
    # The pooled connections still lead to the old primary, now a replica: its READONLY
    # makes the client ask the Sentinels again instead of failing the call.
    for n in range(5):
        answer, _failed = await grab_until_answered(services, "pk", f"after{n}")
        assert answer["status"] == "grabbed", answer
    new = watched.primary_port()
    assert new != old
    assert {f"after{n}" for n in range(5)} <= grabs_on(watched, new, services, "pk")


async def test_start_up_checks_the_replicas_a_failover_may_promote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The primary is durable, its replica is not: the replica is named at start, and
    refused with strict."""
    watched = start_sentinel_set(*DURABLE)
    try:
        (replica,) = watched.replica_ports()
        with watched.client(replica) as client:
            client.config_set("appendonly", "no")
        settings = sentinel_settings(tmp_path, watched)
        with caplog.at_level(logging.WARNING, "groupbuy.storage.durability"):
            async with running(build_services(settings), scheduler=False):
                pass
        warned = [r.getMessage() for r in caplog.records if "appendonly is 'no'" in r.getMessage()]
        assert len(warned) == 1 and f"127.0.0.1:{replica} (a replica of 'groupbuy')" in warned[0]
        strict = sentinel_settings(tmp_path, watched, GROUPBUY_REDIS_STRICT="true")
        with pytest.raises(RedisNotDurable, match=f"127.0.0.1:{replica}"):
            async with running(build_services(strict), scheduler=False):
                pass
        # wait_replicas asking for more replicas than there are is said at start.
        caplog.clear()
        greedy = sentinel_settings(tmp_path, watched, GROUPBUY_REDIS_WAIT_REPLICAS="2")
        with caplog.at_level(logging.WARNING, "groupbuy.storage.durability"):
            async with running(build_services(greedy), scheduler=False):
                pass
        assert any(
            "wait_replicas = 2 but the primary has 1 replica(s) connected" in r.getMessage()
            for r in caplog.records
        )
    finally:
        watched.stop()
