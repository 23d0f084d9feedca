"""Stepped transactions (groupbuy/storage/steps.py) as Database.run_steps runs them: on a
SQLite file by its writer (groupbuy/storage/sqlite_writer.py), on the loop's thread or,
while another process holds the write lock, in its own; on PostgreSQL through a pooled
session."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from datetime import UTC, datetime

import pytest
from sqlalchemy import exc, func, insert, select, text

from groupbuy.redpacket.ledger import entry_steps
from groupbuy.redpacket.models import AccountRow, LedgerEntryRow
from groupbuy.storage.bulk import bind
from groupbuy.storage.db import Database, sqlite_path, unavailable
from groupbuy.storage.deadletters import is_poison
from groupbuy.storage.sqlite_writer import BIG_BATCH
from groupbuy.storage.steps import Statement, Steps

AT = datetime(2026, 12, 2, 21, 30, 0, 123000, tzinfo=UTC)


def credits(db: Database, user: str, *keys: str) -> Steps[int]:
    """Ledger credits of 10 cents to `user` at AT, one per key (the write-behind's
    statements)."""
    at = bind_at(db)
    return entry_steps([(key, user, "grab_credit", 10, at) for key in keys], postgresql=False)


async def balance(db: Database, user: str) -> int:
    async with db.sessions() as session:
        value = await session.scalar(
            select(AccountRow.balance_cents).where(AccountRow.user_id == user)
        )
    return int(value or 0)


async def test_steps_see_the_rows_of_earlier_steps_and_commit_together(db: Database) -> None:
    """A step's rows reach the generator, and the whole transaction commits once."""

    def steps() -> Steps[list[tuple[object, ...]]]:
        yield Statement("INSERT INTO accounts (user_id, balance_cents) VALUES (?, ?)", ("ann", 5))
        yield Statement(
            "INSERT INTO accounts (user_id, balance_cents) VALUES (?, ?)",
            [("bob", 7), ("cy", 9)],
            many=True,
        )
        return (
            yield Statement(
                "SELECT user_id, balance_cents FROM accounts WHERE balance_cents > ? "
                "ORDER BY user_id",
                (6,),
            )
        )

    assert await db.run_steps(steps) == [("bob", 7), ("cy", 9)]
    assert [await balance(db, u) for u in ("ann", "bob", "cy")] == [5, 7, 9]


async def test_a_failed_step_rolls_back_the_whole_transaction_as_poison(db: Database) -> None:
    """A duplicate key fails as SQLAlchemy's IntegrityError (a poison record, for the
    write-behind), nothing of the transaction stays, and the next one commits."""
    await db.run_steps(lambda: credits(db, "ann", "k1"))

    def twice() -> Steps[None]:
        yield from credits(db, "bob", "k2")
        yield Statement(
            "INSERT INTO ledger_entries (business_key, user_id, kind, amount_cents, "
            "balance_after_cents, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            ("k1", "bob", "grab_credit", 10, 10, bind_at(db)),
        )

    with pytest.raises(exc.IntegrityError) as raised:
        await db.run_steps(twice)
    assert is_poison(raised.value) and not unavailable(raised.value)
    assert await balance(db, "bob") == 0
    assert await db.run_steps(lambda: credits(db, "bob", "k3")) == 1
    assert await balance(db, "bob") == 10


def bind_at(db: Database) -> object:
    """AT as the database's driver takes a timestamp."""
    to_driver = bind(LedgerEntryRow.__table__.c.created_at, db.engine.dialect)
    return to_driver(AT) if to_driver else AT


async def test_timestamps_are_written_as_sqlalchemy_writes_them(db: Database) -> None:
    """An entry posted as steps reads back the same instant, compared the same way, as
    one SQLAlchemy wrote (SQLite keeps timestamps as text: one form for both)."""
    await db.run_steps(lambda: credits(db, "ann", "steps"))
    async with db.transaction() as session:
        await session.execute(
            insert(LedgerEntryRow).values(
                business_key="core",
                user_id="ann",
                kind="grab_credit",
                amount_cents=10,
                balance_after_cents=20,
                created_at=AT,
            )
        )
    async with db.sessions() as session:
        same = await session.scalar(
            select(func.count()).select_from(LedgerEntryRow).where(LedgerEntryRow.created_at == AT)
        )
    assert same == 2


def locked_elsewhere(db: Database) -> sqlite3.Connection:
    """Another process's connection holding the SQLite file's write lock."""
    path = sqlite_path(db.url)
    if path is None:
        pytest.skip("only SQLite has a file lock")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    return other


async def test_sqlite_locked_by_another_process_is_transient(db: Database) -> None:
    """The file's write lock held elsewhere past the busy timeout: OperationalError, judged
    as the database being unavailable (the batch waits in Redis), not as poison."""
    other = locked_elsewhere(db)
    quick = Database(db.url, timeout_s=0.2)
    try:
        with pytest.raises(exc.OperationalError) as raised:
            await quick.run_steps(lambda: credits(db, "ann", "k1"))
        assert unavailable(raised.value) and not is_poison(raised.value)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert await quick.run_steps(lambda: credits(db, "ann", "k1")) == 1  # free again
    await quick.dispose()


async def test_a_transaction_runs_on_the_loop_thread_while_the_file_is_free(
    db: Database,
) -> None:
    """No hop between threads: a small transaction's steps run on the caller's thread."""
    if sqlite_path(db.url) is None:
        pytest.skip("PostgreSQL runs steps through the pool")

    def where() -> Steps[threading.Thread]:
        yield Statement("INSERT OR IGNORE INTO accounts (user_id, balance_cents) VALUES ('a', 0)")
        return threading.current_thread()

    assert await db.run_steps(where) is threading.current_thread()
    # a big batch would hold the loop for milliseconds: it runs in the writer's thread
    assert await db.run_steps(where, records=BIG_BATCH) is not threading.current_thread()


async def test_a_lock_held_elsewhere_is_waited_for_off_the_loop(db: Database) -> None:
    """Another process writes: the transaction waits for the lock in the writer's thread,
    and the loop goes on meanwhile; it commits once the lock is free."""
    other = locked_elsewhere(db)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(tick())
    writing = asyncio.create_task(db.run_steps(lambda: credits(db, "ann", "k1")))
    await asyncio.sleep(0.3)
    assert not writing.done() and ticks >= 10  # waiting, and not on the loop
    await asyncio.to_thread(other.execute, "ROLLBACK")
    other.close()
    assert await writing == 1
    ticking.cancel()
    assert await balance(db, "ann") == 10


async def test_a_cancelled_caller_keeps_the_writer_turn_until_the_thread_is_done(
    db: Database,
) -> None:
    """Cancelling a caller whose transaction runs in the thread (it met another process's
    lock) does not let the next writer of this process in before that transaction ends."""
    other = locked_elsewhere(db)
    inside, release = threading.Event(), threading.Event()

    def slow() -> Steps[None]:
        yield Statement("INSERT INTO accounts (user_id, balance_cents) VALUES (?, 0)", ("ann",))
        inside.set()
        release.wait(5)

    first = asyncio.create_task(db.run_steps(slow))
    await asyncio.sleep(0.1)  # on its way to the thread, waiting for the lock there
    await asyncio.to_thread(other.execute, "ROLLBACK")
    other.close()
    await asyncio.to_thread(inside.wait, 5)
    first.cancel()
    second = asyncio.create_task(db.run_steps(lambda: credits(db, "bob", "k1")))
    await asyncio.sleep(0.1)
    assert not first.done() and not second.done()  # both wait for the thread
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second == 1
    async with db.sessions() as session:
        assert await session.scalar(text("SELECT count(*) FROM accounts")) == 2


async def test_a_disposed_database_runs_steps_again(db: Database) -> None:
    """dispose() (a service's shutdown) closes the SQLite writer; the next stepped
    transaction opens it again, as the pool opens new connections."""
    assert await db.run_steps(lambda: credits(db, "ann", "k1")) == 1
    await db.dispose()
    assert await db.run_steps(lambda: credits(db, "ann", "k2")) == 1
    assert await balance(db, "ann") == 20
