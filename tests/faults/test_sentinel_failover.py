"""Failover behind Sentinel: kill -9 of the primary mid-storm, the service follows the
promoted replica by itself; with `wait_replicas = 1` nothing a client was told is lost, and
without it the acknowledged writes the replica had not received are, as reconciliation
then reports (`grab_acknowledged_unrecorded`).

The storm runs through the HTTP app as the other fault tests do (tests/support/storm.py).
The loss test makes the replica miss a stretch of writes on purpose: the primary refuses the
replica's reconnection (its replication user is turned off and its link killed) while grabs
are answered, then dies; without that, which writes a kill -9 catches unreplicated on
loopback is a matter of microseconds.

The SQL side is a SQLite file: the subject is Redis's replication and failover, the
write-behind into each database is the other fault tests' (tests/faults/).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions
from sqlalchemy import select

from groupbuy import errors
from groupbuy.redpacket.models import GrabRow
from groupbuy.services import Services, build_services, running
from tests.support.database import sqlite_url
from tests.support.money import assert_money_conserved
from tests.support.sentinel import SentinelSet, start_sentinel_set
from tests.support.storm import (
    PERSIST,
    Storm,
    check_after_storm,
    running_app,
    storm_settings,
)

pytestmark = pytest.mark.slow  # each test starts five servers and waits out a failover
NOEVICTION = ("--maxmemory-policy", "noeviction")
# How long a write waits for the replica before answering 503 redis_replication_timeout.
WAIT_TIMEOUT_S = "1.0"


@pytest.fixture
def watched() -> Iterator[SentinelSet]:
    servers = start_sentinel_set(*PERSIST, *NOEVICTION)
    try:
        yield servers
    finally:
        servers.stop()


async def test_kill_9_of_the_primary_mid_storm_loses_nothing_with_wait_replicas_1(
    watched: SentinelSet, tmp_path: Path
) -> None:
    settings = storm_settings(
        "",
        sqlite_url(tmp_path),
        GROUPBUY_REDIS_SENTINEL=watched.sentinel_setting,
        GROUPBUY_REDIS_WAIT_REPLICAS="1",
        GROUPBUY_REDIS_WAIT_TIMEOUT_S=WAIT_TIMEOUT_S,
    )
    async with running_app(settings) as (app, client):
        storm = Storm(client)
        await storm.prepare()
        storm.start()
        await storm.wait_calls(300)
        told_before = storm.answers["grabbed"] + storm.answers["locked"]
        old = watched.kill_primary()
        killed_at = time.monotonic()
        new = await asyncio.to_thread(watched.wait_for_promotion, old)
        promoted_s = time.monotonic() - killed_at
        # The killed server comes back as a replica of the promoted one: until then no write
        # can be confirmed by a replica, and each answers 503 redis_replication_timeout.
        await asyncio.to_thread(watched.restart_as_replica, old)
        grabbed_at_kill = storm.answers["grabbed"]
        while storm.answers["grabbed"] == grabbed_at_kill:
            assert time.monotonic() - killed_at < 60, storm.summary()
            await asyncio.sleep(0.01)
        recovered_s = time.monotonic() - killed_at
        calls_at_recovery = storm.calls
        await storm.wait_calls(storm.calls + 300)
        await storm.stop()
        figures = await check_after_storm(
            "sentinel failover, wait_replicas 1",
            storm,
            app,
            client,
            promoted_s=round(promoted_s, 2),
            recovered_s=round(recovered_s, 2),
            new_primary=new,
            # 2 when the Sentinels failed over again, from a promoted primary they could not
            # reach in time to the old one before it had synced (its own data, then).
            failovers=watched.failovers(),
        )
    refused = {kind: n for kind, n in figures.answers.items() if kind.startswith("503")}
    print(
        f"[sentinel failover] {told_before} successes told before the kill; promoted in "
        f"{promoted_s:.2f} s, first grab answered after {recovered_s:.2f} s "
        f"(call {calls_at_recovery}); 503s: {refused}"
    )
    assert refused, figures  # the failover was felt: some calls answered 503
    assert set(refused) <= {"503 redis_unavailable", "503 redis_replication_timeout"}, refused
    assert storm.calls > calls_at_recovery + 300


async def test_without_wait_replicas_a_failover_loses_unreplicated_grabs_and_reconcile_names_them(
    watched: SentinelSet, tmp_path: Path
) -> None:
    lost, answers = await _grabs_across_a_failover(watched, tmp_path, wait_replicas=0)
    assert set(answers["cut"].values()) == {"grabbed"}  # told grabbed, then lost with the primary
    assert lost == {user: ("grabbed", cents) for user, cents in answers["cut_cents"].items()}


async def test_with_wait_replicas_the_same_failover_loses_nothing_a_client_was_told(
    watched: SentinelSet, tmp_path: Path
) -> None:
    lost, answers = await _grabs_across_a_failover(watched, tmp_path, wait_replicas=1)
    assert set(answers["cut"].values()) == {"redis_replication_timeout"}
    assert lost == {}


async def test_with_wait_replicas_sql_takes_no_grab_the_promoted_replica_lacks(
    watched: SentinelSet, tmp_path: Path
) -> None:
    """The write-behind runs while the replica receives nothing (what a failover to a replica
    that never caught up, or a second failover, leaves): it writes none of the grabs the
    replica lacks. After the failover their retries take other shares, and every grab row
    is the amount its user was told."""
    settings = storm_settings(
        "",
        sqlite_url(tmp_path),
        GROUPBUY_REDIS_SENTINEL=watched.sentinel_setting,
        GROUPBUY_REDIS_WAIT_REPLICAS="1",
        GROUPBUY_REDIS_WAIT_TIMEOUT_S=WAIT_TIMEOUT_S,
        GROUPBUY_SCHEDULER_ENABLED="false",  # the write-behind runs when the test says
    )
    told: dict[str, int] = {}
    async with running(build_services(settings), scheduler=False) as services:
        packets = services.packets
        await packets.accounts.deposit("sender", 100_000, "funds")
        await packets.sending.send("sender", 100_000, 1_000, packet_id="pk")
        for n in range(10):
            told[f"before{n}"] = (await _grab_until_answered(services, f"before{n}"))[1]
        await services.jobs.run("flush_records")
        await asyncio.to_thread(watched.wait_for_replicas, 1)

        await asyncio.to_thread(_cut_replication, watched)
        cut = await asyncio.gather(*(_grab_once(services, f"cut{n}") for n in range(10)))
        assert {status for status, _cents in cut} == {"redis_replication_timeout"}
        with pytest.raises(errors.RedisReplicationTimeout):
            await services.jobs.run("flush_records")
        assert await _grab_rows(services) == told  # none of the cut grabs

        old = watched.kill_primary()
        await asyncio.to_thread(watched.wait_for_promotion, old)
        await asyncio.to_thread(watched.restart_as_replica, old)
        # Others first, so the retries of the cut grabs take other shares than on the
        # primary that died: a row of the lost grab would keep its amount instead.
        for user in [*(f"after{n}" for n in range(10)), *(f"cut{n}" for n in range(10))]:
            status, told[user] = await _grab_until_answered(services, user)
            assert status == "grabbed", (user, status)
        for _ in range(50):
            if (await services.jobs.run("flush_records"))["backlog"] == 0:
                break
        assert await _grab_rows(services) == told
        await packets.acks.flush()  # the journal of answers, for reconciliation
        report = await services.jobs.run("reconcile")
        assert report["mismatches"] == [], report
        await assert_money_conserved(services)


async def _grab_rows(services: Services) -> dict[str, int]:
    """User -> amount of every grab row of packet pk in SQL."""
    async with services.database.sessions() as session:
        rows = await session.execute(
            select(GrabRow.user_id, GrabRow.amount_cents).where(GrabRow.packet_id == "pk")
        )
        return {user: cents for user, cents in rows}


async def _grabs_across_a_failover(
    watched: SentinelSet, tmp_path: Path, wait_replicas: int
) -> tuple[dict[str, tuple[str, int]], dict[str, dict[str, Any]]]:
    """Grabs answered before the cut (replicated), during it (the replica receives nothing),
    then kill -9 of the primary, grabs on the promoted replica, and a reconciliation.
    Returns what reconciliation names lost (user -> kind, cents told) and the answers."""
    settings = storm_settings(
        "",
        sqlite_url(tmp_path),
        GROUPBUY_REDIS_SENTINEL=watched.sentinel_setting,
        GROUPBUY_REDIS_WAIT_REPLICAS=str(wait_replicas),
        GROUPBUY_REDIS_WAIT_TIMEOUT_S=WAIT_TIMEOUT_S,
        GROUPBUY_SCHEDULER_ENABLED="false",  # the write-behind runs when the test says
    )
    answers: dict[str, dict[str, Any]] = {"cut": {}, "cut_cents": {}}
    async with running(build_services(settings), scheduler=False) as services:
        packets = services.packets
        await packets.accounts.deposit("sender", 100_000, "funds")
        await packets.sending.send("sender", 100_000, 1_000, packet_id="pk")
        for n in range(10):
            assert (await packets.grabs.grab("pk", f"before{n}"))["status"] == "grabbed"
        await services.jobs.run("flush_records")
        await asyncio.to_thread(watched.wait_for_replicas, 1)

        await asyncio.to_thread(_cut_replication, watched)
        cut = await asyncio.gather(
            *(_grab_once(services, f"cut{n}") for n in range(10)), return_exceptions=True
        )
        for n, answer in enumerate(cut):
            assert not isinstance(answer, BaseException), answer
            answers["cut"][f"cut{n}"] = answer[0]
            if answer[0] == "grabbed":
                answers["cut_cents"][f"cut{n}"] = answer[1]
        await packets.acks.flush()  # the journal of answers is in SQL before the crash

        old = watched.kill_primary()
        await asyncio.to_thread(watched.wait_for_promotion, old)
        if wait_replicas:
            await asyncio.to_thread(watched.restart_as_replica, old)
        for n in range(10):
            await _grab_until_answered(services, f"after{n}")
        for _ in range(50):
            if (await services.jobs.run("flush_records"))["backlog"] == 0:
                break
        await packets.acks.flush()
        report = await services.jobs.run("reconcile")
        await assert_money_conserved(services)
    lost = {
        str(m["user_id"]): (str(m["kind"]), int(m["amount_cents"]))
        for m in report["mismatches"]
        if m["kind"] == "grab_acknowledged_unrecorded"
    }
    others = [m for m in report["mismatches"] if m["kind"] != "grab_acknowledged_unrecorded"]
    assert not others, others
    print(
        f"\n[sentinel loss, wait_replicas {wait_replicas}] answers during the cut "
        f"{sorted(answers['cut'].values())}; reconciliation: {len(lost)} "
        f"grab_acknowledged_unrecorded"
    )
    return {user: ("grabbed", cents) for user, (_kind, cents) in lost.items()}, answers


def _cut_replication(watched: SentinelSet) -> None:
    """From now on the replica receives nothing: its link is cut and the primary refuses its
    reconnection (its replication user is turned off). The replica still counts as the
    primary's for the Sentinels, which promote it (its link is down for less than 10 times
    down-after-milliseconds)."""
    primary = watched.primary_port()
    (replica,) = watched.replica_ports()
    with watched.client(primary) as client:
        client.acl_setuser(
            "replicator",
            enabled=True,
            passwords=["+secret"],
            commands=["+@all"],
            keys=["*"],
            channels=["*"],
        )
    with watched.client(replica) as client:
        client.config_set("masteruser", "replicator")
        client.config_set("masterauth", "secret")
    with watched.client(primary) as client:
        client.acl_setuser("replicator", enabled=False, passwords=["+secret"])
        client.client_kill_filter(_type="replica")
    with watched.client(replica) as client:
        deadline = time.monotonic() + 10
        while client.info("replication")["master_link_status"] != "down":
            assert time.monotonic() < deadline, "the replica's link is still up"
            time.sleep(0.02)


async def _grab_once(services: Services, user_id: str) -> tuple[str, int]:
    """(status, cents) of one grab, or (the 503's code, 0)."""
    try:
        answer = await services.packets.grabs.grab("pk", user_id)
    except errors.RedisReplicationTimeout as refused:
        return refused.code, 0
    return str(answer["status"]), int(answer["amount_cents"])


async def _grab_until_answered(services: Services, user_id: str) -> tuple[str, int]:
    """Grab as a client does, again after each 503, until a definitive answer."""
    deadline = time.monotonic() + 60
    while True:
        try:
            status, cents = await _grab_once(services, user_id)
            if status in ("grabbed", "already_grabbed"):
                return status, cents
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            pass
        assert time.monotonic() < deadline, f"{user_id}: no answer but 503 for 60 s"
        await asyncio.sleep(0.05)
