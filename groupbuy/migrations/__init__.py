"""The schema's migrations (Alembic), shipped inside the package, and what start-up checks.

`groupbuy db upgrade` applies them; the embedded SQLite default upgrades itself at start;
on PostgreSQL the service refuses to start until the schema is the one this version
needs (SchemaNotCurrent). Revisions live in versions/, named `<NNNN>_<slug>.py`, each
`revision = "NNNN"` revising the one before. The Alembic configuration is built here
from the service's settings: no alembic.ini.

A database that the versions before migrations made with create_all (tables, no
alembic_version) is checked against revision 0001 and stamped with it, then upgraded.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, MetaData, inspect, text

from groupbuy.settings import SettingsError
from groupbuy.storage.db import Base, Database

log = logging.getLogger(__name__)

# Where the revisions and env.py are: this package's directory.
SCRIPT_LOCATION = Path(__file__).resolve().parent
# The revision that holds the schema the versions before migrations made with create_all.
BASELINE = "0001"
# Key of the PostgreSQL advisory lock two upgrades at once queue on ("gbup").
ADVISORY_LOCK = 0x67627570
UPGRADE_COMMAND = "groupbuy db upgrade"


class SchemaNotCurrent(SettingsError):
    """The database's schema is not the one this version needs (or cannot be adopted)."""


def models_metadata() -> MetaData:
    """The metadata of every model of the service (what autogenerate compares with)."""
    # Every module that defines a table (tests/test_migrations.py checks none is missing).
    import groupbuy.locks.models
    import groupbuy.ops.audit
    import groupbuy.ops.blocklist
    import groupbuy.ops.reconcile.table
    import groupbuy.redpacket.models
    import groupbuy.storage.deadletters
    import groupbuy.storage.events
    import groupbuy.webhooks.models  # noqa: F401

    return Base.metadata


def alembic_config(url: str | None = None) -> Config:
    """Alembic's configuration, built in code: the migrations of this package, revision
    files named `<rev>_<slug>.py`, and the database URL when given."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@functools.cache
def scripts() -> ScriptDirectory:
    """The revisions shipped with this version (read once per process)."""
    return ScriptDirectory.from_config(alembic_config())


def head() -> str:
    """The revision this version of the code needs."""
    heads = scripts().get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the migrations have {len(heads)} heads ({heads}); merge them")
    return str(heads[0])


@dataclass(frozen=True)
class Revision:
    """One shipped revision, for `groupbuy db history`."""

    revision: str
    down_revision: str | None
    summary: str


def history() -> list[Revision]:
    """Every shipped revision, oldest first."""
    found = []
    for script in scripts().walk_revisions():
        down = script.down_revision
        found.append(Revision(script.revision, down if isinstance(down, str) else None, script.doc))
    return found[::-1]


def next_revision_id() -> str:
    """The id of a new revision: the number after the highest one, four digits."""
    numbers = [int(r.revision) for r in history() if r.revision.isdigit()]
    return f"{max(numbers, default=0) + 1:04d}"


# -- what a database holds -------------------------------------------------------------------


@dataclass(frozen=True)
class SchemaState:
    """Where a database's schema stands: its revision (None: not stamped), and whether it
    holds tables of the service made before migrations (create_all, no alembic_version)."""

    revision: str | None
    legacy_tables: bool

    @property
    def known(self) -> bool:
        """Whether this version ships the database's revision (False: a newer version's)."""
        return self.revision is None or self.revision in {r.revision for r in history()}

    def problem(self) -> str | None:
        """None when the schema is the one this version needs, else the one-line reason."""
        needed = head()
        if self.revision == needed:
            return None
        if self.revision is None and self.legacy_tables:
            return (
                "the database's tables were made before migrations (no alembic_version), "
                f"this version needs {needed}: run {UPGRADE_COMMAND}"
            )
        if self.revision is None:
            return (
                f"the database has no schema yet, this version needs {needed}: "
                f"run {UPGRADE_COMMAND}"
            )
        if not self.known:
            return (
                f"the database schema is at {self.revision}, which this version does not know "
                f"(it needs {needed}): a newer version upgraded it; run that version, or "
                f"downgrade with it (groupbuy db downgrade {needed})"
            )
        return (
            f"the database schema is at {self.revision}, this version needs {needed}: "
            f"run {UPGRADE_COMMAND}"
        )


def _revision(connection: Connection) -> str | None:
    heads = MigrationContext.configure(connection).get_current_heads()
    return ",".join(sorted(heads)) if heads else None


def read_state(connection: Connection) -> SchemaState:
    """The schema state of the database on `connection`."""
    revision = _revision(connection)
    legacy = False
    if revision is None:
        tables = set(inspect(connection).get_table_names())
        legacy = bool(tables & set(_baseline().tables))
    return SchemaState(revision, legacy)


def _baseline() -> MetaData:
    module = scripts().get_revision(BASELINE).module
    metadata: MetaData = module.schema()
    return metadata


# -- changing it ---------------------------------------------------------------------------


def _run(connection: Connection, operation: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """An Alembic command on this connection (env.py takes it from the attributes)."""
    config = alembic_config()
    config.attributes["connection"] = connection
    return operation(config, *args, **kwargs)


def _serialize(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        # Held to the end of the transaction: two upgrades at once queue here, and the
        # second reads the revision the first left.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK})


def adopt_legacy(connection: Connection) -> bool:
    """Stamp a database made by create_all before migrations (tables of the service, no
    alembic_version) with the baseline revision once its tables are checked against it;
    tables it lacks (made by versions older still) are created first. SchemaNotCurrent
    when a table differs; False when there was nothing to adopt."""
    state = read_state(connection)
    if state.revision is not None or not state.legacy_tables:
        return False
    baseline = _baseline()
    context = MigrationContext.configure(
        connection,
        opts={
            # Only the service's tables: whatever else the database holds is not ours.
            "include_name": lambda name, kind, _parents: kind != "table" or name in baseline.tables,
            "compare_type": True,
        },
    )
    found = compare_metadata(context, baseline)
    missing = {d[1].name for d in found if isinstance(d, tuple) and d[0] == "add_table"}
    differences = [
        d
        for d in found
        if not (isinstance(d, tuple) and d[0] == "add_table")
        # a missing table's indexes come with it
        and not (isinstance(d, tuple) and d[0] == "add_index" and d[1].table.name in missing)
    ]
    if differences:
        raise SchemaNotCurrent(
            f"the database's tables were made before migrations and differ from revision "
            f"{BASELINE} ({_describe(differences[0])}; {len(differences)} difference(s)): "
            "fix them by hand or start from a new database"
        )
    if missing:
        made = [table for table in baseline.sorted_tables if table.name in missing]
        baseline.create_all(connection, tables=made, checkfirst=False)
        log.info("created the tables the database lacked: %s", ", ".join(sorted(missing)))
    _run(connection, command.stamp, BASELINE)
    log.info("database made before migrations: checked against %s and stamped", BASELINE)
    return True


def _describe(diff: Any) -> str:
    """One difference compare_metadata found, in words."""
    if isinstance(diff, list):  # modify_* come as a list of tuples about one column
        diff = diff[0]
        return f"{diff[0]} {diff[2]}.{diff[3]}: {diff[5]!r} in the database, {diff[6]!r} expected"
    kind, target = diff[0], diff[-1]
    name = getattr(target, "name", target)
    table = getattr(getattr(target, "table", None), "name", None)
    if kind in {"add_column", "remove_column"}:
        table = diff[2]
    return f"{kind} {table + '.' if table else ''}{name}"


class Moved(NamedTuple):
    """What an upgrade or downgrade did: the revision before (None: no schema), the one
    after, and whether the database was made before migrations and stamped first."""

    before: str | None
    after: str | None
    adopted: bool = False


def upgrade_connection(connection: Connection, revision: str = "head") -> Moved:
    """Upgrade the database on `connection` (adopting a create_all one first)."""
    _serialize(connection)
    before = _revision(connection)
    adopted = adopt_legacy(connection)
    _run(connection, command.upgrade, revision)
    return Moved(before, _revision(connection), adopted)


def downgrade_connection(connection: Connection, revision: str) -> Moved:
    """Downgrade the database on `connection` to `revision` ('base': no tables)."""
    _serialize(connection)
    before = _revision(connection)
    _run(connection, command.downgrade, revision)
    return Moved(before, _revision(connection))


async def upgrade(database: Database, revision: str = "head") -> Moved:
    """Upgrade the database to `revision`."""
    async with database.engine.begin() as connection:
        return await connection.run_sync(upgrade_connection, revision)


async def downgrade(database: Database, revision: str) -> Moved:
    """Downgrade the database to `revision`."""
    async with database.engine.begin() as connection:
        return await connection.run_sync(downgrade_connection, revision)


async def state(database: Database) -> SchemaState:
    """Where the database's schema stands."""
    async with database.engine.connect() as connection:
        return await connection.run_sync(read_state)


async def prepare(database: Database) -> None:
    """The start-up step: on SQLite, upgrade the schema to this version's; elsewhere
    (PostgreSQL) raise SchemaNotCurrent, naming the command, unless it is already there."""
    found = await state(database)
    problem = found.problem()
    if problem is None:
        return
    if not database.is_sqlite or not found.known:
        raise SchemaNotCurrent(problem)
    moved = await upgrade(database)
    made = " (made before migrations: checked and stamped first)" if moved.adopted else ""
    log.info("database schema upgraded from %s to %s%s", moved.before or "base", moved.after, made)
