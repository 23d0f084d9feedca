"""Several `groupbuy serve` processes on one Redis and one database, called as a load
balancer calls them: round-robin over the live ones, a call that could not be answered
sent again to the next one (every mutating call is idempotent, SPEC §4.8)."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.http import ADMIN, SERVICE
from tests.support.service import Service, service_environment, start_service
from tests.support.settings import TEST_RATE_LIMITS


def replica_environment(
    directory: Path, redis_url: str, database_url: str, **more: str
) -> dict[str, str]:
    """The environment of one replica: the shared Redis and database, the tests' keys and
    per-user rate limits, and `more` GROUPBUY_* variables."""
    return service_environment(
        directory,
        GROUPBUY_REDIS_URL=redis_url,
        GROUPBUY_DATABASE_URL=database_url,
        **TEST_RATE_LIMITS,
        **more,
    )


@dataclass
class Replica:
    """One `groupbuy serve` process and an HTTP client of its own."""

    name: str
    service: Service
    client: httpx.AsyncClient

    @property
    def alive(self) -> bool:
        return self.service.process.poll() is None

    def stop(self) -> int:
        """SIGTERM, as an orchestrator stops a replica: it finishes the calls it has, releases
        the lease and exits; its exit code."""
        return self.service.stop()

    def kill(self) -> None:
        """kill -9: no graceful stop, no lease released, SQL transactions cut midway."""
        self.service.process.send_signal(signal.SIGKILL)
        self.service.process.wait()

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """This process's /metrics: (sample name, sorted labels) -> value."""
        response = await self.client.get("/metrics")
        assert response.status_code == 200, (self.name, response.status_code)
        samples = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    async def latency(self, route: str) -> tuple[float, int]:
        """(seconds spent, requests) answering POSTs of this route template."""
        spent, requests = 0.0, 0
        for (name, labels), value in (await self.metrics()).items():
            found = dict(labels)
            if found.get("route") != route or found.get("method") != "POST":
                continue
            if name == "groupbuy_http_request_duration_seconds_sum":
                spent += value
            elif name == "groupbuy_http_request_duration_seconds_count":
                requests += int(value)
        return spent, requests

    async def job_runs(self) -> Counter[tuple[str, str]]:
        """(job, result) -> how many times this process ran it."""
        runs: Counter[tuple[str, str]] = Counter()
        for (name, labels), value in (await self.metrics()).items():
            if name == "groupbuy_job_runs_total":
                found = dict(labels)
                runs[found["job"], found["result"]] = int(value)
        return runs

    async def holds_lease(self) -> bool:
        """Whether this process says it holds the scheduler lease (runs the jobs)."""
        return (await self.metrics())[("groupbuy_scheduler_leader", ())] == 1


@dataclass
class Answer:
    """The answer a call ended with, after any resends, and what happened on the way."""

    status: int
    body: Any
    replica: str
    # an earlier attempt was cut off after it was sent: it may have been applied
    uncertain: bool = False


@dataclass
class ReplicaSet:
    """The replicas, called round-robin; records every 5xx answer. `add` starts one more
    (as an orchestrator replaces one that died) in `directory` with `environment`."""

    replicas: list[Replica]
    directory: Path
    environment: dict[str, str]
    errors: list[str] = field(default_factory=list)
    # calls a replica did not answer, by replica and how: refused (never sent, so never
    # applied) or lost (sent, no answer: maybe applied)
    cut_off: Counter[tuple[str, str]] = field(default_factory=Counter)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def live(self) -> list[Replica]:
        return [replica for replica in self.replicas if replica.alive]

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] = SERVICE,
        give_up_s: float = 60,
    ) -> Answer:
        """Send the call to the next live replica; when it cannot answer, to the next one.

        A load balancer keeps trying while a replica is being replaced: on a loaded
        machine the one left may take a while to answer, so tries are bounded by time.
        """
        uncertain = False
        failures: Counter[str] = Counter()
        deadline = time.monotonic() + give_up_s
        while time.monotonic() < deadline:
            live = self.live()
            assert live, "every replica is gone"
            replica = live[next(self._turn) % len(live)]
            try:
                response = await replica.client.request(method, path, json=body, headers=headers)
            except httpx.ConnectError:
                self.cut_off[replica.name, "refused"] += 1
                failures[f"{replica.name} refused"] += 1
                await asyncio.sleep(0.02)
                continue
            except httpx.TransportError as error:
                self.cut_off[replica.name, "lost"] += 1
                failures[f"{replica.name} {type(error).__name__}"] += 1
                uncertain = True
                await asyncio.sleep(0.02)
                continue
            try:
                parsed = response.json()
            except ValueError:
                parsed = response.text
            if response.status_code >= 500:
                self.errors.append(
                    f"{replica.name} {method} {path}: {response.status_code} {parsed}"
                )
            return Answer(response.status_code, parsed, replica.name, uncertain)
        raise AssertionError(f"{method} {path}: no replica answered in {give_up_s} s: {failures}")

    async def must(
        self, method: str, path: str, body: Any, status: int, headers: dict[str, str] = SERVICE
    ) -> Any:
        """A call that must answer `status`; returns the body."""
        answer = await self.call(method, path, body, headers)
        assert answer.status == status, (method, path, answer)
        return answer.body

    async def run_job(self, replica: Replica, job: str) -> Any:
        """Run a job now in that replica; its report."""
        response = await replica.client.post(f"/v1/admin/jobs/{job}/run", headers=ADMIN)
        assert response.status_code == 200, (replica.name, job, response.text)
        return response.json()

    async def add(self, ready_s: float = 60) -> Replica:
        """Start one more replica; it takes calls once it answers /readyz 200."""
        replica = await _launch(self.directory, f"replica{len(self.replicas)}", self.environment)
        try:
            await _ready(replica, ready_s)
        except BaseException:
            await replica.client.aclose()
            replica.stop()
            raise
        self.replicas.append(replica)  # the list only grows: names stay unique
        return replica

    async def aclose(self) -> None:
        for replica in self.replicas:
            await replica.client.aclose()


async def _launch(
    directory: Path, name: str, environment: dict[str, str], ready_s: float = 60
) -> Replica:
    """Start a replica in a directory of its own (in a thread: the start polls /healthz)."""

    def start() -> Service:
        home = directory / name
        home.mkdir()
        env = {**environment, "GROUPBUY_EMBEDDED_DATA_DIR": str(home / "data")}
        return start_service(home, env=env, ready_s=ready_s)

    service = await asyncio.to_thread(start)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    client = httpx.AsyncClient(base_url=service.url, timeout=30, limits=limits)
    return Replica(name, service, client)


async def _ready(replica: Replica, ready_s: float) -> None:
    deadline = time.monotonic() + ready_s
    while (await replica.client.get("/readyz")).status_code != 200:
        assert time.monotonic() < deadline, f"{replica.name} not ready:\n{replica.service.text()}"
        await asyncio.sleep(0.1)


async def start_replicas(
    directory: Path, count: int, environment: dict[str, str], ready_s: float = 60
) -> ReplicaSet:
    """Start `count` replicas at once; returns them once every one answers /readyz 200."""
    started = await asyncio.gather(
        *(_launch(directory, f"replica{i}", environment, ready_s) for i in range(count)),
        return_exceptions=True,
    )
    replicas = ReplicaSet([r for r in started if isinstance(r, Replica)], directory, environment)
    try:
        for failure in started:
            if not isinstance(failure, Replica):
                raise failure
        for replica in replicas.replicas:
            await _ready(replica, ready_s)
    except BaseException:
        await replicas.aclose()
        stop_replicas(replicas)
        raise
    return replicas


def stop_replicas(replicas: ReplicaSet) -> list[str]:
    """SIGTERM each live replica and wait for it; the output of those that did not exit 0."""
    failed = []
    for replica in replicas.replicas:
        if not replica.alive:
            continue
        code = replica.stop()
        if code != 0:
            failed.append(f"{replica.name} exited {code}:\n{replica.service.text()[-3000:]}")
    return failed
