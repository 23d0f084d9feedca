"""The databases the events-feed tests run on: a SQLite file and a database of a throwaway
PostgreSQL cluster (groupbuy/testing/postgres.py), started once per test module."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from groupbuy.testing.postgres import PostgresProcess, start_postgres

DATABASES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.real)]

_names = itertools.count(1)


def postgres_cluster() -> Iterator[PostgresProcess]:
    """A started cluster for a module-scoped fixture (skipped where PostgreSQL is not
    installed, except on CI), stopped at the end."""
    try:
        cluster = start_postgres()
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise
        pytest.skip("PostgreSQL is not installed (scripts/test.sh installs it)")
    try:
        yield cluster
    finally:
        cluster.stop()


def database_url(kind: str, directory: Path, request: pytest.FixtureRequest) -> str:
    """The URL of a new, empty database of `kind`: a SQLite file under `directory`, or a
    new database of the module's cluster (fixture `postgres`)."""
    if kind == "sqlite":
        return f"sqlite+aiosqlite:///{directory / 'feed.db'}"
    cluster: PostgresProcess = request.getfixturevalue("postgres")
    return cluster.create_database(f"feed{os.getpid()}_{next(_names)}")
