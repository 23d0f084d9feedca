"""The schema's migrations on SQLite and PostgreSQL: from empty they give exactly the models'
schema, they go down and up again, a database made by create_all before migrations is
checked and stamped, and start-up refuses (PostgreSQL) or upgrades (SQLite)."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, make_url, text

from groupbuy import migrations
from groupbuy.cli import main
from groupbuy.migrations import SchemaNotCurrent
from groupbuy.redpacket.models import AccountRow
from groupbuy.services import build_services, running
from groupbuy.storage.db import Base, Database
from tests.support.database import throwaway_postgres
from tests.support.postgres import PostgresProcess
from tests.support.servers import free_port
from tests.support.service import (
    Service,
    run_groupbuy,
    service_environment,
    start_service,
    wait_gone,
)
from tests.support.settings import settings_for

LEGACY = Path(__file__).parent / "support" / "legacy_schema"
_names = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresProcess]:
    """A throwaway PostgreSQL cluster for this run."""
    yield from throwaway_postgres()


@dataclass
class Empty:
    """An empty database of one kind, and its URL."""

    kind: str
    url: str


@pytest.fixture(params=["sqlite", "postgresql"])
def empty(request: pytest.FixtureRequest, tmp_path: Path) -> Empty:
    """A new, empty database: a SQLite file, or a database on the throwaway PostgreSQL."""
    if request.param == "sqlite":
        return Empty("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    server: PostgresProcess = request.getfixturevalue("postgres")
    return Empty("postgresql", server.create_database(f"migrations_{next(_names)}"))


@pytest.fixture
async def database(empty: Empty) -> AsyncIterator[Database]:
    built = Database(empty.url)
    try:
        yield built
    finally:
        await built.dispose()


async def differences(database: Database) -> list[Any]:
    """What autogenerate would write to turn the database into the models' schema."""

    def compare(connection: Connection) -> list[Any]:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, migrations.models_metadata()))

    async with database.engine.connect() as connection:
        return await connection.run_sync(compare)


async def tables(database: Database) -> set[str]:
    async with database.engine.connect() as connection:
        return set(await connection.run_sync(lambda c: inspect(c).get_table_names()))


async def make_legacy(database: Database, without: tuple[str, ...] = ()) -> None:
    """The tables as the versions before migrations made them (their create_all's DDL),
    minus the tables `without`, and a few rows in them."""
    source = (LEGACY / f"{database.engine.dialect.name}.sql").read_text()
    statements = [s.strip() for s in source.split(";\n") if s.strip()]
    async with database.engine.begin() as connection:
        for statement in statements:
            body = "\n".join(ln for ln in statement.splitlines() if not ln.startswith("--")).strip()
            table = re.search(r"^CREATE (?:TABLE|INDEX \w+ ON) (\w+)", body)
            assert table, body
            if table[1] not in without:
                await connection.exec_driver_sql(body)
        now = datetime.now(UTC)
        await connection.execute(
            text("INSERT INTO accounts (user_id, balance_cents) VALUES ('alice', 700)")
        )
        await connection.execute(
            text(
                "INSERT INTO events (type, at, dedup_key, data) "
                "VALUES ('team.formed', :at, 'k1', '{}')"
            ),
            {"at": now},
        )


# -- from empty, down and up -------------------------------------------------------------


def test_the_migrations_know_every_model() -> None:
    """Autogenerate compares with models_metadata(): a table whose module it does not
    import would be dropped by the next generated revision. Asked in a fresh interpreter
    (here the composition root has imported every model already)."""
    import groupbuy.services  # noqa: F401  (the composition root imports every model)

    alone = subprocess.run(
        [
            sys.executable,
            "-c",
            "from groupbuy.migrations import models_metadata; "
            "print(' '.join(sorted(models_metadata().tables)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert alone.stdout.split() == sorted(Base.metadata.tables)


async def test_migrations_from_empty_give_exactly_the_models_schema(database: Database) -> None:
    assert await migrations.upgrade(database) == (None, migrations.head(), False)
    assert await differences(database) == []
    assert await tables(database) == set(migrations.models_metadata().tables) | {"alembic_version"}
    found = await migrations.state(database)
    assert (found.revision, found.problem()) == (migrations.head(), None)


async def test_every_revision_goes_down_and_up_again(database: Database) -> None:
    await migrations.upgrade(database)
    chain = [r.revision for r in migrations.history()]
    # Step down one revision at a time to nothing, then up again one at a time.
    for below in [*chain[-2::-1], "base"]:
        await migrations.downgrade(database, below)
        assert (await migrations.state(database)).revision == (None if below == "base" else below)
    assert await tables(database) <= {"alembic_version"}
    for revision in chain:
        assert (await migrations.upgrade(database, revision))[1] == revision
    assert await differences(database) == []


async def test_upgrading_twice_changes_nothing(database: Database) -> None:
    await migrations.upgrade(database)
    head = migrations.head()
    assert await migrations.upgrade(database) == (head, head, False)


# -- databases made by create_all before migrations ---------------------------------------


async def test_a_create_all_database_is_checked_stamped_and_keeps_its_rows(
    database: Database,
) -> None:
    await make_legacy(database)
    found = await migrations.state(database)
    assert (found.revision, found.legacy_tables) == (None, True)
    assert found.problem() == (
        "the database's tables were made before migrations (no alembic_version), this "
        f"version needs {migrations.head()}: run groupbuy db upgrade"
    )
    assert await migrations.upgrade(database) == (None, migrations.head(), True)
    assert await differences(database) == []
    async with database.transaction() as session:
        assert await session.get(AccountRow, "alice") is not None
        assert (await session.execute(text("SELECT count(*) FROM events"))).scalar() == 1


async def test_a_create_all_database_lacking_newer_tables_gets_them(database: Database) -> None:
    """Versions older still made fewer tables (create_all added new ones at each start)."""
    await make_legacy(database, without=("dead_letters", "blocked_users"))
    await migrations.upgrade(database)
    assert await differences(database) == []
    assert {"dead_letters", "blocked_users"} <= await tables(database)


async def test_a_create_all_database_that_differs_is_refused_untouched(
    database: Database,
) -> None:
    await make_legacy(database)
    async with database.engine.begin() as connection:
        await connection.exec_driver_sql("ALTER TABLE packets ADD COLUMN note VARCHAR(20)")
    with pytest.raises(SchemaNotCurrent) as refused:
        await migrations.upgrade(database)
    assert str(refused.value).startswith(
        "the database's tables were made before migrations and differ from revision 0001 "
        "(remove_column packets.note; 1 difference(s))"
    )
    assert "alembic_version" not in await tables(database)


# -- start-up --------------------------------------------------------------------------------


async def start(empty: Empty, tmp_path: Path) -> None:
    """Start and stop the services on this database (fakeredis)."""
    settings = settings_for("", empty.url)
    services = build_services(settings)
    async with running(services, scheduler=False):
        pass


async def test_start_up_upgrades_sqlite_and_refuses_postgresql(
    empty: Empty, database: Database, tmp_path: Path
) -> None:
    if empty.kind == "sqlite":
        await start(empty, tmp_path)
        assert (await migrations.state(database)).revision == migrations.head()
        assert await differences(database) == []
        return
    with pytest.raises(SchemaNotCurrent) as refused:
        await start(empty, tmp_path)
    assert str(refused.value) == (
        f"the database has no schema yet, this version needs {migrations.head()}: "
        "run groupbuy db upgrade"
    )
    assert await tables(database) == set()
    await migrations.upgrade(database)
    await start(empty, tmp_path)  # once upgraded, it starts


async def test_start_up_adopts_a_create_all_sqlite_and_refuses_it_on_postgresql(
    empty: Empty, database: Database, tmp_path: Path
) -> None:
    await make_legacy(database)
    if empty.kind == "sqlite":
        await start(empty, tmp_path)
        assert (await migrations.state(database)).revision == migrations.head()
        return
    with pytest.raises(SchemaNotCurrent, match="made before migrations .*run groupbuy db upgrade"):
        await start(empty, tmp_path)
    assert "alembic_version" not in await tables(database)


async def test_a_schema_newer_than_the_code_is_refused_on_both(
    empty: Empty, database: Database, tmp_path: Path
) -> None:
    await migrations.upgrade(database)
    async with database.engine.begin() as connection:
        await connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(SchemaNotCurrent) as refused:
        await start(empty, tmp_path)
    assert str(refused.value) == (
        f"the database schema is at 9999, which this version does not know (it needs "
        f"{migrations.head()}): a newer version upgraded it; run that version, or downgrade "
        f"with it (groupbuy db downgrade {migrations.head()})"
    )


@pytest.fixture
def with_a_next_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The shipped migrations plus one more revision (a new table), as the next version
    would ship them; yields its id."""
    location = tmp_path / "migrations"
    shutil.copytree(
        migrations.SCRIPT_LOCATION,
        location,
        ignore=shutil.ignore_patterns("__pycache__", "__init__.py"),
    )
    head = migrations.head()
    following = f"{int(head) + 1:04d}"
    (location / "versions" / f"{following}_next.py").write_text(
        f'"""A table the next version adds."""\n'
        "import sqlalchemy as sa\n"
        "from alembic import op\n\n"
        f"revision = {following!r}\n"
        f"down_revision = {head!r}\n"
        "branch_labels = None\n"
        "depends_on = None\n\n\n"
        "def upgrade() -> None:\n"
        "    op.create_table('next_things', sa.Column('id', sa.Integer(), primary_key=True))\n\n\n"
        "def downgrade() -> None:\n"
        "    op.drop_table('next_things')\n"
    )
    monkeypatch.setattr(migrations, "SCRIPT_LOCATION", location)
    migrations.scripts.cache_clear()
    try:
        yield following
    finally:
        migrations.scripts.cache_clear()


async def test_a_schema_behind_the_code_upgrades_sqlite_and_refuses_postgresql(
    empty: Empty, database: Database, tmp_path: Path, with_a_next_revision: str
) -> None:
    before = migrations.history()[-2].revision
    await migrations.upgrade(database, before)
    if empty.kind == "sqlite":
        await start(empty, tmp_path)
        assert (await migrations.state(database)).revision == with_a_next_revision
        assert "next_things" in await tables(database)
        return
    with pytest.raises(SchemaNotCurrent) as refused:
        await start(empty, tmp_path)
    assert str(refused.value) == (
        f"the database schema is at {before}, this version needs {with_a_next_revision}: "
        "run groupbuy db upgrade"
    )
    assert "next_things" not in await tables(database)


# -- the command line ----------------------------------------------------------------------


def test_db_current_upgrade_downgrade_and_history_through_the_cli(
    empty: Empty, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GROUPBUY_DATABASE_URL", empty.url)
    monkeypatch.delenv("GROUPBUY_CONFIG", raising=False)
    head = migrations.head()

    def run(*argv: str) -> tuple[int, str]:
        status = main(["db", *argv])
        captured = capsys.readouterr()
        assert captured.err == ""
        [line] = captured.out.splitlines()
        return status, line

    sqlite = empty.url.startswith("sqlite")

    def without_schema() -> str:
        """What `db current` says of the database with no schema: on SQLite, what `groupbuy
        serve` will do (never the advice to upgrade, which serve does itself)."""
        if not sqlite:
            return f"none: {empty.url}: the database has no schema yet, {needs}"
        if not Path(str(make_url(empty.url).database)).exists():
            return f"none: {empty.url}: no database file yet; `groupbuy serve` creates it at {head}"
        return f"none: {empty.url}: `groupbuy serve` upgrades it to {head} at start"

    needs = f"this version needs {head}: run groupbuy db upgrade"
    assert run("current") == (0, without_schema())
    assert run("current", "--check")[0] == 1
    assert run("upgrade") == (0, f"database {empty.url}: upgraded from base to {head}")
    assert run("upgrade") == (0, f"database {empty.url}: already at {head}")
    assert run("current", "--check") == (0, f"{head} (head): {empty.url}")
    assert run("downgrade", "base") == (0, f"database {empty.url}: downgraded from {head} to base")
    assert run("current") == (0, without_schema())
    assert run("upgrade", migrations.BASELINE)[0] == 0
    assert main(["db", "history"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        f"{migrations.history()[-1].down_revision or '<base>'} -> {head} (head): "
    )
    assert lines[-1].startswith("<base> -> 0001: ") or lines[-1].startswith(
        "<base> -> 0001 (head): "
    )


def test_db_upgrade_as_a_command_adopts_a_create_all_database(tmp_path: Path) -> None:
    """The console command, as an operator runs it, on a SQLite file made the old way."""
    legacy = tmp_path / "old.db"
    url = f"sqlite+aiosqlite:///{legacy}"

    async def make() -> None:
        database = Database(url)
        try:
            await make_legacy(database)
        finally:
            await database.dispose()

    asyncio.run(make())
    env = service_environment(tmp_path, GROUPBUY_DATABASE_URL=url)
    done = run_groupbuy(tmp_path, env, "db", "upgrade")
    assert done.returncode == 0, done
    assert done.stdout == (
        f"database {url}: tables made before migrations, checked and stamped 0001; "
        f"now at {migrations.head()}\n"
    )
    assert "Traceback" not in done.stderr


def test_db_on_an_unreachable_database_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql+asyncpg://gb@127.0.0.1:{free_port()}/nothing"
    monkeypatch.setenv("GROUPBUY_DATABASE_URL", url)
    assert main(["db", "upgrade"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"groupbuy: database {url}: "), line


# -- groupbuy serve ------------------------------------------------------------------------


def wait_listening(service: Service, timeout_s: float = 120) -> None:
    """Until every worker has started (the first answers /healthz before the others; the
    bound only catches a hang, see start_service)."""
    deadline = time.monotonic() + timeout_s
    while "listening on" not in service.text():
        assert service.process.poll() is None, service.text()
        assert time.monotonic() < deadline, service.text()
        time.sleep(0.05)


@pytest.mark.real
@pytest.mark.slow
def test_serve_with_workers_refuses_an_empty_postgres_then_starts_every_time(
    tmp_path: Path, postgres: PostgresProcess, real_redis_url: str
) -> None:
    """Several workers used to race create_all on a new PostgreSQL database (and the loser
    failed the start); now the schema comes from `groupbuy db upgrade`, before any start."""
    url = postgres.create_database(f"serve_{next(_names)}")
    env = service_environment(
        tmp_path, GROUPBUY_REDIS_URL=real_redis_url, GROUPBUY_DATABASE_URL=url
    )
    refused = run_groupbuy(tmp_path, env, "serve", "--port", "0", "--workers", "2")
    assert refused.returncode == 2, refused
    assert "listening" not in refused.stdout
    assert refused.stderr.splitlines() == [
        f"groupbuy: the database has no schema yet, this version needs {migrations.head()}: "
        "run groupbuy db upgrade"
    ]
    assert run_groupbuy(tmp_path, env, "db", "upgrade").returncode == 0
    for _ in range(3):
        service = start_service(tmp_path, "--workers", "2", env=env)
        wait_listening(service)
        assert service.stop() == 0, service.text()


@pytest.mark.real
@pytest.mark.slow
def test_serve_with_workers_upgrades_a_create_all_sqlite_once_in_the_parent(
    tmp_path: Path, real_redis_url: str
) -> None:
    """The database named by --config, made the old way: the parent checks, stamps and
    upgrades it before the workers start, and the workers use that same file."""
    legacy = tmp_path / "old.db"
    url = f"sqlite+aiosqlite:///{legacy}"

    async def make() -> None:
        database = Database(url)
        try:
            await make_legacy(database)
        finally:
            await database.dispose()

    asyncio.run(make())
    config = tmp_path / "groupbuy.toml"
    config.write_text(f'[database]\nurl = "{url}"\n')
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    env = service_environment(workdir, GROUPBUY_REDIS_URL=real_redis_url)
    del env["GROUPBUY_DATABASE_URL"]
    service = start_service(workdir, "--workers", "2", "--config", str(config), env=env)
    wait_listening(service)
    assert service.stop() == 0, service.text()
    assert service.text().count("database schema upgraded from base to") == 1, service.text()
    assert not (workdir / "groupbuy.db").exists()  # the workers did not open another one

    async def revision() -> str | None:
        database = Database(url)
        try:
            return (await migrations.state(database)).revision
        finally:
            await database.dispose()

    assert asyncio.run(revision()) == migrations.head()


def worker_pids(parent: int) -> list[int]:
    """The uvicorn workers of a `groupbuy serve --workers N` (not multiprocessing's helper)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in command:
            found.append(int(entry.name))
    return found


@pytest.mark.real
@pytest.mark.slow
def test_a_replacement_worker_that_cannot_start_stops_the_service_non_zero(
    tmp_path: Path, postgres: PostgresProcess, real_redis_url: str
) -> None:
    """A worker dies while a newer version has upgraded the schema: its replacement refuses
    to start, and the service stops with status 3 instead of starting it again for ever."""
    url = postgres.create_database(f"replace_{next(_names)}")
    env = service_environment(
        tmp_path, GROUPBUY_REDIS_URL=real_redis_url, GROUPBUY_DATABASE_URL=url
    )
    assert run_groupbuy(tmp_path, env, "db", "upgrade").returncode == 0
    service = start_service(tmp_path, "--workers", "2", env=env)
    try:
        wait_listening(service)
        workers = worker_pids(service.process.pid)
        assert len(workers) == 2, workers

        async def newer() -> None:
            database = Database(url)
            try:
                async with database.engine.begin() as connection:
                    await connection.execute(
                        text("UPDATE alembic_version SET version_num = '9999'")
                    )
            finally:
                await database.dispose()

        asyncio.run(newer())
        os.kill(workers[0], signal.SIGKILL)
        status = service.process.wait(timeout=60)
    finally:
        service.stop()
    text_out = service.text()
    assert status == 3, text_out
    assert "the database schema is at 9999, which this version does not know" in text_out
    assert text_out.rstrip().splitlines()[-1] == (
        "groupbuy: a worker that replaced one that died could not start (the error is above): "
        "the service stopped"
    )
    assert all(wait_gone(pid) for pid in workers)
