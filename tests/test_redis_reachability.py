"""Redis going away and coming back: one WARNING line and one INFO line per process, never a
traceback per background loop per tick."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.services import build_services, running
from groupbuy.storage.reachability import Reachability
from tests.support.http import SERVICE
from tests.support.servers import free_port, server_binary, start_redis
from tests.support.settings import settings_for, settings_without_redis

needs_server = pytest.mark.skipif(
    server_binary() is None and not os.environ.get("CI"), reason="needs a server binary"
)


def redis_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "groupbuy.storage.reachability"]


@pytest.mark.real
@pytest.mark.slow
@needs_server
async def test_an_outage_is_one_line_down_and_one_line_back(
    tmp_path: Path, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    port, data = free_port(), tmp_path / "redis"
    data.mkdir()
    server = start_redis(port=port, directory=data)
    settings = settings_for(server.url, database_url).replace(
        "scheduler",
        lease_ttl_s=0.3,
        sweep_interval_s=0.05,
        expire_packets_interval_s=0.05,
        repair_interval_s=0.1,
        reconcile_interval_s=0.2,
    )
    settings = settings.replace("redis", socket_timeout_s=0.2)
    caplog.set_level(logging.INFO)
    try:
        async with running(build_services(settings)) as services:
            await asyncio.sleep(0.3)  # the lease is held, the jobs tick
            server.stop()
            await asyncio.sleep(2.0)  # dozens of ticks of every job and lease renewals
            assert services.reachability.down
            server = start_redis(port=port, directory=data)
            await asyncio.sleep(1.0)
            assert not services.reachability.down
    finally:
        server.stop()
    lines = redis_lines(caplog)
    where = f"redis at redis://127.0.0.1:{port}/0"
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO], [r.message for r in lines]
    assert lines[0].message.startswith(f"{where} unreachable: Error 111 connecting")
    assert lines[0].message.endswith("; retrying")
    assert lines[1].message == f"{where} is back"
    tracebacks = [r for r in caplog.records if r.exc_info and r.name.startswith("groupbuy")]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]


def test_requests_while_redis_is_down_log_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_without_redis(tmp_path).replace("scheduler", enabled=False)
    caplog.set_level(logging.INFO)
    with TestClient(create_app(settings)) as client:
        for _ in range(5):
            got = client.post("/v1/redpackets/p1/grab", json={"user_id": "u"}, headers=SERVICE)
            assert got.status_code == 503 and got.json()["code"] == "redis_unavailable"
        assert client.get("/readyz").status_code == 503
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings] == ["groupbuy.storage.reachability"], [
        r.getMessage() for r in warnings
    ]
    assert "unreachable" in warnings[0].message and warnings[0].exc_info is None


def test_other_errors_are_left_to_the_caller() -> None:
    reachability = Reachability("somewhere")
    assert not reachability.failed(ValueError("a bug"))
    assert not reachability.down


async def test_stopping_while_redis_is_away_leaves_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_without_redis(tmp_path).replace("scheduler", lease_ttl_s=0.3)
    caplog.set_level(logging.INFO)
    async with running(build_services(settings)) as services:
        await asyncio.sleep(0.5)  # lease renewals are retrying against the closed port
        assert services.reachability.down
    await asyncio.sleep(0.1)
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert tracebacks == []
