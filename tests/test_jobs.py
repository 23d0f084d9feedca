"""The scheduled jobs: each applies what time did exactly once, however often it runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.exceptions
from sqlalchemy import select

from groupbuy import errors
from groupbuy.redpacket.models import GrabRow, LedgerEntryRow
from groupbuy.redpacket.recording import record_packet_batch
from groupbuy.redpacket.records import PacketRecord
from groupbuy.redpacket.terms import Terms
from groupbuy.redpacket.writer import LANES
from groupbuy.services import Services
from groupbuy.storage.events import EventRow
from groupbuy.storage.reachability import unreachable
from tests.support.backends import ALL
from tests.support.fixtures import SendPacketViaServices
from tests.support.money import assert_money_conserved, count

# Also on a 3-master Redis Cluster.
pytestmark = pytest.mark.parametrize("backend", ALL)


async def events(services: Services, kind: str) -> list[dict[str, Any]]:
    import json

    async with services.database.sessions() as session:
        rows = (await session.scalars(select(EventRow).where(EventRow.type == kind))).all()
    return [json.loads(row.data) for row in rows]


async def run(services: Services, name: str) -> dict[str, Any]:
    return await services.jobs.run(name)


async def test_sweep_locks_expires_each_lock_once(services: Services) -> None:
    teams = services.teams
    await teams.activities.create_activity("a1", team_size=4, lock_ttl_s=10)
    for t in range(3):
        await teams.activities.open_team("a1", f"L{t}", team_id=f"t{t}")
        for u in range(2):
            await teams.seats.lock("a1", f"t{t}", f"u{t}{u}")
    report = await run(services, "sweep_locks")
    assert report["locks_expired"] == 0 and report["teams"] == 0  # nothing due yet
    services.clock.advance(10)
    report = await run(services, "sweep_locks")
    assert report["job"] == "sweep_locks" and report["locks_expired"] == 6 and report["teams"] == 3
    again = await run(services, "sweep_locks")
    assert again["locks_expired"] == 0 and again["teams"] == 0  # the index no longer lists them
    expired = await events(services, "lock.expired")
    assert sorted(e["user_id"] for e in expired) == sorted(
        f"u{t}{u}" for t in range(3) for u in range(2)
    )
    team = await teams.activities.get_team("a1", "t0")
    assert team["locks"] == [] and team["free_seats"] == 3


async def test_expire_teams_fails_open_teams_once_with_their_refund_list(
    services: Services,
) -> None:
    teams = services.teams
    await teams.activities.create_activity("a1", team_size=2, team_deadline_s=60)
    await teams.activities.open_team("a1", "L1", team_id="open", order_id="o-L1")
    await teams.activities.open_team("a1", "L2", team_id="formed", order_id="o-L2")
    await teams.seats.lock("a1", "formed", "u2")
    await teams.seats.confirm("a1", "formed", "u2", "o-u2")
    await teams.seats.lock("a1", "open", "u1")
    services.clock.advance(60)
    report = await run(services, "expire_teams")
    assert report["teams_failed"] == 1
    assert (await run(services, "expire_teams"))["teams"] == 0
    failed = await events(services, "team.failed")
    assert failed == [
        {
            "activity_id": "a1",
            "team_id": "open",
            "members": [{"user_id": "L1", "order_id": "o-L1"}],
            "reason": "deadline",
            "version": 3,  # opened, locked, failed (the live lock ends with the team)
        }
    ]
    assert (await teams.activities.get_team("a1", "formed"))[
        "status"
    ] == "formed"  # formed teams never fail
    assert (await teams.activities.get_team("a1", "open"))["status"] == "failed"


async def test_jobs_running_twice_at_once_change_nothing_twice(
    services: Services, sent_packet_via_services: SendPacketViaServices
) -> None:
    teams, packets = services.teams, services.packets
    await teams.activities.create_activity("a1", lock_ttl_s=5, team_deadline_s=20)
    await teams.activities.open_team("a1", "L", team_id="t1", order_id="oL")
    await teams.seats.lock("a1", "t1", "u1")
    await sent_packet_via_services(100, 4, funds=100, sender_id="s", expires_in_s=20)
    await packets.grabs.grab("pk", "g1")
    services.clock.advance(20)
    names = ["sweep_locks", "expire_teams", "expire_packets", "flush_records"]
    for _ in range(2):
        await asyncio.gather(*(run(services, n) for n in names for _ in range(2)))
    await run(services, "flush_records")
    assert len(await events(services, "lock.expired")) == 1
    assert len(await events(services, "team.failed")) == 1
    assert len(await events(services, "packet.refunded")) == 1
    assert await count(services, LedgerEntryRow, kind="refund_credit") == 1
    await assert_money_conserved(services)


async def test_repair_returns_redis_to_its_baseline(services: Services) -> None:
    """SPEC §4.9: once teams and packets have ended and been swept, their keys are gone."""
    redis, teams, packets = services.redis, services.teams, services.packets
    baseline = await redis.dbsize()
    await teams.activities.create_activity("a1", team_size=2, lock_ttl_s=5, team_deadline_s=30)
    await teams.activities.open_team("a1", "L1", team_id="formed")
    await teams.seats.lock("a1", "formed", "u1")
    await teams.seats.confirm("a1", "formed", "u1", "o1")
    await teams.activities.open_team("a1", "L2", team_id="fails")
    await packets.accounts.deposit("s", 100, "funds")
    await packets.sending.send("s", 10, 2, packet_id="sold")
    await packets.grabs.grab("sold", "g1")
    await packets.grabs.grab("sold", "g2")
    await packets.sending.send("s", 50, 5, packet_id="expires", expires_in_s=30)
    await packets.grabs.grab("expires", "g1")
    # a packet with terms: its recipients, wrong-password counts and grab order go too
    terms = Terms(recipients=("g1", "g2", "g3"), password="pw", sender_may_grab=False)
    await packets.sending.send("s", 30, 3, packet_id="terms", terms=terms)
    await packets.grabs.grab("terms", "g1", "pw")
    with pytest.raises(errors.WrongPassword):
        await packets.grabs.grab("terms", "g2", "wrong")
    await packets.withdrawals.withdraw("terms", "s")
    assert await redis.dbsize() > baseline
    services.clock.advance(30)
    for name in ["sweep_locks", "expire_teams", "expire_packets", "flush_records", "repair"]:
        await run(services, name)
    report = await run(services, "repair")
    assert report["activities_released"] == 0  # nothing left to release the second time
    assert await redis.dbsize() == baseline, await redis.keys("*")
    # what Redis forgot, SQL answers
    assert (await teams.activities.get_team("a1", "formed"))["status"] == "formed"
    assert (await packets.reads.get("sold"))["status"] == "sold_out"
    assert (await packets.reads.get("terms"))["status"] == "withdrawn"
    assert (await packets.grabs.grab("expires", "g1"))["status"] == "already_grabbed"
    # and the activity comes back to Redis when it is used again
    assert (await teams.activities.open_team("a1", "L3", team_id="again")).created
    await assert_money_conserved(services)


async def test_unknown_job_is_not_found(services: Services) -> None:
    from groupbuy import errors

    with pytest.raises(errors.NotFound):
        await run(services, "nope")


async def test_jobs_are_counted_and_flush_records_reports_the_backlog(
    services: Services, sent_packet_via_services: SendPacketViaServices
) -> None:
    from prometheus_client import REGISTRY

    def runs(job: str) -> float:
        labels = {"job": job, "result": "ok"}
        return REGISTRY.get_sample_value("groupbuy_job_runs_total", labels) or 0.0

    before = runs("flush_records")
    packets = services.packets
    await sent_packet_via_services(100, 5, funds=100, sender_id="s")
    for user in ("a", "b"):
        await packets.grabs.grab("pk", user)
    report = await run(services, "flush_records")
    assert report["packet_records"] == 2 and report["backlog"] == 0 and report["lag_s"] == 0
    assert runs("flush_records") == before + 1
    assert (
        REGISTRY.get_sample_value("groupbuy_writeback_backlog_records", {"engine": "packets"}) == 0
    )


async def test_lost_due_entries_are_found_again_by_the_repair(
    services: Services, sent_packet_via_services: SendPacketViaServices
) -> None:
    teams, keys = services.teams, services.keys
    await teams.activities.create_activity("a1", lock_ttl_s=5, team_deadline_s=60)
    await teams.activities.open_team("a1", "L", team_id="t1")
    await teams.seats.lock("a1", "t1", "u1")
    await teams.activities.create_activity("a2", lock_ttl_s=5, team_deadline_s=3600)
    await teams.activities.open_team("a2", "L", team_id="t1")
    await teams.seats.lock("a2", "t1", "u1")
    await sent_packet_via_services(100, 4, funds=100, sender_id="s", expires_in_s=5)
    # Every entry lost (on Redis Cluster, from the indexes of each activity's and packet's slot).
    lost = {keys.due_packets(keys.packet_slot("pk"))}
    for aid in ("a1", "a2"):
        slot = keys.activity_slot(aid)
        lost |= {keys.due_locks(slot), keys.due_deadlines(slot)}
    for key in lost:
        assert await services.redis.delete(key) == 1
    services.clock.advance(60)
    assert (await run(services, "sweep_locks"))["locks_expired"] == 0  # nothing visited
    assert (await run(services, "expire_teams"))["teams_failed"] == 0
    assert (await run(services, "expire_packets"))["due"] == 0
    report = await run(services, "repair")
    assert report["activities_reindexed"] == 2 and report["packets_reindexed"] == 1
    swept = await run(services, "expire_teams")  # a1 past its deadline: its lock goes with it
    assert swept["teams_failed"] == 1 and swept["locks_expired"] == 1
    swept = await run(services, "sweep_locks")  # a2's lock
    assert swept["locks_expired"] == 1 and swept["teams"] == 1
    await run(services, "flush_records")
    assert len(await events(services, "lock.expired")) == 2
    assert len(await events(services, "team.failed")) == 1
    assert len(await events(services, "packet.refunded")) == 1  # the repair expired it
    assert await count(services, LedgerEntryRow, kind="refund_credit") == 1
    await assert_money_conserved(services)


async def test_an_idle_round_reads_no_sql(
    services: Services, sent_packet_via_services: SendPacketViaServices
) -> None:
    from tests.support.counting import sql_statements

    await services.teams.activities.create_activity("a1")
    await services.teams.activities.open_team("a1", "L", team_id="t1")
    await sent_packet_via_services(100, 4, funds=100, sender_id="s")
    await run(services, "flush_records")
    for name in ["flush_records", "sweep_locks", "expire_teams", "expire_packets"]:
        with sql_statements(services.database) as statements:
            await run(services, name)
        assert statements == [], (name, statements)


async def test_a_flush_run_takes_a_batch_of_each_packet_in_turn(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One huge stream does not hold up the others: the small packets are in SQL after the
    huge one's first batch, long before its last."""
    packets = services.packets
    await packets.accounts.deposit("sender", 10_000, "funds")
    await packets.sending.send("sender", 1_000, 40, packet_id="huge")
    for n in range(30):  # its records are the oldest: the run starts with it
        await packets.grabs.grab("huge", f"u{n}")
    for small in ("s1", "s2", "s3"):
        await packets.sending.send("sender", 100, 10, packet_id=small)
        for n in range(3):
            await packets.grabs.grab(small, f"u{n}")
    monkeypatch.setattr(packets.writer, "_batch_size", 5)  # the huge stream: 6 batches
    batches: list[str] = []

    async def logged(database: Any, packet_id: str, records: list[PacketRecord]) -> str | None:
        batches.append(packet_id)
        return await record_packet_batch(database, packet_id, records)

    monkeypatch.setattr("groupbuy.redpacket.writer.record_packet_batch", logged)
    report = await run(services, "flush_records")  # by hand: no time limit
    assert (report["packet_records"], report["complete"], report["backlog"]) == (39, True, 0)
    # Each packet once before the huge one again (the lanes may swap neighbours' turns).
    assert sorted(batches[:4]) == ["huge", "s1", "s2", "s3"], batches
    assert batches[4:] == ["huge"] * 5, batches
    assert await count(services, GrabRow) == 39


async def test_a_scheduled_flush_run_stops_in_time_and_the_next_runs_go_on(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run given less time than one batch takes applies the batches it started at once,
    one per lane (every run moves), and leaves the rest to the next runs, whatever the
    machine's speed."""
    packets = services.packets
    await packets.accounts.deposit("sender", 10_000, "funds")
    packet_ids = [f"p{n}" for n in range(LANES + 1)]  # one more packet than a run starts
    for packet in packet_ids:
        await packets.sending.send("sender", 100, 10, packet_id=packet)
        for n in range(4):
            await packets.grabs.grab(packet, f"u{n}")

    async def slow(database: Any, packet_id: str, records: list[PacketRecord]) -> str | None:
        await asyncio.sleep(0.1)  # a batch slower than the run's whole time
        return await record_packet_batch(database, packet_id, records)

    monkeypatch.setattr("groupbuy.redpacket.writer.record_packet_batch", slow)
    reports = [await services.jobs.run("flush_records", within_s=0.05) for _ in range(3)]
    assert [(r["packet_records"], r["complete"]) for r in reports] == [
        (4 * LANES, False),
        (4, True),
        (0, True),
    ], reports
    assert [r["backlog"] for r in reports] == [4, 0, 0]
    assert await count(services, GrabRow) == 4 * len(packet_ids)


# What a command meets when redis-py's cluster client closed its connection under it (it
# closes every node's connections on CLUSTERDOWN, as in a primary's failover), on uvloop.
CLOSED = (
    "unable to perform operation on <TCPTransport closed=True reading=False>; the handler is closed"
)


class ClosingRedis:
    """The services' Redis client, but its next `failures` ZRANGEBYSCORE calls fail as a
    connection closed under them does."""

    def __init__(self, redis: Any, failures: int, error: str = CLOSED) -> None:
        self._redis = redis
        self.failures = failures
        self._error = error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)

    async def zrangebyscore(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise RuntimeError(self._error)
        return await self._redis.zrangebyscore(*args, **kwargs)


async def _a_team_past_its_deadline(services: Services) -> None:
    await services.teams.activities.create_activity("a1", team_size=2, team_deadline_s=60)
    await services.teams.activities.open_team("a1", "L1", team_id="t1")
    services.clock.advance(60)


async def test_a_job_meeting_a_connection_closed_under_it_runs_again(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """expire_teams met the closed-transport RuntimeError during a cluster failover and
    failed until its next interval: the run now goes on once more, on new connections."""
    await _a_team_past_its_deadline(services)
    sweeps = services.teams.sweeps
    closing = ClosingRedis(sweeps._redis, failures=1)
    monkeypatch.setattr(sweeps, "_redis", closing)
    report = await run(services, "expire_teams")
    assert closing.failures == 0
    assert report["teams_failed"] == 1
    assert (await services.teams.activities.get_team("a1", "t1"))["status"] == "failed"


async def test_a_job_whose_connection_keeps_closing_reports_redis_unreachable(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twice in one run: Redis is away as far as the job can tell, so it says so (the
    scheduler logs it once per outage, a run by hand answers 503), not a bare RuntimeError."""
    await _a_team_past_its_deadline(services)
    sweeps = services.teams.sweeps
    monkeypatch.setattr(sweeps, "_redis", ClosingRedis(sweeps._redis, failures=2))
    with pytest.raises(redis.exceptions.ConnectionError) as raised:
        await run(services, "expire_teams")
    assert unreachable(raised.value)
    assert (await run(services, "expire_teams"))["teams_failed"] == 1


async def test_a_job_failing_with_another_runtime_error_is_not_run_again(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _a_team_past_its_deadline(services)
    sweeps = services.teams.sweeps
    closing = ClosingRedis(sweeps._redis, failures=2, error="a bug of ours")
    monkeypatch.setattr(sweeps, "_redis", closing)
    with pytest.raises(RuntimeError, match="a bug of ours"):
        await run(services, "expire_teams")
    assert closing.failures == 1
