"""`groupbuy serve` on the embedded default (no Redis URL), as a real process: it runs its own
engine, keeps every acknowledged grab across kill -9 and a restart, starts a dead engine
again, shares it between workers, and holds its data directory against a second service.

On SQLite only: the embedded default is a SQLite file (`groupbuy.db`) beside the engine's
data, and that default is what these tests start."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from groupbuy.redpacket.models import GrabRow, LedgerEntryRow
from groupbuy.services import build_services
from groupbuy.settings import load_settings
from groupbuy.storage.embedded import LOCK_NAME
from tests.support.http import ADMIN, SERVICE
from tests.support.money import assert_money_conserved
from tests.support.service import (
    Service,
    is_running,
    run_groupbuy,
    service_environment,
    start_service,
    wait_gone,
)

PACKET, SHARES, PACKET_CENTS = "storm", 5_000, 500_000
CLIENTS = 32  # concurrent grabbers, each a new user per request
KILL_AFTER_GRABS = 400  # acknowledged grabs before the kill
STORM_LIMIT_S = 20.0  # the storm and the kill, at most
PER_CLIENT = 1_000  # requests per grabber, at most


def post(service: Service, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    answer = httpx.post(f"{service.url}{path}", json=body, headers=headers, timeout=30)
    assert answer.status_code in (200, 201), (path, answer.status_code, answer.text)
    return answer.json()


def get(service: Service, path: str) -> Any:
    answer = httpx.get(f"{service.url}{path}", headers=SERVICE, timeout=30)
    assert answer.status_code == 200, (path, answer.status_code, answer.text)
    return answer.json()


def every_grab(service: Service, packet_id: str) -> list[dict[str, Any]]:
    """All of a packet's grabs, page after page (its GET carries the first 100)."""
    grabs, cursor = [], ""
    while True:
        page = get(service, f"/v1/redpackets/{packet_id}/grabs?limit=100{cursor}")
        grabs += page["grabs"]
        if page["next_cursor"] is None:
            return grabs
        cursor = f"&cursor={page['next_cursor']}"


def send_packet(service: Service, packet_id: str, cents: int, shares: int) -> None:
    post(
        service,
        "/v1/accounts/sender/deposits",
        {"amount_cents": cents, "reference": packet_id},
        ADMIN,
    )
    body = {"sender_id": "sender", "amount_cents": cents, "count": shares, "packet_id": packet_id}
    post(service, "/v1/redpackets", body, SERVICE)


class Storm:
    """Grab clients over HTTP, each request a new user, until the service is gone."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acknowledged: dict[str, int] = {}  # told "grabbed": user -> amount
        self.unknown: set[str] = set()  # no answer, or 503: the grab may or may not have run
        self.unexpected: list[tuple[int, str]] = []
        self.stop = asyncio.Event()

    async def run(self, kill: Any) -> float:
        """Grab until `kill()` has run (once KILL_AFTER_GRABS are acknowledged); the seconds
        the storm lasted before the kill."""
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(base_url=self.url, headers=SERVICE, limits=limits) as http:
            grabbers = [asyncio.create_task(self._grab(http, task)) for task in range(CLIENTS)]
            began = time.monotonic()
            while len(self.acknowledged) < KILL_AFTER_GRABS:
                assert time.monotonic() - began < STORM_LIMIT_S, "the storm did not get going"
                await asyncio.sleep(0.005)
            lasted = time.monotonic() - began
            kill()
            self.stop.set()
            await asyncio.wait_for(asyncio.gather(*grabbers), STORM_LIMIT_S)
        return lasted

    async def _grab(self, http: httpx.AsyncClient, task: int) -> None:
        for n in range(PER_CLIENT):
            if self.stop.is_set():
                return
            user = f"u{task}-{n}"
            try:
                answer = await http.post(f"/v1/redpackets/{PACKET}/grab", json={"user_id": user})
            except httpx.TransportError:
                self.unknown.add(user)  # the service is gone (or going)
                return
            body = answer.json()
            if answer.status_code == 200 and body["status"] == "grabbed":
                self.acknowledged[user] = body["amount_cents"]
            elif answer.status_code == 503:
                self.unknown.add(user)
            else:
                self.unexpected.append((answer.status_code, answer.text))


async def sql_checks(directory: Path, acknowledged: dict[str, int], grabs: int) -> None:
    """Each acknowledged grab is one grab row and one ledger credit of its amount; SQL holds
    as many grabs as Redis; money is conserved."""
    settings = load_settings(
        None, {"GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{directory / 'groupbuy.db'}"}
    )
    services = build_services(settings)  # only its database is used here
    try:
        async with services.database.sessions() as session:
            rows = dict(
                (await session.execute(select(GrabRow.user_id, GrabRow.amount_cents))).all()
            )
            credits = (
                await session.execute(
                    select(
                        LedgerEntryRow.user_id, func.count(), func.sum(LedgerEntryRow.amount_cents)
                    )
                    .where(LedgerEntryRow.kind == "grab_credit")
                    .group_by(LedgerEntryRow.user_id)
                )
            ).all()
        assert len(rows) == grabs
        assert {user: rows.get(user) for user in acknowledged} == acknowledged
        by_user = {user: (int(n), int(total)) for user, n, total in credits}
        assert {user: by_user.get(user) for user in acknowledged} == {
            user: (1, amount) for user, amount in acknowledged.items()
        }
        await assert_money_conserved(services)
    finally:
        await services.redis.aclose()
        await services.database.dispose()


def flush(service: Service, deadline_s: float = 30) -> int:
    """Run flush_records until no grab record waits (a dead writer's pending batch is taken
    over after reclaim_idle_s); the grab records it wrote."""
    deadline, written = time.monotonic() + deadline_s, 0
    while True:
        report = post(service, "/v1/admin/jobs/flush_records/run", {}, ADMIN)
        written += int(report["packet_records"])
        if report["backlog"] == 0:
            return written
        assert time.monotonic() < deadline, report
        time.sleep(0.2)


@pytest.mark.real
@pytest.mark.slow
def test_restart_of_the_embedded_service_mid_storm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC §5: kill -9 the service and its engine while grabs pour in, start it again on
    the same data: every grab a client was told about is there, once, and money adds up."""
    env = service_environment(tmp_path, GROUPBUY_REDPACKETS_RECLAIM_IDLE_S="0.5")
    # No background flush before the kill: every acknowledged grab is in Redis alone then.
    first = start_service(tmp_path, env={**env, "GROUPBUY_OUTBOX_FLUSH_INTERVAL_S": "600"})
    try:
        send_packet(first, PACKET, PACKET_CENTS, SHARES)
        engine = first.engine_pid
        storm = Storm(first.url)

        def kill() -> None:
            os.kill(engine, signal.SIGKILL)
            first.process.kill()

        storm_s = asyncio.run(storm.run(kill))
        first.process.wait(timeout=10)
    finally:
        first.stop(timeout_s=1)
    assert wait_gone(engine, timeout_s=5)
    assert storm.unexpected == []
    began = time.monotonic()
    second = start_service(tmp_path, env=env)
    try:
        restart_s = time.monotonic() - began
        assert second.engine_pid != engine
        packet = get(second, f"/v1/redpackets/{PACKET}")
        kept = {grab["user_id"]: grab["amount_cents"] for grab in every_grab(second, PACKET)}
        assert {user: kept.get(user) for user in storm.acknowledged} == storm.acknowledged
        assert set(kept) <= set(storm.acknowledged) | storm.unknown
        assert len(kept) == SHARES - packet["remaining_count"]
        for user, amount in list(storm.acknowledged.items())[:50]:
            again = post(second, f"/v1/redpackets/{PACKET}/grab", {"user_id": user}, SERVICE)
            assert again == {"status": "already_grabbed", "amount_cents": amount}
        written = flush(second)
        asyncio.run(sql_checks(tmp_path, storm.acknowledged, len(kept)))
        after = post(second, f"/v1/redpackets/{PACKET}/grab", {"user_id": "late"}, SERVICE)
        assert after["status"] == "grabbed"
    finally:
        assert second.stop() == 0, second.text()
    with capsys.disabled():
        print(
            f"\n[figures] embedded restart mid-storm: {len(storm.acknowledged)} grabs acknowledged "
            f"in {storm_s:.2f}s by {CLIENTS} clients, {len(storm.unknown)} unanswered; after "
            f"kill -9 of service and engine: {len(kept)} grabs kept, all acknowledged ones "
            f"recorded once in SQL ({written} records written after the restart); restart "
            f"to /healthz in {restart_s:.2f}s"
        )


@pytest.mark.real
@pytest.mark.slow
def test_the_service_starts_its_engine_again_after_kill_9(tmp_path: Path) -> None:
    service = start_service(tmp_path)
    try:
        send_packet(service, "p", 1_000, 10)
        first = service.engine_pid
        os.kill(first, signal.SIGKILL)
        statuses: list[int] = []
        deadline = time.monotonic() + 20
        while True:  # answers in between are 503s, never anything else
            answer = httpx.get(f"{service.url}/v1/redpackets/p", headers=SERVICE, timeout=10)
            statuses.append(answer.status_code)
            if answer.status_code == 200:
                break
            assert answer.status_code == 503 and time.monotonic() < deadline, answer.text
            time.sleep(0.02)
        assert answer.json()["count"] == 10
        grabbed = post(service, "/v1/redpackets/p/grab", {"user_id": "u1"}, SERVICE)
        assert grabbed["status"] == "grabbed"
    finally:
        assert service.stop() == 0
    restarted = [line for line in service.text().splitlines() if "starting it again" in line]
    assert len(restarted) == 1 and " WARNING " in restarted[0] and f"pid {first}" in restarted[0]
    assert set(statuses) <= {200, 503}


@pytest.mark.real
@pytest.mark.slow
def test_several_workers_share_the_embedded_engine(tmp_path: Path) -> None:
    """`--workers 2` on the embedded default: the parent runs the engine and hands its socket
    (and the development key it generated) to the workers; SIGTERM stops all of it."""
    env = service_environment(tmp_path)
    del env["GROUPBUY_API_KEYS"]
    service = start_service(tmp_path, "--workers", "2", env=env)
    try:
        # The start-up message comes once every worker serves: maybe just after the first.
        deadline = time.monotonic() + 30
        while "export GROUPBUY_KEY=" not in service.text():
            assert time.monotonic() < deadline, service.text()
            time.sleep(0.05)
        key = service.text().split("export GROUPBUY_KEY=")[1].split()[0]
        admin = {"Authorization": f"Bearer {key}"}
        post(service, "/v1/accounts/a/deposits", {"amount_cents": 500, "reference": "r"}, admin)
        body = {"sender_id": "a", "amount_cents": 500, "count": 50, "packet_id": "w"}
        post(service, "/v1/redpackets", body, admin)
        answers = [
            post(service, "/v1/redpackets/w/grab", {"user_id": f"u{i}"}, admin) for i in range(50)
        ]
        assert [a["status"] for a in answers] == ["grabbed"] * 50
        assert sum(a["amount_cents"] for a in answers) == 500
        engine = service.engine_pid
    finally:
        code = service.stop()
    assert code == 0, service.text()
    assert not is_running(engine)


@pytest.mark.real
@pytest.mark.slow
def test_one_service_per_data_dir_and_the_worker_attaches_to_its_engine(tmp_path: Path) -> None:
    env = service_environment(tmp_path)
    alone = run_groupbuy(tmp_path, env, "worker")
    assert alone.returncode == 2 and "start `groupbuy serve`" in alone.stderr, alone
    service = start_service(tmp_path, env=env)
    try:
        second = run_groupbuy(tmp_path, env, "serve", "--port", "0")
        assert second.returncode == 2, second
        assert str(tmp_path / "data") in second.stderr
        assert f"PID {service.process.pid}" in second.stderr
        assert (tmp_path / "data" / LOCK_NAME).is_file()
        worker = subprocess.Popen(
            [sys.executable, "-m", "groupbuy.cli", "worker"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            assert worker.stdout is not None
            first = worker.stdout.readline()  # started (a loaded machine takes seconds)
            time.sleep(1)
            assert worker.poll() is None
            worker.send_signal(signal.SIGTERM)
            rest, _ = worker.communicate(timeout=20)
            output = first + rest
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        assert worker.returncode == 0, output
        assert f"unix://{tmp_path / 'data' / 'redis.sock'}".encode() in output
    finally:
        assert service.stop() == 0


def test_the_fakeredis_engine_warns_and_refuses_several_workers(tmp_path: Path) -> None:
    env = service_environment(tmp_path, GROUPBUY_EMBEDDED_ENGINE="fakeredis")
    refused = run_groupbuy(tmp_path, env, "serve", "--workers", "2", "--port", "0")
    assert refused.returncode == 2, refused
    assert "in-process fakeredis" in refused.stderr and "not durable" in refused.stderr
    assert "several workers need a Redis server" in refused.stderr
    assert not (tmp_path / "data").exists()


def test_the_fakeredis_engine_refuses_to_start_where_fakeredis_is_not_installed(
    tmp_path: Path,
) -> None:
    env = service_environment(tmp_path, GROUPBUY_EMBEDDED_ENGINE="fakeredis")
    # `groupbuy serve` where fakeredis is not installed (the service's dependencies only).
    without = "import sys; sys.modules['fakeredis'] = None; from groupbuy.cli import main; "
    refused = subprocess.run(
        [sys.executable, "-c", without + "raise SystemExit(main())", "serve", "--port", "0"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused
    assert 'engine = "fakeredis": the in-process fakeredis is not installed' in refused.stderr
    assert "pip install 'groupbuy[test]'" in refused.stderr
    assert "listening" not in refused.stdout + refused.stderr
