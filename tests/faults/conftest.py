"""Fixtures of the fault matrix: each test starts its own redis-server (AOF always)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import server_binary
from tests.support.storm import RedisUnderTest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.real)
            if server_binary() is None and not os.environ.get("CI"):
                item.add_marker(pytest.mark.skip(reason="needs a redis-server binary"))


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisUnderTest]:
    """A private redis-server with `appendfsync always`, stopped (and resumed) at the end."""
    server = RedisUnderTest(tmp_path / "redis-data")
    try:
        yield server
    finally:
        server.stop()
