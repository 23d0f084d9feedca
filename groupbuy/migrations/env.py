"""Alembic's environment for groupbuy: migrations run on the connection groupbuy.migrations
hands over (a synchronous face of the service's async engine, through run_sync).

Run by `alembic` itself (an alembic.ini naming this directory), it makes that connection
from the configured sqlalchemy.url with the async driver.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import create_async_engine

from groupbuy.migrations import ADVISORY_LOCK, models_metadata

config = context.config


def run_migrations(connection: Connection) -> None:
    """Configure the context on `connection` and run what the command asked for."""
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=models_metadata(),
        # SQLite alters a table by copying it: later revisions' ALTERs work there too.
        render_as_batch=sqlite,
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Two `db upgrade` at once (or a deploy script run twice) queue here; the second
            # then finds the version the first left and has nothing to do.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK})
        context.run_migrations()


async def _run_on_own_engine(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(run_migrations)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("groupbuy's migrations run against a database (no --sql mode)")

given = config.attributes.get("connection")
if given is not None:
    run_migrations(given)
else:
    asyncio.run(_run_on_own_engine(config.get_main_option("sqlalchemy.url") or ""))
