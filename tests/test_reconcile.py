"""Reconciliation: a clean system reports nothing; every planted mismatch is reported."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text

from groupbuy.locks.sale import Sale
from groupbuy.ops.reconcile import Reconciler
from groupbuy.ops.reconcile.acks import unrecorded_acks
from groupbuy.redpacket.codec import grab_value, parse_grab
from groupbuy.redpacket.commitment import Commitment
from groupbuy.redpacket.models import PacketContentsRow, PacketRow
from groupbuy.services import Services
from tests.support.backends import ALL

# Also on a 3-master Redis Cluster.
pytestmark = pytest.mark.parametrize("backend", ALL)


def _reconciler(services: Services) -> Reconciler:
    return Reconciler(services.redis, services.database, services.keys, clock=services.clock)


async def _sql(services: Services, statement: str) -> None:
    async with services.database.transaction() as session:
        result: Any = await session.execute(text(statement))
        assert result.rowcount == 1, statement


def _found(report: dict[str, Any]) -> set[tuple[str, str]]:
    """(kind, the id it is about) of every mismatch."""
    return {
        (m["kind"], m.get("packet_id") or m.get("team_id") or m["user_id"])
        for m in report["mismatches"]
    }


def _counts(report: dict[str, Any]) -> tuple[int, int, int]:
    return report["packets_checked"], report["teams_checked"], report["accounts_checked"]


async def _clean_system(services: Services) -> None:
    """Deposits, a sold-out, an expired and an active packet, a formed and an open team."""
    packets, teams = services.packets, services.teams
    await packets.accounts.deposit("alice", 10_000, "dep-alice")
    await packets.accounts.deposit("bob", 5_000, "dep-bob")
    await packets.sending.send("alice", 300, 3, packet_id="sold")
    for user in ("u1", "u2", "u3"):
        await packets.grabs.grab("sold", user)
    await packets.sending.send("bob", 400, 4, packet_id="old", expires_in_s=60)
    await packets.grabs.grab("old", "u1")
    await packets.grabs.grab("old", "u4")
    await packets.sending.send("alice", 500, 5, packet_id="live", expires_in_s=3600)
    await packets.grabs.grab("live", "u2")
    services.clock.advance(60)
    assert await packets.sweeps.expire_due() == {"due": 1, "expired": 1}
    await packets.writer.drain_all()
    await teams.activities.create_activity("act", team_size=2)
    await teams.activities.open_team("act", "L1", team_id="formed", order_id="o1")
    await teams.seats.lock("act", "formed", "m1")
    await teams.seats.confirm("act", "formed", "m1", "o2")
    await teams.activities.open_team("act", "L2", team_id="open", order_id="o3")
    services.clock.advance(1)  # the first run starts after everything above


async def test_a_clean_system_has_no_mismatches(services: Services) -> None:
    await _clean_system(services)
    reconciler = _reconciler(services)
    assert await reconciler.latest() is None
    report = await reconciler.run()
    assert report["mismatches"] == [] and report["mismatch_count"] == 0
    assert _counts(report) == (3, 2, 6)  # accounts: alice, bob, u1..u4
    assert report["pending_records"] == 0
    assert report["since"] is None
    assert report["started_at"] <= report["finished_at"]
    assert report["started_at"].endswith("Z") and len(report["started_at"]) == 24
    assert await reconciler.latest() == report


async def _tamper_redis_grab(services: Services) -> None:
    grabs = services.keys.packet_keys("sold").grabs
    grab = parse_grab(await services.redis.hget(grabs, "u1"))
    await services.redis.hset(
        grabs, "u1", grab_value(*grab._replace(amount_cents=grab.amount_cents + 1))
    )


async def _shift_refund(services: Services, packet_id: str, sender: str, cents: int) -> None:
    """A refund applied with the wrong amount, as a buggy writer would: entry and balance agree."""
    await _sql(
        services,
        f"UPDATE ledger_entries SET amount_cents = amount_cents + {cents}"
        f" WHERE business_key = 'refund:{packet_id}'",
    )
    await _sql(
        services,
        f"UPDATE accounts SET balance_cents = balance_cents + {cents} WHERE user_id = '{sender}'",
    )


async def _wrong_refund(services: Services) -> None:
    await _shift_refund(services, "old", "bob", -1)


async def _recommit(services: Services) -> None:
    """Kept shares other than the grabs got (the first two moved by a cent, the sum and
    the digest made to fit): only the order of the grabs can tell."""
    async with services.database.transaction() as session:
        kept = await session.get(PacketContentsRow, "sold")
        assert kept is not None
        shares = list(Commitment.unpack(kept.shares, kept.shares_salt).shares)
        shares[0], shares[1] = shares[0] + 1, shares[1] - 1
        other = Commitment(tuple(shares), kept.shares_salt)
        kept.shares = other.pack()
        packet = await session.get(PacketRow, "sold")
        assert packet is not None
        packet.shares_sha256 = other.sha256


Plant = Callable[[Services], Awaitable[None]]

PLANTS: dict[str, tuple[Plant, set[tuple[str, str]]]] = {
    "deleted grab row": (
        # the last grab: the rows left are still the first committed shares
        lambda s: _sql(s, "DELETE FROM grabs WHERE packet_id = 'sold' AND user_id = 'u3'"),
        {
            ("packet_sold_out", "sold"),  # 2 of 3 grabs, short of the amount
            ("redis_grab_missing_in_sql", "sold"),
            ("credit_without_grab", "sold"),
        },
    ),
    "tampered balance": (
        lambda s: _sql(
            s, "UPDATE accounts SET balance_cents = balance_cents + 1 WHERE user_id = 'u3'"
        ),
        {("account_balance", "u3")},
    ),
    "deleted ledger credit": (
        lambda s: _sql(s, "DELETE FROM ledger_entries WHERE business_key = 'grab:live:u2'"),
        {("grab_credit_missing", "live"), ("account_balance", "u2")},
    ),
    "tampered redis grab": (
        _tamper_redis_grab,
        {("redis_grab_amount", "sold"), ("redis_packet_sum", "sold")},
    ),
    "wrong refund entry": (_wrong_refund, {("refund_entry", "old")}),
    "tampered commitment digest": (
        lambda s: _sql(
            s, f"UPDATE packets SET shares_sha256 = '{'0' * 64}' WHERE packet_id = 'live'"
        ),
        {("packet_commitment_digest", "live")},
    ),
    "grabs off the commitment": (_recommit, {("packet_commitment", "sold")}),
    "deleted team member": (
        lambda s: _sql(
            s,
            "DELETE FROM team_members"
            " WHERE activity_id = 'act' AND team_id = 'formed' AND user_id = 'm1'",
        ),
        {("team_formed_size", "formed"), ("redis_member_missing_in_sql", "formed")},
    ),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
async def test_each_planted_mismatch_is_reported(services: Services, plant: str) -> None:
    await _clean_system(services)
    make, expected = PLANTS[plant]
    await make(services)
    report = await _reconciler(services).run()
    assert _found(report) == expected
    assert report["mismatch_count"] == len(report["mismatches"])
    for m in report["mismatches"]:
        assert isinstance(m["detail"], str) and m["detail"]
        if m["kind"] == "team_formed_size":
            assert (m["activity_id"], m["members"], m["size"]) == ("act", 1, 2)


async def test_mismatch_numbers_and_nothing_is_fixed(services: Services) -> None:
    await _clean_system(services)
    await _sql(
        services, "UPDATE accounts SET balance_cents = balance_cents + 7 WHERE user_id = 'u3'"
    )
    await _wrong_refund(services)
    report = await _reconciler(services).run()
    by_kind = {m["kind"]: m for m in report["mismatches"]}
    u3 = by_kind["account_balance"]
    assert u3["balance_cents"] == u3["ledger_cents"] + 7
    refund = by_kind["refund_entry"]
    assert refund["packet_id"] == "old" and refund["entry_cents"] == refund["refunded_cents"] - 1
    # reported, not repaired
    assert (await services.packets.accounts.account("u3"))["balance_cents"] == u3[
        "ledger_cents"
    ] + 7


async def test_records_still_in_a_stream_are_pending_not_mismatches(services: Services) -> None:
    await _clean_system(services)
    await services.packets.grabs.grab("live", "u5")  # recorded in the packet's stream only
    await services.teams.seats.lock("act", "open", "x")
    services.clock.advance(301)  # the lock expires: the next read writes lock.expired
    await services.teams.activities.get_team("act", "open")
    reconciler = _reconciler(services)
    report = await reconciler.run()
    assert report["mismatches"] == []
    assert report["pending_records"] == 2
    await services.packets.writer.drain_all()
    await services.team_writer.drain_all()
    report = await reconciler.run()
    assert (report["mismatches"], report["pending_records"]) == ([], 0)


async def test_later_runs_check_only_what_was_touched(services: Services) -> None:
    await _clean_system(services)
    reconciler = _reconciler(services)
    first = await reconciler.run()
    assert _counts(first) == (3, 2, 6)

    second = await reconciler.run()  # nothing happened: the active packet and the open team
    assert second["since"] == first["started_at"]
    assert _counts(second) == (1, 1, 2)  # accounts: the live packet's sender and grabber
    assert second["id"] != first["id"] and second["mismatches"] == []

    await services.packets.accounts.deposit("carol", 100, "dep-carol")
    await services.packets.grabs.grab("live", "u3")
    await services.packets.writer.drain_all()
    await services.teams.seats.lock("act", "open", "m2")
    await services.teams.seats.confirm("act", "open", "m2", "o4")  # the open team forms
    third = await reconciler.run()
    assert _counts(third) == (1, 1, 4)  # accounts: alice, u2, u3 and carol
    assert third["mismatches"] == []
    assert await reconciler.latest() == third

    fourth = await reconciler.run()
    assert _counts(fourth) == (1, 0, 3)  # the formed team is no longer looked at


async def test_an_ending_recorded_late_is_still_checked(services: Services) -> None:
    """An expiry takes effect at the deadline, which may be before the previous run."""
    packets = services.packets
    await packets.accounts.deposit("alice", 1_000, "dep-alice")
    await packets.sending.send("alice", 100, 2, packet_id="soon", expires_in_s=10)
    await packets.grabs.grab("soon", "u1")
    await packets.writer.drain_all()
    services.clock.advance(20)  # due, but no expiry job has run yet
    reconciler = _reconciler(services)
    first = await reconciler.run()
    assert (first["packets_checked"], first["mismatches"]) == (1, [])
    await packets.sweeps.expire_due()
    await packets.writer.drain_all()
    await _shift_refund(services, "soon", "alice", 5)
    second = await reconciler.run()
    assert second["packets_checked"] == 1
    assert _found(second) == {("refund_entry", "soon")}


async def test_a_difference_seen_only_once_is_a_race_not_a_mismatch(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _clean_system(services)
    reconciler = _reconciler(services)
    checks: Any = reconciler._packets
    snapshots = checks._snapshots
    calls = []

    async def grab_between_the_reads(chunk: Any) -> Any:
        live = await snapshots(chunk)
        calls.append(list(chunk))
        if len(calls) == 1:  # a grab lands and is recorded after Redis was read, before SQL
            await services.packets.grabs.grab("live", "late")
            await services.packets.writer.drain_all()
        return live

    monkeypatch.setattr(checks, "_snapshots", grab_between_the_reads)
    report = await reconciler.run()
    assert calls == [["live", "old", "sold"], ["live"]]  # the suspect was looked at again
    assert report["mismatches"] == []


class _WriterRunsBeforeStreamsAreRead:
    """Redis whose first pipeline lets the write-behind finish first, as a busy writer may."""

    def __init__(self, services: Services) -> None:
        self._services = services
        self.pipelines = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._services.redis, name)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        self.pipelines += 1
        if self.pipelines == 1:
            return _AfterWriting(self._services, self._services.redis.pipeline(*args, **kwargs))
        return self._services.redis.pipeline(*args, **kwargs)


class _AfterWriting:
    def __init__(self, services: Services, pipe: Any) -> None:
        self._services, self._pipe = services, pipe

    async def __aenter__(self) -> Any:
        await self._services.packets.writer.drain_all()
        return await self._pipe.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._pipe.__aexit__(*exc)


async def test_a_grab_written_between_the_ack_reads_is_not_reported_lost(
    services: Services,
) -> None:
    await _clean_system(services)
    await services.packets.grabs.grab("live", "late")  # answered, journaled, not yet in SQL
    await services.packets.acks.flush()
    redis = _WriterRunsBeforeStreamsAreRead(services)
    lost = await unrecorded_acks(redis, services.database, services.keys, limit=100)
    assert lost == []  # seen unrecorded once, then found written when looked at again
    assert (await _reconciler(services).run())["mismatches"] == []


async def test_the_stock_held_and_the_stock_on_each_side_are_checked(services: Services) -> None:
    teams = services.teams
    await teams.activities.create_activity("sale", team_size=3, sale=Sale(stock=5))
    await teams.activities.open_team("sale", "L", team_id="t1", order_id="o1")
    await teams.seats.lock("sale", "t1", "m1")
    await teams.seats.confirm("sale", "t1", "m1", "o2")
    await teams.seats.lock("sale", "t1", "u2")  # held: 2 members + 1 live lock
    reconciler = _reconciler(services)
    assert (await reconciler.run())["mismatches"] == []

    # Redis's stock broken by hand: below what it holds, and not SQL's.
    await services.redis.hset(services.keys.activity("sale"), "stock", 2)
    found = {m["kind"]: m for m in (await reconciler.run())["mismatches"]}
    assert set(found) == {"redis_stock", "stock_overheld"}
    assert (found["redis_stock"]["redis_stock"], found["redis_stock"]["sql_stock"]) == (2, 5)
    held = found["stock_overheld"]
    assert (held["activity_id"], held["members"], held["live_locks"], held["stock"]) == (
        "sale",
        2,
        1,
        2,
    )
    # SQL's stock below its own member rows, Redis's agreeing with it.
    await _sql(services, "UPDATE activity_rules SET stock = 1 WHERE activity_id = 'sale'")
    await services.redis.hset(services.keys.activity("sale"), "stock", 1)
    found = {m["kind"]: m for m in (await reconciler.run())["mismatches"]}
    assert set(found) == {"stock_oversold", "stock_overheld"}
    assert (found["stock_oversold"]["members"], found["stock_oversold"]["stock"]) == (2, 1)
