"""`groupbuy worker` alone drains grab records into SQL and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from groupbuy.redpacket.models import GrabRow
from groupbuy.services import Services
from tests.support.fixtures import SendPacketViaServices
from tests.support.money import count

pytestmark = [pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])]


async def start_worker(
    services: Services, directory: Path, **extra_env: str
) -> asyncio.subprocess.Process:
    """`groupbuy worker` on the test's Redis and SQL, its output (both streams) piped."""
    env = {
        **os.environ,
        "GROUPBUY_REDIS_URL": services.settings.redis.url,
        "GROUPBUY_DATABASE_URL": services.settings.database.effective_url,
        **extra_env,
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "groupbuy.cli",
        "worker",
        env=env,
        cwd=directory,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


async def test_worker_process_records_grabs(
    services: Services, tmp_path: Path, sent_packet_via_services: SendPacketViaServices
) -> None:
    packets = services.packets
    await sent_packet_via_services(100, 10, funds=100)
    for i in range(7):
        await packets.grabs.grab("pk", f"u{i}")
    assert await packets.writer.backlog() == 7

    worker = await start_worker(services, tmp_path, GROUPBUY_OUTBOX_FLUSH_INTERVAL_S="0.1")
    try:
        deadline = time.monotonic() + 20
        # polling SQL is the point: the worker is another process
        while await count(services, GrabRow) < 7 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        assert await count(services, GrabRow) == 7
        assert (await packets.accounts.account("u0"))["balance_cents"] > 0
        worker.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(worker.communicate(), 20)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    assert worker.returncode == 0, output
    assert b"worker" in output


async def test_a_worker_stopped_while_starting_exits_cleanly(
    services: Services, tmp_path: Path
) -> None:
    """SIGTERM right after the start-up line (the service modules still importing) is a
    clean stop, not a death by the signal."""
    worker = await start_worker(services, tmp_path, PYTHONUNBUFFERED="1")
    try:
        assert worker.stdout is not None
        first = await asyncio.wait_for(worker.stdout.readline(), 20)
        assert b"worker: redis" in first, first
        worker.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(worker.communicate(), 20)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    assert worker.returncode == 0, first + output
