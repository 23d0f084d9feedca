"""`groupbuy worker` runs the deliverer too: alone on the test's Redis and SQL (SQLite and
PostgreSQL), it delivers an endpoint's events and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from groupbuy.services import Services
from groupbuy.webhooks.store import EndpointSpec
from tests.support.receiver import Receiver, arrived
from tests.support.webhooks import feed, team_event, verified

pytestmark = [pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])]


async def test_the_worker_process_delivers_webhooks(
    services: Services, tmp_path: Path, receiver: Receiver
) -> None:
    created = await services.webhooks.store.create(
        EndpointSpec("shop", receiver.url, ("team.formed",))
    )
    await feed(services.database, *(team_event("team.formed", f"t{n}", 3) for n in range(5)))
    env = {
        **os.environ,
        "GROUPBUY_REDIS_URL": services.settings.redis.url,
        "GROUPBUY_DATABASE_URL": services.settings.database.effective_url,
        "GROUPBUY_WEBHOOKS_ALLOW_HTTP": "true",
        "GROUPBUY_WEBHOOKS_ALLOW_PRIVATE_NETWORKS": "true",
    }
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "groupbuy.cli",
        "worker",
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        got = await arrived(receiver, 5, timeout_s=30)
        worker.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(worker.communicate(), 30)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    assert worker.returncode == 0, output
    secret = str(created.body["secret"])
    teams = sorted(verified(secret, r)["data"]["data"]["team_id"] for r in got)
    assert teams == [f"t{n}" for n in range(5)]
