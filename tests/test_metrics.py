"""Metrics and access logs (SPEC §3 Operations): /metrics, outcome counters, latency,
write-behind gauges, job runs, backend errors, multiprocess mode, one log line per request.

The metrics registry is global to the process, so every check reads a value before and
after the traffic it causes and compares the difference.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy.exc
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request
from starlette.testclient import TestClient

from groupbuy import metrics
from groupbuy.api import ACCESS_LOGGER, system
from groupbuy.api.app import create_app
from groupbuy.api.logformat import JsonFormatter
from groupbuy.api.problems import handle_error
from groupbuy.services import Services
from groupbuy.settings import Settings
from groupbuy.storage.db import unavailable
from groupbuy.storage.reachability import Reachability
from tests.support.database import fail_writes
from tests.support.fixtures import OpenTeam
from tests.support.http import ADMIN, ADMIN_KEY, SERVICE, SERVICE_KEY, app_services, portal
from tests.support.settings import settings_without_redis

ROOT = Path(__file__).resolve().parent.parent
LOCKS = "/v1/activities/{activity_id}/teams/{team_id}/locks"
GRAB = "/v1/redpackets/{packet_id}/grab"
HTTP_COUNT = "groupbuy_http_request_duration_seconds_count"
FAMILIES = {
    "groupbuy_lock_outcomes",
    "groupbuy_grab_outcomes",
    "groupbuy_http_request_duration_seconds",
    "groupbuy_writeback_backlog_records",
    "groupbuy_writeback_lag_seconds",
    "groupbuy_job_runs",
    "groupbuy_job_duration_seconds",
    "groupbuy_backend_errors",
    "groupbuy_redis_batch_calls",
}
GENERATED_ID = re.compile(r"[0-9a-f]{32}")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# -- helpers ------------------------------------------------------------------------


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text page, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(client: TestClient) -> Samples:
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain"), r.headers
    return parse(r.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when it does not exist yet (a label set never used)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def deltas(before: Samples, after: Samples, name: str, label: str) -> dict[str, float]:
    """How much each labelled sample of `name` rose, by the value of `label` (changes only)."""
    changed = {}
    for (sample, labels), now in after.items():
        if sample == name:
            key = dict(labels)[label]
            if now != before.get((sample, labels), 0.0):
                changed[key] = now - before.get((sample, labels), 0.0)
    return changed


def lock(client: TestClient, user: str, team: str = "t1", activity: str = "a") -> int:
    url = f"/v1/activities/{activity}/teams/{team}/locks"
    return client.post(url, json={"user_id": user}, headers=SERVICE).status_code


def join(client: TestClient, user: str, activity: str = "a") -> int:
    url = f"/v1/activities/{activity}/locks"
    return client.post(url, json={"user_id": user}, headers=SERVICE).status_code


def grab(client: TestClient, packet: str, user: str) -> int:
    url = f"/v1/redpackets/{packet}/grab"
    return client.post(url, json={"user_id": user}, headers=SERVICE).status_code


def send(client: TestClient, **body: Any) -> None:
    r = client.post("/v1/redpackets", json=body, headers=SERVICE)
    assert r.status_code == 201, r.text


def fund(client: TestClient, user: str, amount: int) -> None:
    r = client.post(
        f"/v1/accounts/{user}/deposits",
        json={"amount_cents": amount, "reference": f"dep-{user}"},
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text


def access_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == ACCESS_LOGGER]


@pytest.fixture
def quiet_client(settings: Settings) -> Iterator[TestClient]:
    """A client whose background work does not drain the outbox streams during the test: no
    scheduler (a long flush interval no longer keeps them, as a grab wakes the flush)."""
    with TestClient(create_app(settings.replace("scheduler", enabled=False))) as client:
        yield client


def run_python(code: str, env: dict[str, str], cwd: Path = ROOT) -> str:
    """Run `code` in a fresh interpreter on this checkout; returns its stdout and stderr."""
    path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**env, "PYTHONPATH": path},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


# -- /metrics -----------------------------------------------------------------------


def test_metrics_is_open_prometheus_text_not_redirected(client: TestClient) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-key"}):
        r = client.get("/metrics", headers=headers, follow_redirects=False)
        assert r.status_code == 200 and not r.history, (r.status_code, r.text)
        assert r.headers["content-type"].startswith("text/plain"), r.headers
        names = {family.name for family in text_string_to_metric_families(r.text)}
        assert names >= FAMILIES, FAMILIES - names
    assert client.get("/metrics/", follow_redirects=False).status_code != 307
    documented = client.get("/openapi.json").json()["paths"]["/metrics"]["get"]
    assert documented["security"] == []
    assert "text/plain" in documented["responses"]["200"]["content"]


def test_metrics_has_no_created_series(client: TestClient) -> None:
    """prometheus-client's `_created` series (one per counter and histogram) are off."""
    assert grab(client, "nope", "u1") == 404  # a counter and a histogram with a value
    text = client.get("/metrics").text
    assert "groupbuy_grab_outcomes_total{" in text
    assert "_created" not in text, [line for line in text.splitlines() if "_created" in line]


def test_lock_outcomes_count_exactly_the_attempts(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team(team_size=3)
    before = scrape(client)
    assert [lock(client, u) for u in ("u1", "u2")] == [201, 201]
    assert lock(client, "u1") == 200  # existing
    assert [lock(client, u) for u in ("u3", "u4", "u5")] == [409, 409, 409]
    assert lock(client, "L") == 409  # the leader is a member
    assert lock(client, "u6", team="missing") == 404
    assert lock(client, "u6", activity="nope") == 404
    after = scrape(client)
    assert deltas(before, after, "groupbuy_lock_outcomes_total", "outcome") == {
        "locked": 2,
        "existing": 1,
        "team_full": 3,
        "already_member": 1,
        "team_not_found": 1,
        "activity_not_found": 1,
    }


def test_join_outcomes_are_lock_outcomes_of_operation_join(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team(team_size=2)
    before = scrape(client)
    assert join(client, "u1") == 201
    assert join(client, "u1") == 200  # existing
    assert join(client, "u2") == 409  # no_team_available
    assert join(client, "u2", activity="nope") == 404
    assert lock(client, "u2") == 409  # a named team: counted apart
    after = scrape(client)
    name = "groupbuy_lock_outcomes_total"
    joins = {
        outcome: value(after, name, operation="join", outcome=outcome)
        - value(before, name, operation="join", outcome=outcome)
        for outcome in ("locked", "existing", "no_team_available", "activity_not_found")
    }
    assert joins == {"locked": 1, "existing": 1, "no_team_available": 1, "activity_not_found": 1}
    assert set(deltas(before, after, name, "operation")) == {"join", "lock"}
    assert (
        value(after, name, operation="lock", outcome="team_full")
        - value(before, name, operation="lock", outcome="team_full")
        == 1
    )


def test_grab_outcomes_count_exactly_the_grabs(client: TestClient) -> None:
    fund(client, "sender", 1000)
    send(client, sender_id="sender", amount_cents=100, count=2, packet_id="p1")
    send(client, sender_id="sender", amount_cents=50, count=5, packet_id="p2", expires_in_s=1)
    before = scrape(client)
    assert grab(client, "p1", "u1") == 200
    assert grab(client, "p1", "u1") == 200  # already_grabbed
    assert grab(client, "p1", "u2") == 200
    assert [grab(client, "p1", u) for u in ("u3", "u4")] == [409, 409]  # sold out
    assert grab(client, "nope", "u1") == 404
    app_services(client).clock.advance(2)
    assert grab(client, "p2", "u1") == 410
    after = scrape(client)
    assert deltas(before, after, "groupbuy_grab_outcomes_total", "outcome") == {
        "grabbed": 2,
        "already_grabbed": 1,
        "sold_out": 2,
        "packet_not_found": 1,
        "expired": 1,
    }


def test_latency_histogram_is_labelled_by_route_template(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team(team_size=3)
    locks = {"method": "POST", "route": LOCKS}
    unmatched = {"method": "GET", "route": "unmatched", "status": "404"}
    before = scrape(client)
    assert lock(client, "u1") == 201
    assert lock(client, "u2") == 201
    assert lock(client, "u3") == 409
    assert client.get("/no/such/route").status_code == 404
    assert client.get("/v1/activities/a/teams/t1/locks/", headers=SERVICE).status_code == 422
    after = scrape(client)
    for labels, rise in (
        ({**locks, "status": "201"}, 2),
        ({**locks, "status": "409"}, 1),
        (unmatched, 1),
        ({"method": "GET", "route": "unmatched", "status": "422"}, 1),
    ):
        assert value(after, HTTP_COUNT, **labels) - value(before, HTTP_COUNT, **labels) == rise
    assert value(
        after,
        "groupbuy_http_request_duration_seconds_bucket",
        le="+Inf",
        **{**locks, "status": "201"},
    ) == value(after, HTTP_COUNT, **locks, status="201")
    routes = {dict(labels).get("route") for _name, labels in after}
    assert not any(r and ("/a/" in r or "t1" in r or "/no/" in r) for r in routes), routes


def test_backend_errors_rise_when_redis_is_down(tmp_path: Path) -> None:
    settings = settings_without_redis(tmp_path)
    with TestClient(create_app(settings)) as client:
        before = scrape(client)  # /metrics answers with Redis down
        created = client.post("/v1/activities", json={"activity_id": "a1"}, headers=ADMIN)
        assert created.status_code == 503 and created.json()["code"] == "redis_unavailable"
        assert lock(client, "u1") == 503
        after = scrape(client)
    assert deltas(before, after, "groupbuy_backend_errors_total", "backend") == {"redis": 2}
    # the lock attempt failed on Redis: counted as an error outcome, not a refusal
    assert deltas(before, after, "groupbuy_lock_outcomes_total", "outcome") == {"error": 1}


def test_backend_errors_count_database_failures() -> None:
    def database_errors() -> float:
        return value(
            parse(metrics.render()[0].decode()), "groupbuy_backend_errors_total", backend="database"
        )

    before = database_errors()
    # The handler tells the app's database that it is away (said once per outage).
    database = SimpleNamespace(reachability=Reachability("db", "database", unavailable))
    app = SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(database=database)))
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "app": app}
    down = sqlalchemy.exc.OperationalError("SELECT 1", {}, ConnectionRefusedError())
    response = asyncio.run(handle_error(Request(scope), down))
    assert response.status_code == 503
    assert database_errors() - before == 1
    assert database.reachability.down


# -- write-behind gauges and jobs ---------------------------------------------------------


async def test_the_backlog_gauges_rise_while_the_flush_keeps_failing(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQL locked or down: the flush fails every round, and the gauges an operator watches
    must still show the records piling up (they were left at their last good value)."""
    packets = services.packets
    await packets.accounts.deposit("sender", 1000, "funds")
    await packets.sending.send("sender", 100, 5, packet_id="p1")
    metrics.WRITEBACK_BACKLOG.labels(engine="packets").set(0)
    for user in ("u1", "u2", "u3"):
        await packets.grabs.grab("p1", user)

    def locked() -> Exception:
        return sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database is locked"))

    fail_writes(monkeypatch, services.database, locked)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        await services.jobs.run("flush_records")
    assert metrics.WRITEBACK_BACKLOG.labels(engine="packets")._value.get() == 3
    assert metrics.WRITEBACK_LAG.labels(engine="packets")._value.get() >= 0


async def test_team_records_have_the_writeback_gauges_and_counter_of_grab_records(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Team records wait in Redis as grab records do: the same gauges and counter show
    them, labelled engine="teams"."""
    from prometheus_client import REGISTRY

    async def sql_away(activity_id: str) -> None:
        """The drain a team call makes before answering fails: records wait in Redis."""

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"engine": "teams"}) or 0.0

    monkeypatch.setattr(services.team_writer, "drain_quietly", sql_away)
    teams = services.teams
    await teams.activities.create_activity("a1", lock_ttl_s=5)
    await teams.activities.open_team("a1", "L1", team_id="t1")
    await teams.activities.open_team("a1", "L2", team_id="t2")
    written = sample("groupbuy_writeback_records_total")
    report = await metrics.update_writeback(services.team_writer, services.redis)
    assert (report["backlog_records"], report["streams"]) == (2, 1), report
    assert sample("groupbuy_writeback_backlog_records") == 2
    assert sample("groupbuy_writeback_backlog_streams") == 1
    assert sample("groupbuy_writeback_lag_seconds") == report["lag_seconds"] >= 0

    flushed = await services.jobs.run("flush_records")
    assert (flushed["team_records"], flushed["backlog"], flushed["lag_s"]) == (2, 0, 0)
    assert sample("groupbuy_writeback_backlog_records") == 0
    assert sample("groupbuy_writeback_backlog_streams") == 0
    assert sample("groupbuy_writeback_records_total") == written + 2


def test_update_writeback_reports_the_backlog_and_zero_after_draining(
    quiet_client: TestClient,
) -> None:
    client, svc = quiet_client, app_services(quiet_client)
    empty = portal(client).call(metrics.update_writeback, svc.packets.writer, svc.redis)
    assert (empty["backlog_records"], empty["lag_seconds"]) == (0, 0.0)
    fund(client, "sender", 1000)
    send(client, sender_id="sender", amount_cents=100, count=5, packet_id="p1")
    send(client, sender_id="sender", amount_cents=100, count=5, packet_id="p2")
    for packet, user in (("p1", "u1"), ("p1", "u2"), ("p2", "u1")):
        assert grab(client, packet, user) == 200
    time.sleep(0.05)  # the oldest record is now at least 50 ms old
    report = portal(client).call(metrics.update_writeback, svc.packets.writer, svc.redis)
    assert report["backlog_records"] == 3, report
    assert report["backlog_records"] == portal(client).call(svc.packets.writer.backlog)
    assert 0.05 <= report["lag_seconds"] < 60, report
    page = scrape(client)
    assert value(page, "groupbuy_writeback_backlog_records", engine="packets") == 3
    assert (
        value(page, "groupbuy_writeback_lag_seconds", engine="packets") >= report["lag_seconds"]
    )  # measured again

    assert portal(client).call(svc.packets.writer.drain_all) == 3
    drained = portal(client).call(metrics.update_writeback, svc.packets.writer, svc.redis)
    assert (drained["backlog_records"], drained["lag_seconds"]) == (0, 0.0), drained
    page = scrape(client)
    assert value(page, "groupbuy_writeback_backlog_records", engine="packets") == 0
    assert value(page, "groupbuy_writeback_lag_seconds", engine="packets") == 0


def test_the_gauges_are_the_backlog_in_redis_at_each_scrape_while_it_drains(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without any job in this process (no scheduler: another process holds the lease), a
    scrape in the middle of a drain shows what Redis holds at that moment, batch after
    batch, down to 0."""
    alone = settings.replace("scheduler", enabled=False)
    with TestClient(create_app(alone)) as client:
        svc, loop = app_services(client), portal(client)
        writer, packet_ids = svc.packets.writer, ["p0", "p1", "p2"]
        fund(client, "sender", 10_000)
        for packet in packet_ids:
            send(client, sender_id="sender", amount_cents=300, count=20, packet_id=packet)
            for n in range(12):
                assert grab(client, packet, f"u{n}") == 200
        monkeypatch.setattr(writer, "_batch_size", 5)  # 3 batches of each: 5, 5, 2
        monkeypatch.setattr("groupbuy.redpacket.writer.LANES", 1)  # a batch at a time
        paused, go = asyncio.Event(), asyncio.Event()
        real_ack = writer.ack
        holding = [True]  # until the checks end, however they end

        async def pausing_ack(packet_id: str, ids: list[str], ended: bool = False) -> int:
            left = await real_ack(packet_id, ids, ended)
            if ids and holding[0]:  # a batch is in SQL: the drain waits while the test scrapes
                paused.set()
                await go.wait()
                go.clear()
            return left

        async def next_pause() -> None:
            await asyncio.wait_for(paused.wait(), 10)
            paused.clear()

        async def in_redis() -> tuple[int, int, int | None, int]:
            """(records, streams with records, ms of the oldest record, Redis's ms now)."""
            streams = [svc.keys.packet_outbox(packet) for packet in packet_ids]
            lengths = [int(await svc.redis.xlen(stream)) for stream in streams]
            firsts = [await svc.redis.xrange(stream, count=1) for stream in streams]
            oldest = [int(first[0][0].split("-")[0]) for first in firsts if first]
            seconds, micros = await svc.redis.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            return sum(lengths), sum(1 for n in lengths if n), min(oldest, default=None), now_ms

        monkeypatch.setattr(writer, "ack", pausing_ack)
        drain = loop.start_task_soon(writer.drain_all)
        seen = []
        try:
            for _batch in range(9):
                loop.call(next_pause)
                records, streams, oldest_ms, before_ms = loop.call(in_redis)
                page = scrape(client)
                after_ms = loop.call(in_redis)[3]
                gauge = value(page, "groupbuy_writeback_backlog_records", engine="packets")
                assert gauge == records, (gauge, records)
                assert (
                    value(page, "groupbuy_writeback_backlog_streams", engine="packets") == streams
                )
                lag = value(page, "groupbuy_writeback_lag_seconds", engine="packets")
                if oldest_ms is None:
                    assert lag == 0
                else:
                    assert (before_ms - oldest_ms) / 1000 <= lag <= (after_ms - oldest_ms) / 1000
                seen.append(gauge)
                loop.call(go.set)
        finally:
            holding[0] = False
            loop.call(go.set)  # a failed check lets the drain end, and the app stop
        assert drain.result(timeout=10) == 36
        # a batch of each packet in turn; the gauge above 0 until the last batch is in SQL
        assert seen == [31, 26, 21, 16, 11, 6, 4, 2, 0]
        page = scrape(client)
    assert value(page, "groupbuy_writeback_backlog_records", engine="packets") == 0
    assert value(page, "groupbuy_writeback_lag_seconds", engine="packets") == 0


def test_a_scrape_answers_when_the_backlog_takes_too_long_to_measure(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    measure = metrics.update_writeback
    released = threading.Event()

    async def stuck(backlog: Any, redis: Any) -> dict[str, Any]:
        # Stuck until the scrape has answered; then the scheduler's flush, which measures
        # too, can end, and the app stops without waiting out the scheduler's stop.
        await asyncio.to_thread(released.wait)
        return await measure(backlog, redis)

    metrics.WRITEBACK_BACKLOG.labels(engine="packets").set(7)
    monkeypatch.setattr(metrics, "update_writeback", stuck)
    monkeypatch.setattr(system, "_MEASURE_WAIT_S", 0.05)
    try:
        page = scrape(client)
    finally:
        released.set()
    assert (
        value(page, "groupbuy_writeback_backlog_records", engine="packets") == 7
    )  # the last measure's
    slow = [r for r in caplog.records if "took over 0.05 s to measure" in r.getMessage()]
    assert [r.levelno for r in slow] == [logging.WARNING]


def test_track_job_counts_ok_and_error_runs_and_times_them() -> None:
    def job_samples() -> tuple[float, float, float]:
        page = parse(metrics.render()[0].decode())
        return (
            value(page, "groupbuy_job_runs_total", job="test_job", result="ok"),
            value(page, "groupbuy_job_runs_total", job="test_job", result="error"),
            value(page, "groupbuy_job_duration_seconds_count", job="test_job"),
        )

    async def job(fail: bool) -> None:
        with metrics.track_job("test_job"):
            await asyncio.sleep(0)
            if fail:
                raise RuntimeError("job failed")

    ok, error, timed = job_samples()
    asyncio.run(job(fail=False))
    asyncio.run(job(fail=False))
    with pytest.raises(RuntimeError, match="job failed"):
        asyncio.run(job(fail=True))
    assert job_samples() == (ok + 2, error + 1, timed + 3)


# -- multiprocess mode ------------------------------------------------------------------


def test_multiprocess_mode_adds_up_the_worker_processes(tmp_path: Path) -> None:
    env = {**os.environ, metrics.MULTIPROC_ENV: str(tmp_path)}
    worker = """
        from groupbuy import metrics
        metrics.LOCK_OUTCOMES.labels(operation="lock", outcome="locked").inc()
        metrics.WRITEBACK_BACKLOG.labels(engine="packets").set(7)
        with metrics.track_job("flush_records"):
            pass
    """
    run_python(worker, env)
    run_python(worker, env)
    scraper = """
        from groupbuy import metrics
        metrics.WRITEBACK_BACKLOG.labels(engine="packets").set(9)
        metrics.process_exited()  # a stopped worker's live gauges no longer count
        body, content_type = metrics.render()
        assert content_type.startswith("text/plain"), content_type
        print(body.decode())
    """
    page = parse(run_python(scraper, env))
    assert value(page, "groupbuy_lock_outcomes_total", operation="lock", outcome="locked") == 2
    assert value(page, "groupbuy_job_runs_total", job="flush_records", result="ok") == 2
    assert value(page, "groupbuy_writeback_backlog_records", engine="packets") == 7
    assert any(path.name.startswith("counter_") for path in tmp_path.iterdir())


def test_multiprocess_dir_is_made_for_workers_and_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(metrics.MULTIPROC_ENV, raising=False)
    with metrics.multiprocess_dir(needed=False) as path:
        assert path is None and metrics.MULTIPROC_ENV not in os.environ
    with metrics.multiprocess_dir(needed=True) as path:
        assert path is not None and os.environ[metrics.MULTIPROC_ENV] == path
        assert Path(path).is_dir()
    assert not Path(path).exists() and metrics.MULTIPROC_ENV not in os.environ
    # a directory the operator chose is used as it is, and kept
    monkeypatch.setenv(metrics.MULTIPROC_ENV, str(tmp_path))
    with metrics.multiprocess_dir(needed=True) as path:
        assert path == str(tmp_path)
    assert tmp_path.is_dir() and os.environ[metrics.MULTIPROC_ENV] == str(tmp_path)


# -- access log ---------------------------------------------------------------------------


def test_access_log_one_line_per_request_with_template_status_and_request_id(
    client: TestClient, caplog: pytest.LogCaptureFixture, opened_team: OpenTeam
) -> None:
    opened_team(team_size=3)
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    caplog.clear()
    r = client.post(
        "/v1/activities/a/teams/t1/locks",
        json={"user_id": "u1"},
        headers={**SERVICE, "X-Request-Id": "req-42.a_B"},
    )
    assert r.status_code == 201 and r.headers["x-request-id"] == "req-42.a_B"
    client.get("/no/such/route")
    records = access_records(caplog)
    assert len(records) == 2, [rec.getMessage() for rec in records]
    first, second = (rec.getMessage() for rec in records)
    assert re.fullmatch(
        rf"POST {re.escape(LOCKS)} 201 locked \d+\.\d\dms activity_id=a team_id=t1 "
        r"client=testclient request_id=req-42\.a_B",
        first,
    )
    assert second.startswith("GET unmatched 404 not_found ") and "/no/such" not in second
    assert records[0].levelno == logging.INFO


def test_an_access_line_names_the_outcome_the_ids_and_the_client(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Both grab answers are a 200: the line tells `grabbed` from `already_grabbed`, and a
    refusal by its code; an id that is no id is not written as it came."""
    fund(client, "sender", 1000)
    send(client, sender_id="sender", amount_cents=100, count=1, packet_id="p1")
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    caplog.clear()
    assert grab(client, "p1", "u1") == 200
    assert grab(client, "p1", "u1") == 200
    assert grab(client, "p1", "u2") == 409
    assert grab(client, "bad%20id%0Aforged", "u2") == 422  # decoded: a space, a newline
    lines = [rec.getMessage() for rec in access_records(caplog)]
    pattern = (
        rf"POST {re.escape(GRAB)} (\d+) (\S+) \d+\.\d\dms packet_id=(\S+) "
        rf"client=testclient request_id={GENERATED_ID.pattern}"
    )
    found = [re.fullmatch(pattern, line) for line in lines]
    assert all(found), lines
    assert [m.groups() for m in found if m] == [
        ("200", "grabbed", "p1"),
        ("200", "already_grabbed", "p1"),
        ("409", "sold_out", "p1"),
        ("422", "invalid_request", "<invalid>"),
    ]


def test_no_access_lines_when_access_log_is_false(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    with TestClient(create_app(settings.replace("log", access_log=False))) as client:
        caplog.clear()
        assert client.get("/healthz").status_code == 200
        assert access_records(caplog) == []
        assert scrape(client)  # the latency histogram is still observed


@pytest.mark.parametrize("given", [None, "", "has space", "x" * 65, "a/b", "é".encode(), "a\tb"])
def test_insane_or_missing_request_ids_are_replaced(
    client: TestClient, caplog: pytest.LogCaptureFixture, given: str | bytes | None
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    # as bytes, so that one mapping type carries both the str and the non-ASCII bytes cases
    raw = given.encode("ascii") if isinstance(given, str) else given
    headers: dict[bytes, bytes] = {} if raw is None else {b"X-Request-Id": raw}
    ids = {client.get("/healthz", headers=headers).headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3 and all(GENERATED_ID.fullmatch(i) for i in ids), ids
    logged = {rec.getMessage().rsplit("request_id=", 1)[1] for rec in access_records(caplog)}
    assert logged == ids
    longest = "A" * 64
    assert (
        client.get("/healthz", headers={"X-Request-Id": longest}).headers["x-request-id"] == longest
    )


def test_no_secret_reaches_any_log_record(
    client: TestClient, caplog: pytest.LogCaptureFixture, opened_team: OpenTeam
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "Bearer wrong-secret-never-logged"
    opened_team(team_size=3)
    assert lock(client, "u1") == 201
    assert client.get("/v1/events", headers={"Authorization": wrong}).status_code == 401
    assert (
        client.post("/v1/activities", json={"activity_id": "b"}, headers=SERVICE).status_code == 403
    )
    malformed = client.post(
        "/v1/activities", content=b"{", headers={**ADMIN, "Content-Type": "application/json"}
    )
    assert malformed.status_code == 422
    assert client.get("/metrics", headers=ADMIN).status_code == 200
    assert len(access_records(caplog)) == 7  # one per request, opened_team's two included
    formatter = logging.Formatter("%(name)s %(message)s")
    for record in caplog.records:
        text = formatter.format(record) + repr(record.__dict__)
        for secret in (ADMIN_KEY, SERVICE_KEY, "wrong-secret-never-logged"):
            assert secret not in text, (secret, text)


def test_json_access_log_lines_parse(settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    with TestClient(create_app(settings)) as client:
        caplog.clear()
        assert client.get("/healthz", headers={"X-Request-Id": "r1"}).status_code == 200
        assert lock(client, "u1") == 404
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(rec)) for rec in access_records(caplog)]
    assert [(line["route"], line["status"], line["method"]) for line in lines] == [
        ("/healthz", 200, "GET"),
        (LOCKS, 404, "POST"),
    ]
    assert lines[0]["request_id"] == "r1" and GENERATED_ID.fullmatch(lines[1]["request_id"])
    assert lines[1]["outcome"] == "activity_not_found" and lines[0]["outcome"] == "-"
    assert (lines[1]["activity_id"], lines[1]["team_id"]) == ("a", "t1")
    base = {"time", "level", "logger", "request_id", "method", "route", "status", "outcome"}
    for line in lines:
        assert set(line) - {"activity_id", "team_id"} == base | {"duration_ms", "client"}
        assert line["level"] == "INFO" and line["logger"] == ACCESS_LOGGER
        assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])


def test_serve_logging_writes_every_line_as_json(tmp_path: Path) -> None:
    """What `groupbuy serve` sets up with [log] format = "json": the access lines and every
    other logger's lines alike are one JSON object each."""
    env = {
        **os.environ,
        "GROUPBUY_LOG_FORMAT": "json",
        "GROUPBUY_API_KEYS": f"admin:{ADMIN_KEY}",
        "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
    }
    env.pop(metrics.MULTIPROC_ENV, None)
    output = run_python(
        """
        import logging
        from starlette.testclient import TestClient
        from groupbuy.cli import app_from_environment
        with TestClient(app_from_environment()) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/metrics").status_code == 200
        logging.getLogger("groupbuy.somewhere").warning("a %s line", "plain")
        """,
        env,
        cwd=tmp_path,
    )
    lines = [json.loads(line) for line in output.splitlines()]
    others = [line for line in lines if line["logger"] != ACCESS_LOGGER]
    assert {
        "time": others[-1]["time"],
        "level": "WARNING",
        "logger": "groupbuy.somewhere",
        "message": "a plain line",
    } == others[-1], output
    assert all("message" in line and "time" in line for line in others), output
    lines = [line for line in lines if line["logger"] == ACCESS_LOGGER]
    assert [line["route"] for line in lines] == ["/healthz", "/metrics"], output
