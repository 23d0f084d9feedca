"""Poison records of the write-behind go to the dead letters, never dropped, never blocking.

A record SQL can never apply (malformed fields, an unknown type, a value the insert
refuses) used to fail its whole batch on every round, forever, and stop the round for
every stream after it. Now its batch is split until the record stands alone; it is kept
(SQL row + dead-letter stream) before it leaves its outbox, and everything else is applied.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
import sqlalchemy.exc
from sqlalchemy import select

from groupbuy import errors, metrics
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.redpacket.grab_batch import GrabRows
from groupbuy.redpacket.models import GrabRow, LedgerEntryRow
from groupbuy.redpacket.records import GrabRecord
from groupbuy.redpacket.writer import GROUP
from groupbuy.services import Services
from groupbuy.storage.bulk import Moments
from groupbuy.storage.deadletters import DeadLetterRow, Poison, apply_isolating, is_poison
from tests.support.database import fail_writes
from tests.support.money import assert_money_conserved, count


def dead_letters_counted(stream: str) -> float:
    return float(metrics.DEAD_LETTERS.labels(stream=stream)._value.get())


async def grab_some(services: Services, users: list[str], shares: int = 10) -> dict[str, int]:
    packets = services.packets
    await packets.accounts.deposit("sender", 1000, "funds")
    await packets.sending.send("sender", 1000, shares, packet_id="pk")
    return {user: (await packets.grabs.grab("pk", user))["amount_cents"] for user in users}


def refuse_grab_rows_of(user_id: str, monkeypatch: pytest.MonkeyPatch, error: str) -> None:
    """Make the grab records of one user fail as poison (a ValueError) in the writer."""
    real_rows = GrabRows.of

    def refuse(grabs: list[GrabRecord], moments: Moments) -> GrabRows:
        if any(f["user_id"] == user_id for f in grabs):
            raise ValueError(error)
        return real_rows(grabs, moments)

    monkeypatch.setattr(GrabRows, "of", refuse)


async def poison(services: Services, stream: str, **fields: str) -> str:
    entry_id = await services.redis.xadd(stream, fields)
    return str(entry_id)


async def test_a_poison_grab_record_is_dead_lettered_and_the_rest_applied(
    services: Services,
) -> None:
    stream = services.keys.packet_outbox("pk")
    won = await grab_some(services, ["u0", "u1", "u2"])
    fields = {"type": "grab", "packet_id": "pk", "user_id": "ghost", "seq": "9", "at_ms": "1"}
    bad = await poison(services, stream, **fields, amount_cents="x")
    won |= {
        user: (await services.packets.grabs.grab("pk", user))["amount_cents"] for user in ["u3"]
    }
    before = dead_letters_counted("packets")

    applied = await services.packets.writer.drain("pk")

    assert applied == len(won)  # the four real grabs; the poison is not "applied"
    assert await count(services, GrabRow) == 4
    assert await count(services, LedgerEntryRow, kind="grab_credit") == 4
    for user, cents in won.items():
        assert (await services.packets.accounts.account(user))["balance_cents"] == cents
    await assert_money_conserved(services)
    assert await services.redis.xlen(stream) == 0  # out of the outbox ...
    async with services.database.sessions() as session:
        rows = (await session.scalars(select(DeadLetterRow))).all()
    assert [(r.stream, r.owner_id, r.entry_id, r.record_type) for r in rows] == [
        ("packets", "pk", bad, "grab")
    ]  # ... and kept, with its fields and its error
    assert json.loads(rows[0].fields)["amount_cents"] == "x"
    assert rows[0].error.startswith("ValueError: invalid literal for int()")
    letters = await services.redis.xrange(services.keys.dead_letters())
    assert len(letters) == 1
    assert letters[0][1]["entry_id"] == bad
    assert letters[0][1]["field.amount_cents"] == "x"
    assert letters[0][1]["dead_letter_id"] == str(rows[0].id)
    assert dead_letters_counted("packets") == before + 1
    assert not await services.redis.zscore(services.keys.pending_packets(), "pk")


async def test_a_value_sql_refuses_is_dead_lettered(services: Services) -> None:
    stream = services.keys.packet_outbox("pk")
    await grab_some(services, ["u0"])
    fields = {"type": "grab", "packet_id": "pk", "user_id": "huge", "seq": "2"}
    await poison(services, stream, **fields, amount_cents=str(2**70), at_ms="1")
    await grab_some_more(services, ["u1", "u2"])

    assert await services.packets.writer.drain("pk") == 3
    async with services.database.sessions() as session:
        (row,) = (await session.scalars(select(DeadLetterRow))).all()
    assert row.user_id == "huge" and "int" in row.error.lower(), row.error
    assert await count(services, GrabRow) == 3
    await assert_money_conserved(services)


async def grab_some_more(services: Services, users: list[str]) -> dict[str, int]:
    return {user: (await services.packets.grabs.grab("pk", user))["amount_cents"] for user in users}


async def test_a_transient_sql_failure_dead_letters_nothing(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    won = await grab_some(services, ["u0", "u1", "u2"])
    writer = services.packets.writer

    def locked() -> Exception:
        return sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database is locked"))

    fail_writes(monkeypatch, writer._db, locked, times=2)
    for _ in range(2):
        with pytest.raises(sqlalchemy.exc.OperationalError):
            await writer.drain("pk")
    assert await count(services, DeadLetterRow) == 0
    assert await writer.backlog() == 3  # waiting whole, not split into dead letters
    assert await writer.drain("pk") == 3
    assert await count(services, GrabRow) == len(won)
    await assert_money_conserved(services)


async def test_a_dead_lettered_real_grab_is_named_by_reconciliation(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    won = await grab_some(services, ["u0", "u1", "u2"])
    refuse_grab_rows_of("u1", monkeypatch, "stands for a value SQL refuses")
    await services.packets.acks.flush()
    assert await services.packets.writer.drain("pk") == 2
    report = await services.reconciler.run()
    kinds = {(m["kind"], m.get("user_id")) for m in report["mismatches"]}
    assert ("redis_grab_dead_lettered", "u1") in kinds, report
    assert ("grab_dead_lettered", "u1") in kinds, report
    assert not {k for k, _ in kinds} & {"redis_grab_missing_in_sql", "grab_acknowledged_unrecorded"}
    assert (await services.packets.accounts.account("u0"))["balance_cents"] == won["u0"]


async def test_a_dead_letter_is_replayed_once_its_cause_is_fixed(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    won = await grab_some(services, ["u0", "u1"], shares=2)  # sold out
    refuse_grab_rows_of("u1", monkeypatch, "stands for a defect of this writer version")
    await services.packets.acks.flush()
    await services.packets.writer.drain("pk")
    page = await services.dead_letters.page(limit=10)
    (letter,) = page["dead_letters"]
    assert letter["replayed_at"] is None
    with pytest.raises(errors.ReplayFailed, match="defect of this writer version"):
        await services.dead_letters.replay(letter["id"])  # not fixed yet: nothing applied
    assert await count(services, GrabRow) == 1

    monkeypatch.undo()  # the fixed writer is deployed
    replayed = await services.dead_letters.replay(letter["id"])
    assert replayed["replayed_at"] is not None and replayed["entry_id"] == letter["entry_id"]
    assert await services.dead_letters.replay(letter["id"]) == replayed  # idempotent
    assert await count(services, GrabRow) == 2
    assert await count(services, LedgerEntryRow, kind="grab_credit") == 2
    assert (await services.packets.accounts.account("u1"))["balance_cents"] == won["u1"]
    await assert_money_conserved(services)  # sold out: the grabs sum to the amount again
    report = await services.reconciler.run()
    assert report["mismatch_count"] == 0, report
    assert (await services.dead_letters.page(limit=10))["dead_letters"] == [replayed]
    with pytest.raises(errors.NotFound):
        await services.dead_letters.replay(letter["id"] + 1)


async def test_a_poison_team_record_does_not_block_its_stream_or_the_round(
    services: Services,
) -> None:
    teams = services.teams
    await teams.activities.create_activity("a1", team_size=3)
    await teams.activities.create_activity("a2", team_size=3)
    await teams.activities.open_team("a1", "L1", team_id="t1")
    before = dead_letters_counted("teams")
    fields = {"type": "team.renamed", "activity_id": "a1", "team_id": "t1", "at_ms": "1"}
    bad = await poison(services, services.keys.outbox("a1"), **fields)
    await teams.activities.open_team("a1", "L2", team_id="t2")
    await teams.activities.open_team("a2", "L3", team_id="t3")

    await services.team_writer.drain_all()

    async with services.database.sessions() as session:
        recorded = set((await session.execute(select(TeamRow.activity_id, TeamRow.team_id))).all())
        (row,) = (await session.scalars(select(DeadLetterRow))).all()
    assert recorded == {("a1", "t1"), ("a1", "t2"), ("a2", "t3")}
    assert await count(services, MemberRow) == 3
    assert (row.stream, row.owner_id, row.entry_id) == ("teams", "a1", bad)
    assert row.error == "ValueError: unknown team record type 'team.renamed'"
    assert dead_letters_counted("teams") == before + 1
    assert await services.team_writer.pending() == []


async def test_the_admin_view_pages_dead_letters_oldest_first(services: Services) -> None:
    stream = services.keys.packet_outbox("pk")
    await grab_some(services, ["u0"])
    ids = [await poison(services, stream, type="nonsense", packet_id="pk") for _ in range(5)]
    await services.packets.writer.drain("pk")
    first = await services.dead_letters.page(limit=2)
    second = await services.dead_letters.page(limit=2, cursor=first["next_cursor"])
    third = await services.dead_letters.page(limit=2, cursor=second["next_cursor"])
    listed = [d["entry_id"] for page in (first, second, third) for d in page["dead_letters"]]
    assert listed == ids
    assert third["next_cursor"] is None
    letter = first["dead_letters"][0]
    assert letter["fields"] == {"type": "nonsense", "packet_id": "pk"}
    assert letter["stream"] == "packets" and letter["owner_id"] == "pk"
    assert letter["error"].startswith("KeyError") or letter["error"].startswith("ValueError")


async def test_a_pager_misses_no_letter_that_commits_late(services: Services) -> None:
    """Two writers bury at once, the first to take an id committing last: the second waits
    for it (PostgreSQL: an advisory lock; SQLite: its one writer), so a pager that went on
    from the last id it saw, while the first was still open, misses neither."""
    dead = services.dead_letters
    stream = services.keys.packet_outbox("late")
    index = services.keys.packet_keys("late").pending
    early, later = [
        Poison(await poison(services, stream, type="nonsense", n=str(n)), {"n": str(n)}, "E")
        for n in (1, 2)
    ]
    dead_at = datetime.now(UTC)
    async with services.database.transaction() as first:
        await dead.keep(first, "packets", "late", [early], dead_at)  # an id, not committed
        second = asyncio.create_task(dead.bury("packets", "late", stream, index, GROUP, [later]))
        await asyncio.sleep(0.3)
        seen = [d["entry_id"] for d in (await dead.page(limit=10))["dead_letters"]]
        assert not second.done()  # waits for the first to commit
    await asyncio.wait_for(second, 10)
    cursor = None if not seen else str(await _row_id(services, seen[-1]))
    rest = [d["entry_id"] for d in (await dead.page(limit=10, cursor=cursor))["dead_letters"]]
    assert seen + rest == [early.entry_id, later.entry_id]


async def _row_id(services: Services, entry_id: str) -> int:
    async with services.database.sessions() as session:
        row_id = await session.scalar(
            select(DeadLetterRow.id).where(DeadLetterRow.entry_id == entry_id)
        )
    assert row_id is not None
    return int(row_id)


async def test_isolation_applies_everything_but_the_poison_in_order() -> None:
    applied: list[str] = []

    async def apply(batch: list[tuple[str, dict[str, str]]]) -> None:
        if any(fields.get("bad") for _id, fields in batch):
            raise ValueError("bad record")
        applied.extend(entry_id for entry_id, _ in batch)

    entries = [(str(i), {"bad": "1"} if i in (3, 6) else {}) for i in range(9)]
    poisoned = await apply_isolating(entries, apply)
    assert [p.entry_id for p in poisoned] == ["3", "6"]
    assert applied == ["0", "1", "2", "4", "5", "7", "8"]
    assert all(isinstance(p, Poison) and p.error == "ValueError: bad record" for p in poisoned)


def test_transient_errors_are_not_poison() -> None:
    locked = sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database is locked"))
    refused = sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("NOT NULL constraint"))
    assert not is_poison(locked)
    assert not is_poison(ConnectionRefusedError())
    assert not is_poison(TimeoutError())
    assert is_poison(refused)
    assert is_poison(KeyError("seq"))
    assert is_poison(OverflowError("Python int too large to convert to SQLite INTEGER"))


class DriverError(Exception):
    """What asyncpg's errors look like to SQLAlchemy: a plain DBAPIError around them."""

    def __init__(self, sqlstate: str | None = None) -> None:
        super().__init__("driver error")
        self.sqlstate = sqlstate


def wrapped(orig: BaseException) -> sqlalchemy.exc.DBAPIError:
    return sqlalchemy.exc.DBAPIError("INSERT", {}, orig)


def test_driver_errors_are_judged_by_their_cause_and_sqlstate() -> None:
    """On PostgreSQL (asyncpg) a refused value arrives as a plain DBAPIError: an argument
    the driver cannot encode (raised from a ValueError), or the server's data exception
    (SQLSTATE class 22) or constraint violation (23); a lost connection (08) is not poison."""
    encode = DriverError()
    encode.__cause__ = ValueError("invalid input for query argument $4 (value out of int64 range)")
    assert is_poison(wrapped(encode))
    assert is_poison(wrapped(DriverError("22001")))  # value too long for type varchar(64)
    assert is_poison(wrapped(DriverError("23502")))  # not-null violation
    assert not is_poison(wrapped(DriverError("08006")))  # connection failure
    assert not is_poison(wrapped(DriverError()))
    lost = wrapped(DriverError("22001"))
    lost.connection_invalidated = True
    assert not is_poison(lost)
