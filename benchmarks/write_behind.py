"""write_behind: the write-behind draining a grab backlog, against the raw driver writing the
same rows in batches, alternated, on SQLite and PostgreSQL (issue 41's baseline of the limit;
docs/benchmarking.md says how).

    .venv/bin/python -m benchmarks.write_behind --quick
    .venv/bin/python -m benchmarks.write_behind --part postgresql --rounds 3
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import Any, cast

import asyncpg
from groupbuy_client.wire import from_ms
from sqlalchemy import Table, func, select, text
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncSession

from benchmarks import harness
from benchmarks.harness import Bench, Row, Trial
from groupbuy.redpacket.codec import grab_credit_key
from groupbuy.redpacket.models import AccountRow, GrabRow, LedgerEntryRow, PacketRow
from groupbuy.redpacket.records import (
    GrabRecord,
    PacketRecord,
    packet_event_key,
    parse_packet_record,
)
from groupbuy.services import Services
from groupbuy.storage.db import Database
from groupbuy.storage.events import EventRow
from tests.support.postgres import start_postgres

DATABASES = ("sqlite", "postgresql")
NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
WRITE_BEHIND, RAW = "write-behind", "raw driver"
TARGET_MIN = 0.5  # issue 41: the write-behind at half the raw driver's rate at least
CENT_PER_SHARE = 100  # a packet's amount per share: every share is worth a cent at least
GRABS_AT_ONCE = 64  # grab calls in flight while the backlog is built (not measured)
SQLITE_PRAGMAS = ("journal_mode", "synchronous", "busy_timeout")  # the service's, read back


@dataclass(frozen=True)
class Load:
    """How big each round's backlog is, and how many alternated rounds run."""

    packets: int
    shares: int  # per packet, each grabbed by a user of its own
    rounds: int


# A round's grabs go to one IN list in the checks: under asyncpg's 32,767 parameters.
FULL, QUICK = Load(20, 1000, 5), Load(4, 500, 2)


Batches = list[list[PacketRecord]]


@dataclass
class Backlog:
    """One round's grabs waiting in Redis: the records the drain will write, and the
    answers the grabs got."""

    packet_ids: list[str]
    streams: list[list[PacketRecord]]  # each packet's records, in stream order
    grabbed: dict[str, int]  # grab credit key -> amount, of each grab answered `grabbed`

    @property
    def grabs(self) -> list[GrabRecord]:
        """The grab records (an ending is one per packet)."""
        return [r for stream in self.streams for r in stream if r["type"] == "grab"]

    def batches(self, size: int) -> Batches:
        """The records as the writer takes them: a packet's stream `size` records at a time."""
        return [s[i : i + size] for s in self.streams for i in range(0, len(s), size)]


# -- the backlog, built through the engine ------------------------------------------------


async def build_backlog(services: Services, load: Load, tag: str) -> Backlog:
    """Packets sent and grabbed in full through the services (SQL rows as the service writes
    them), then their outbox streams read as the drain will find them (XRANGE leaves the
    consumer group's state alone)."""
    sender = f"wb-{tag}-sender"
    amount = load.shares * CENT_PER_SHARE
    await services.packets.accounts.deposit(sender, load.packets * amount, f"wb-{tag}")
    packet_ids = [f"wb-{tag}-p{p}" for p in range(load.packets)]
    for packet_id in packet_ids:
        await services.packets.sending.send(sender, amount, load.shares, packet_id=packet_id)
    grabs = [(p, f"{p}-u{i}") for p in packet_ids for i in range(load.shares)]
    calls: list[Callable[[], Awaitable[Any]]] = [
        partial(services.packets.grabs.grab, p, u) for p, u in grabs
    ]
    answers = await harness.gather_limited(calls, limit=GRABS_AT_ONCE)
    grabbed = {
        grab_credit_key(p, u): int(a["amount_cents"])
        for (p, u), a in zip(grabs, answers, strict=True)
        if a["status"] == "grabbed"
    }
    streams = []
    for packet_id in packet_ids:
        entries = await services.redis.xrange(services.keys.packet_outbox(packet_id))
        streams.append([parse_packet_record(fields) for _entry_id, fields in entries])
    return Backlog(packet_ids, streams, grabbed)


# -- the write-behind ----------------------------------------------------------------------


async def drain(services: Services, backlog: Backlog) -> Trial:
    """`flush_records` as the scheduler runs it, timed; its CPU (this process, the SQLite
    thread included) and the correctness counts read back from SQL."""
    cpu, wall = time.process_time(), time.perf_counter()
    report = await services.jobs.run("flush_records")
    seconds, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    correct = await recorded(services, backlog)
    # every record drained in the timed run (none before it, by some other flush)
    timed = report["packet_records"] == sum(len(s) for s in backlog.streams)
    correct |= {"cpu_s": round(cpu_s, 4), "all_drained_timed": timed, "ok": correct["ok"] and timed}
    return Trial(len(backlog.grabs), seconds, correct)


async def recorded(services: Services, backlog: Backlog) -> dict[str, Any]:
    """Grab rows, credits and balances in SQL against the grabs answered `grabbed`."""
    users = [r["user_id"] for r in backlog.grabs]
    ledger, accounts = LedgerEntryRow, AccountRow
    async with services.database.sessions() as session:
        grab_rows = await count_grabs(session, backlog.packet_ids)
        credits = dict((await session.execute(select(ledger.business_key, ledger.amount_cents)
            .where(ledger.business_key.in_(list(backlog.grabbed))))).all())  # fmt: skip
        balances = dict((await session.execute(select(accounts.user_id, accounts.balance_cents)
            .where(accounts.user_id.in_(users)))).all())  # fmt: skip
    # every user grabs once: a balance is the amount its grab was answered
    wrong = sum(
        balances.get(r["user_id"])
        != backlog.grabbed.get(grab_credit_key(r["packet_id"], r["user_id"]))
        for r in backlog.grabs
    )
    right = grab_rows == len(backlog.grabbed) == len(credits) and credits == backlog.grabbed
    return {"grabbed": len(backlog.grabbed), "grab_rows": grab_rows, "credits": len(credits),
            "balances_wrong": wrong, "ok": right and wrong == 0}  # fmt: skip


async def count_grabs(session: AsyncSession, packet_ids: list[str]) -> int:
    """The grab rows of these packets."""
    return int(
        await session.scalar(select(func.count()).where(GrabRow.packet_id.in_(packet_ids))) or 0
    )


# -- the raw driver ------------------------------------------------------------------------


class RawWriter:
    """The raw driver's statements on one dialect, named from the models (the baseline
    follows the schema), and the parameters of a batch of records."""

    def __init__(self, dialect: Dialect) -> None:
        self._qmark = dialect.name == "sqlite"  # sqlite3's `?`, else asyncpg's `$n`
        self.sql: dict[str, str] = {}  # name -> SQL, in the order a batch runs them
        # a row's values in an INSERT's column order (a KeyError names a column not filled)
        self._pick: dict[str, Callable[[dict[str, Any]], tuple[Any, ...]]] = {}
        self._insert("grab", GrabRow.__table__, ignore=True)
        self._insert("account", AccountRow.__table__, ignore=True)
        self._insert("entry", LedgerEntryRow.__table__)
        cents, user, p = AccountRow.balance_cents.key, AccountRow.user_id.key, self._marks(4)
        self.sql["credit"] = (f"UPDATE {AccountRow.__tablename__} SET {cents} = {cents} + "
                              f"{p[0]} WHERE {user} = {p[1]}")  # fmt: skip
        packet = PacketRow
        self.sql["sold_out"] = (
            f"UPDATE {packet.__tablename__} SET {packet.status.key} = {p[0]}, "
            f"{packet.sold_out_at.key} = {p[1]}, {packet.records_done.key} = {p[2]} "
            f"WHERE {packet.packet_id.key} = {p[3]}"
        )
        self._insert("event", EventRow.__table__, skip=("position",))
        # how the dialect binds the models' DateTime (SQLite: a string)
        self._stamp = packet.sold_out_at.type.dialect_impl(dialect).bind_processor(dialect)

    def _marks(self, count: int) -> list[str]:
        return ["?"] * count if self._qmark else [f"${i + 1}" for i in range(count)]

    def _insert(
        self, name: str, table: Any, skip: Sequence[str] = (), ignore: bool = False
    ) -> None:
        table = cast(Table, table)
        columns = [
            c.name for c in table.c if c is not table.autoincrement_column and c.name not in skip
        ]
        tail = " ON CONFLICT DO NOTHING" if ignore else ""
        self.sql[name] = (f"INSERT INTO {table.name} ({', '.join(columns)}) "
                          f"VALUES ({', '.join(self._marks(len(columns)))}){tail}")  # fmt: skip
        self._pick[name] = itemgetter(*columns)

    def params(self, records: list[PacketRecord], fresh: str) -> dict[str, list[Any]]:
        """Each statement's parameters for one batch, under fresh keys (`fresh` before every
        packet and user id)."""
        out: dict[str, list[Any]] = {name: [] for name in self.sql}
        pick = self._pick
        for r in records:
            packet_id, at = fresh + r["packet_id"], from_ms(int(r["at_ms"]))
            at = self._stamp(at) if self._stamp else at  # bound once, for every row of it
            if r["type"] == "grab":
                user_id, cents = fresh + r["user_id"], int(r["amount_cents"])
                key = grab_credit_key(packet_id, user_id)
                out["grab"].append(pick["grab"]({"packet_id": packet_id, "user_id": user_id,
                    "seq": int(r["seq"]), "amount_cents": cents, "grabbed_at": at}))  # fmt: skip
                out["account"].append(pick["account"]({"user_id": user_id, "balance_cents": 0}))
                out["entry"].append(pick["entry"]({"business_key": key, "user_id": user_id,
                    "kind": "grab_credit", "amount_cents": cents, "created_at": at,
                    "balance_after_cents": cents}))  # fmt: skip
                out["credit"].append((cents, user_id))
            elif r["type"] == "packet.sold_out":
                out["sold_out"].append(("sold_out", at, True, packet_id))
                data: dict[str, object] = {"packet_id": packet_id, "sender_id": r["sender_id"]}
                if "version" in r:  # as the write-behind's event
                    data["version"] = int(r["version"])
                out["event"].append(pick["event"]({"type": r["type"], "at": at,
                    "dedup_key": packet_event_key(r["type"], packet_id),
                    "data": json.dumps(data, separators=(",", ":"))}))  # fmt: skip
            else:
                raise ValueError(f"the raw baseline has no rows for a {r['type']!r} record")
        return out


async def copy_packets(services: Services, packet_ids: list[str], fresh: str) -> None:
    """The packets' SQL rows again under fresh ids, for the raw writer to mark sold out."""
    table = cast(Table, PacketRow.__table__)
    async with services.database.transaction() as session:
        rows = await session.execute(select(table).where(table.c.packet_id.in_(packet_ids)))
        copies = [{**row, "packet_id": fresh + row["packet_id"]} for row in rows.mappings()]
        await session.execute(table.insert(), copies)


async def service_pragmas(database: Database) -> list[str]:
    """The SQLite settings of the service's connections, to set on the raw one."""
    async with database.sessions() as session:
        found = [(n, await session.scalar(text(f"PRAGMA {n}"))) for n in SQLITE_PRAGMAS]
    return [f"PRAGMA {name}={value}" for name, value in found]


async def write_raw(database: Database, batches: Batches, fresh: str) -> float:
    """The records' rows under fresh keys by the raw driver, on a connection of its own to
    the database: one transaction per batch, one executemany per statement; the seconds."""
    writer = RawWriter(database.engine.dialect)
    url = database.engine.url
    if database.is_sqlite:
        pragmas = await service_pragmas(database)
        return raw_sqlite(str(url.database), pragmas, writer, batches, fresh)
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return await raw_postgresql(dsn, writer, batches, fresh)


async def raw(services: Services, backlog: Backlog, fresh: str) -> Trial:
    """The backlog's rows under fresh keys, by the raw driver in the writer's batches (its
    packets' rows copied first, not timed); the grab rows counted back."""
    await copy_packets(services, backlog.packet_ids, fresh)
    batches = backlog.batches(services.settings.outbox.batch_size)
    seconds = await write_raw(services.database, batches, fresh)
    async with services.database.sessions() as session:
        written = await count_grabs(session, [fresh + p for p in backlog.packet_ids])
    grabs = len(backlog.grabs)
    return Trial(grabs, seconds, {"grab_rows": written, "ok": written == grabs})


def raw_sqlite(path: str, pragmas: list[str], w: RawWriter, batches: Batches, fresh: str) -> float:
    """sqlite3 on its own connection, set as the service's (WAL, synchronous)."""
    connection = sqlite3.connect(path, isolation_level=None)  # transactions by hand
    try:
        for pragma in pragmas:
            connection.execute(pragma)
        began = time.perf_counter()
        for batch in batches:
            params = w.params(batch, fresh)
            connection.execute("BEGIN")
            for name, sql in w.sql.items():
                connection.executemany(sql, params[name])
            connection.execute("COMMIT")
        return time.perf_counter() - began
    finally:
        connection.close()


async def raw_postgresql(dsn: str, w: RawWriter, batches: Batches, fresh: str) -> float:
    """asyncpg on its own connection."""
    connection = await asyncpg.connect(dsn)
    try:
        began = time.perf_counter()
        for batch in batches:
            params = w.params(batch, fresh)
            async with connection.transaction():
                for name, sql in w.sql.items():
                    if params[name]:
                        await connection.executemany(sql, params[name])
        return time.perf_counter() - began
    finally:
        await connection.close()


# -- the scenario -------------------------------------------------------------------------


async def measure(services: Services, load: Load, rounds: int, kind: str) -> dict[str, list[Trial]]:
    """Each round a fresh backlog, then the drain and the raw writer in rotating order;
    round 0 a warm-up, dropped."""
    trials: dict[str, list[Trial]] = {WRITE_BEHIND: [], RAW: []}
    for index in range(rounds + 1):
        backlog = await build_backlog(services, load, f"{kind[0]}{index}")
        for name in harness.rotation(list(trials), index):
            trial = await (
                drain(services, backlog) if name == WRITE_BEHIND else raw(services, backlog, "raw-")
            )
            if index:
                trials[name].append(trial)
            what = f"round {index}" if index else "warm-up"
            harness.say(
                f"  {what:<8} {NAMES[kind]:<10} {name:<12} {trial.rate:>8,.0f}/s {trial.correct}"
            )
    return trials


def rows_of(kind: str, trials: dict[str, list[Trial]], load: Load, batch_size: int) -> list[Row]:
    """A row per contender and their comparison."""
    drains = trials[WRITE_BEHIND]
    records = sum(t.ops for t in drains)
    cpu_us = 1e6 * sum(t.correct["cpu_s"] for t in drains) / records if records else None
    sizes = (
        f"{load.packets} packets x {load.shares:,} shares a round, batches of {batch_size}, "
        f"{len(drains)} rounds; a record: a grab row, an account, a ledger credit, a balance"
    )
    scenario = f"write-behind drain, {NAMES[kind]}"
    driver = "sqlite3" if kind == "sqlite" else "asyncpg"
    cpu = f"; CPU {cpu_us:.1f} µs a record (this process)"
    mine = harness.trials_row(scenario, "groupbuy flush_records", drains, sizes + cpu)
    mine["correct"]["cpu_us_per_record"] = round(cpu_us or 0, 1)
    base = harness.trials_row(scenario, f"raw {driver} executemany", trials[RAW], sizes)
    what = f"write-behind drain / raw {driver} executemany, {NAMES[kind]} (records/s)"
    key = f"write_behind_vs_raw_{kind}"
    return [mine, base, harness.comparison(key, what, drains, trials[RAW], TARGET_MIN)]


def run_write_behind(bench: Bench) -> list[Row]:
    """The rows of every database asked for (parts: sqlite, postgresql)."""
    load = QUICK if bench.quick else FULL
    rounds = bench.rounds or load.rounds
    databases = bench.parts or DATABASES
    postgres = start_postgres() if "postgresql" in databases else None
    out: list[Row] = []
    try:
        for kind in databases:
            url = (
                postgres.create_database("writebehind")
                if kind == "postgresql" and postgres
                else bench.sqlite("write-behind")
            )
            out += asyncio.run(one_database(bench.redis_url, url, kind, load, rounds))
    finally:
        if postgres is not None:
            postgres.stop()
    return out


async def one_database(redis_url: str, url: str, kind: str, load: Load, rounds: int) -> list[Row]:
    """The rounds on one database, with the production wiring on its own key prefix."""
    services = await harness.open_services(redis_url, url, key_prefix=f"wb{kind}")
    try:
        trials = await measure(services, load, rounds, kind)
        return rows_of(kind, trials, load, services.settings.outbox.batch_size)
    finally:
        await harness.close_services(services)


if __name__ == "__main__":
    harness.standalone(run_write_behind, __doc__, DATABASES)
