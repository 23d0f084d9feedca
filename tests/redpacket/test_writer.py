"""The grab write-behind survives a writer killed midway and SQL being down (SPEC §4.5)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import sqlalchemy.exc
from sqlalchemy import select

from groupbuy import errors
from groupbuy.redpacket import acks as acks_module
from groupbuy.redpacket.models import (
    AcknowledgedGrabRow,
    GrabRow,
    LedgerEntryRow,
    PacketRow,
)
from groupbuy.redpacket.recording import record_packet_batch
from groupbuy.redpacket.records import PacketRecord
from groupbuy.redpacket.writer import PacketRecordWriter
from groupbuy.services import Services
from groupbuy.storage.backends import Backends
from groupbuy.storage.events import EventRow
from tests.support.database import fail_writes
from tests.support.money import assert_money_conserved, count


class Killed(Exception):
    """Stands for the writer process dying at that point."""


def other_writer(services: Services, name: str, batch_size: int = 500) -> PacketRecordWriter:
    """A second writer process: another consumer of the group, taking over at once."""
    backends = Backends(
        services.redis, services.scripts, services.database, services.keys, services.clock
    )
    return PacketRecordWriter(backends, batch_size, 0, consumer=name)


async def grabbed_packet(services: Services, users: int = 5, shares: int = 5) -> dict[str, int]:
    packets = services.packets
    await packets.accounts.deposit("sender", 1000, "funds")
    await packets.sending.send("sender", 1000, shares, packet_id="pk")
    return {
        f"u{i}": (await packets.grabs.grab("pk", f"u{i}"))["amount_cents"] for i in range(users)
    }


async def assert_recorded_once(services: Services, won: dict[str, int]) -> None:
    assert await count(services, GrabRow) == len(won)
    assert await count(services, LedgerEntryRow, kind="grab_credit") == len(won)
    for user, amount in won.items():
        assert (await services.packets.accounts.account(user))["balance_cents"] == amount
    await assert_money_conserved(services)


async def test_killed_after_the_commit_before_the_ack(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    won = await grabbed_packet(services, users=3)
    first = services.packets.writer
    real_call = services.scripts.call

    async def die_at_ack(name: str, keys: list[str], args: list[Any]) -> Any:
        if name == "outbox_ack":
            raise Killed()
        return await real_call(name, keys, args)

    monkeypatch.setattr(first._scripts, "call", die_at_ack)
    with pytest.raises(Killed):
        await first.drain("pk")
    monkeypatch.setattr(first._scripts, "call", real_call)
    assert await count(services, GrabRow) == 3  # committed, but still pending in Redis
    assert await first.backlog() == 3

    assert await other_writer(services, "survivor").drain("pk") == 3  # reclaimed, re-applied
    await assert_recorded_once(services, won)
    assert await first.backlog() == 0


async def test_killed_before_the_insert(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    won = await grabbed_packet(services, users=4)
    first = services.packets.writer

    async def die(*_args: Any) -> None:
        raise Killed()

    monkeypatch.setattr("groupbuy.redpacket.writer.record_packet_batch", die)
    with pytest.raises(Killed):
        await first.drain("pk")
    monkeypatch.undo()
    assert await count(services, GrabRow) == 0
    assert await other_writer(services, "survivor").drain("pk") == 4
    await assert_recorded_once(services, won)


async def test_a_writer_retries_its_own_pending_batch(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    won = await grabbed_packet(services, users=2)
    writer = services.packets.writer
    fail_writes(monkeypatch, writer._db, _database_down("BEGIN"), times=3)
    for _ in range(3):  # SQL is down: the records wait in Redis
        with pytest.raises(sqlalchemy.exc.OperationalError):
            await writer.drain("pk")
        assert await writer.backlog() == 2
    assert await writer.drain("pk") == 2  # back up: the same consumer re-reads its pending batch
    await assert_recorded_once(services, won)


async def test_a_drain_waits_for_the_batch_another_drain_of_the_packet_holds(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flush job and a caller draining the same packet in one process: the caller's
    drain returns only once every record that was waiting is in SQL, even when the flush
    took delivery of the batch between the caller's reads of the stream."""
    won = await grabbed_packet(services, users=3)
    writer = services.packets.writer
    real_xreadgroup, real_xautoclaim = services.redis.xreadgroup, services.redis.xautoclaim
    readers: list[asyncio.Task[Any] | None] = []
    caller_between_reads, caller_go_on = asyncio.Event(), asyncio.Event()
    flush_holds_batch, flush_go_on = asyncio.Event(), asyncio.Event()
    drains: dict[str, asyncio.Task[int]] = {}  # "caller" and "flush", once started

    async def xreadgroup(*args: Any, **kwargs: Any) -> Any:
        readers.append(asyncio.current_task())
        return await real_xreadgroup(*args, **kwargs)

    async def xautoclaim(*args: Any, **kwargs: Any) -> Any:
        if asyncio.current_task() is drains.get("caller"):  # it read its own pending entries: none
            caller_between_reads.set()
            await caller_go_on.wait()
        return await real_xautoclaim(*args, **kwargs)

    async def apply(database: Any, packet_id: str, records: list[PacketRecord]) -> str | None:
        if asyncio.current_task() is drains.get("flush"):  # delivered to it, not committed yet
            flush_holds_batch.set()
            await flush_go_on.wait()
        return await record_packet_batch(database, packet_id, records)

    monkeypatch.setattr(services.redis, "xreadgroup", xreadgroup)
    monkeypatch.setattr(services.redis, "xautoclaim", xautoclaim)
    monkeypatch.setattr("groupbuy.redpacket.writer.record_packet_batch", apply)
    caller = drains["caller"] = asyncio.create_task(writer.drain("pk"))
    await caller_between_reads.wait()
    flush = drains["flush"] = asyncio.create_task(writer.drain("pk"))
    try:
        await asyncio.sleep(0)  # the flush's first step: a read of the stream, or a wait
        if flush in readers:  # it read: let it take the new entries and start applying them
            await flush_holds_batch.wait()
        caller_go_on.set()
        await caller
        assert await count(services, GrabRow) == len(won), "the caller returned too early"
    finally:
        caller_go_on.set()
        flush_go_on.set()
        await asyncio.wait([caller, flush])
    assert (caller.result(), flush.result()) == (3, 0)
    await assert_recorded_once(services, won)


async def test_the_stream_goes_once_everything_is_recorded(services: Services) -> None:
    won = await grabbed_packet(services, users=5, shares=5)  # sold out
    writer = services.packets.writer
    assert await writer.drain("pk") == 6
    assert not await services.redis.exists(services.keys.packet_outbox("pk"))
    # what is left of an ended packet expires by itself (SPEC §4.9: every key has a TTL or owner)
    for key in await services.redis.keys("*"):
        assert await services.redis.pttl(key) > 0, key
    async with services.database.sessions() as session:
        row = await session.get(PacketRow, "pk")
    assert row is not None and row.status == "sold_out" and row.records_done
    assert await writer.unrecorded_packets() == []
    assert await writer.drain("pk") == 0  # nothing left, no error
    await assert_recorded_once(services, won)


async def test_replaying_records_changes_nothing(services: Services) -> None:
    won = await grabbed_packet(services, users=3)
    stream = services.keys.packet_outbox("pk")
    records = [fields for _id, fields in await services.redis.xrange(stream)]
    assert await services.packets.writer.drain("pk") == 3
    for fields in records:  # a redelivery of everything
        await services.redis.xadd(stream, fields)
    assert await services.packets.writer.drain("pk") == 3
    await assert_recorded_once(services, won)


async def test_a_grab_lists_its_packet_until_the_ack_that_empties_the_stream(
    services: Services,
) -> None:
    won = await grabbed_packet(services, users=2)
    writer, pending = services.packets.writer, services.keys.pending_packets()
    first_id = (await services.redis.xrange(services.keys.packet_outbox("pk"), count=1))[0][0]
    assert await services.redis.zscore(pending, "pk") == int(first_id.split("-")[0])
    assert await writer.measure_backlog() == (2, int(first_id.split("-")[0]), 1)
    assert await services.packets.writer.drain_all() == 2
    assert await services.redis.zscore(pending, "pk") is None
    assert await writer.measure_backlog() == (0, None, 0)
    await assert_recorded_once(services, won)


async def test_a_measure_counts_the_records_of_the_oldest_streams_it_may_read(
    services: Services,
) -> None:
    """Its cost is bounded: past `most` streams the records are those of the `most` oldest
    (a lower bound), while the streams and the oldest record stay exact."""
    packets, writer = services.packets, services.packets.writer
    await packets.accounts.deposit("sender", 1000, "funds")
    for packet, grabs in (("pa", 3), ("pb", 2), ("pc", 4)):  # oldest records first
        await packets.sending.send("sender", 100, 10, packet_id=packet)
        for n in range(grabs):
            await packets.grabs.grab(packet, f"u{n}")
    first = await services.redis.xrange(services.keys.packet_outbox("pa"), count=1)
    oldest_ms = int(first[0][0].split("-")[0])
    assert await writer.measure_backlog() == (9, oldest_ms, 3)
    assert await writer.measure_backlog(most=2) == (5, oldest_ms, 3)
    assert await writer.measure_backlog(most=1) == (3, oldest_ms, 3)


async def test_a_run_visits_a_packet_again_whose_records_came_after_its_turn(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy packet keeps drain_all going round after round; a quiet one, caught up in
    the first round, gets a grab meanwhile: the same run records it, not the next one."""
    packets = services.packets
    await packets.accounts.deposit("sender", 1000, "funds")
    await packets.sending.send("sender", 100, 10, packet_id="busy")
    await packets.sending.send("sender", 100, 10, packet_id="quiet")
    for n in range(6):  # three batches of two
        await packets.grabs.grab("busy", f"u{n}")
    await packets.grabs.grab("quiet", "u0")
    batches: list[str] = []

    async def apply(database: Any, packet_id: str, records: list[PacketRecord]) -> str | None:
        batches.append(packet_id)
        if batches.count("busy") == 2:  # the second round: "quiet" was caught up in the first
            await packets.grabs.grab("quiet", "late")
        return await record_packet_batch(database, packet_id, records)

    monkeypatch.setattr("groupbuy.redpacket.writer.record_packet_batch", apply)
    writer = other_writer(services, "w", batch_size=2)
    assert await writer.drain_all() == 6 + 1 + 1  # every grab, the late one too
    assert batches.count("quiet") == 2
    assert await writer.measure_backlog() == (0, None, 0)


async def test_a_failed_commit_leaves_the_packet_listed_and_a_later_flush_records_it(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    won = await grabbed_packet(services, users=3)
    writer, pending = services.packets.writer, services.keys.pending_packets()
    fail_writes(monkeypatch, writer._db, _database_down("COMMIT"), times=1)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        await services.jobs.run("flush_records")
    assert await services.redis.zscore(pending, "pk") is not None  # still listed
    assert await count(services, GrabRow) == 0
    report = await services.jobs.run("flush_records")
    assert report["packet_records"] == 3 and report["backlog"] == 0
    assert await services.redis.zscore(pending, "pk") is None
    await assert_recorded_once(services, won)


async def test_a_lost_index_entry_is_found_again_by_the_repair(services: Services) -> None:
    won = await grabbed_packet(services, users=3)
    await services.redis.zrem(services.keys.pending_packets(), "pk")  # the entry is lost
    assert (await services.jobs.run("flush_records"))["packet_records"] == 0  # not visited
    assert await count(services, GrabRow) == 0
    report = await services.jobs.run("repair")
    assert report["packets_reindexed"] == 1
    assert (await services.jobs.run("flush_records"))["packet_records"] == 3
    await assert_recorded_once(services, won)


async def test_the_repair_reindexes_a_page_at_a_time(services: Services) -> None:
    packets = services.packets
    await packets.accounts.deposit("sender", 500, "funds")
    for i in range(5):
        await packets.sending.send("sender", 100, 1, packet_id=f"pk{i}")
        await packets.grabs.grab(f"pk{i}", "u")  # sold out, its records waiting
    await services.redis.delete(services.keys.pending_packets())
    listed = []
    for expected in (2, 2, 1, 2):  # the last page ends the pass; the next one starts over
        assert await packets.sweeps.reindex(page=2) == {
            "packets_reindexed": expected,
            "packets_restored": 0,
        }
        listed.append(await services.redis.zcard(services.keys.pending_packets()))
    assert listed == [2, 4, 5, 5]
    assert await packets.writer.drain_all() == 10  # five grabs, five sold_out records


async def test_the_journal_keeps_its_answers_while_sql_is_away_within_a_bound(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = services.packets.acks
    monkeypatch.setattr(acks_module, "MAX_WAITING", 3)
    for i in range(5):
        journal.note("pk", f"u{i}", 0, i + 1, 10, 1_000)
    monkeypatch.setattr(services.database, "transaction", _failing_transaction)  # SQL away
    with pytest.raises(OSError):
        await journal.flush()
    assert journal.waiting == 3 and journal.dropped == 2


def _failing_transaction() -> Any:
    raise OSError("database unreachable")


def test_the_journal_never_holds_more_than_its_bound(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = services.packets.acks
    monkeypatch.setattr(acks_module, "MAX_WAITING", 10)
    for i in range(25):
        journal.note("pk", f"u{i}", 0, i + 1, 10, 1_000)
    assert journal.waiting <= 10 and journal.waiting + journal.dropped == 25


async def test_stopping_the_journal_lets_a_flush_in_progress_finish(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown mid-flush waits for the SQL to finish instead of cancelling it (a cancel
    landing in the pool's connection reset was swallowed there, and the stop hung)."""
    journal = acks_module.AckJournal(services.database, interval_s=0.01)
    inside, release, cancelled = asyncio.Event(), asyncio.Event(), []
    real_transaction = services.database.transaction

    @contextlib.asynccontextmanager
    async def slow_transaction() -> AsyncIterator[Any]:
        async with real_transaction() as session:
            inside.set()
            try:
                await release.wait()  # SQL taking its time
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            yield session

    monkeypatch.setattr(services.database, "transaction", slow_transaction)
    journal.note("pk", "u1", 0, 1, 10, 1_000)
    journal.start()
    await asyncio.wait_for(inside.wait(), 5)
    journal.note("pk", "u2", 0, 2, 10, 1_000)  # noted while the flush runs
    stopping = asyncio.create_task(journal.stop())
    await asyncio.sleep(0.1)
    assert not stopping.done() and not cancelled
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert not cancelled and journal.waiting == 0
    assert await count(services, AcknowledgedGrabRow) == 2


async def test_packet_versions_count_its_changes_in_bodies_and_events(
    services: Services,
) -> None:
    packets = services.packets
    await packets.accounts.deposit("s", 1_000, "f")
    await packets.sending.send("s", 1_000, 10, packet_id="pv")
    assert (await packets.reads.get("pv"))["version"] == 1

    async def grab(user: str) -> str:
        try:
            return str((await packets.grabs.grab("pv", user))["status"])
        except errors.SoldOut:
            return "sold_out"

    answers = await asyncio.gather(*(grab(f"u{i}") for i in range(15)))
    assert answers.count("grabbed") == 10
    assert (await packets.reads.get("pv"))["version"] == 1 + 10 + 1  # sent, grabs, sold out
    await packets.writer.drain_all()
    async with services.database.sessions() as session:
        rows = (await session.execute(select(EventRow.type, EventRow.data))).all()
    versions = {kind: json.loads(data)["version"] for kind, data in rows}
    assert versions == {"packet.sent": 1, "packet.sold_out": 12}
    # Once Redis has let it go, SQL answers the same version.
    pv = services.keys.packet_keys("pv")
    await services.redis.delete(pv.hash, pv.shares, pv.grabs, pv.outbox)
    assert (await packets.reads.get("pv"))["version"] == 12


def _database_down(statement: str) -> Callable[[], Exception]:
    """The error a statement meets while the database is down."""
    return lambda: sqlalchemy.exc.OperationalError(statement, {}, Exception("database is down"))
