"""The databases the events-feed tests run on: a SQLite file and a database of a throwaway
PostgreSQL cluster (tests/support/postgres.py), started once per test module."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from tests.support.postgres import PostgresProcess

DATABASES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.real)]

_names = itertools.count(1)


def database_url(kind: str, directory: Path, request: pytest.FixtureRequest) -> str:
    """The URL of a new, empty database of `kind`: a SQLite file under `directory`, or a
    new database of the module's cluster (fixture `postgres`)."""
    if kind == "sqlite":
        return f"sqlite+aiosqlite:///{directory / 'feed.db'}"
    cluster: PostgresProcess = request.getfixturevalue("postgres")
    return cluster.create_database(f"feed{os.getpid()}_{next(_names)}")
