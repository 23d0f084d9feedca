"""Three `groupbuy serve` replicas on PostgreSQL and a real Redis deliver one endpoint's
events; the replica holding deliveries in flight is killed with SIGKILL mid-attempt. Its
claims expire, another replica takes them: every event arrives, the killed replica's ones
again under the same webhook-id, and no event is answered 200 twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.database import start_postgres_or_skip
from tests.support.http import ADMIN
from tests.support.receiver import Receiver, arrived, local_ports, running_receiver
from tests.support.replicas import replica_environment, start_replicas, stop_replicas
from tests.support.servers import RedisProcess, start_redis
from tests.support.service import run_groupbuy
from tests.support.starting import NO_REDIS, started_or_skip
from tests.support.webhooks import verified

PACKETS = 20
IN_FLIGHT = 4

pytestmark = [pytest.mark.postgres, pytest.mark.real, pytest.mark.slow]


@pytest.fixture
def postgres_url() -> Iterator[str]:
    server = start_postgres_or_skip()
    try:
        yield server.create_database("hooks")
    finally:
        server.stop()


@pytest.fixture
def redis_server() -> Iterator[RedisProcess]:
    server = started_or_skip(start_redis, NO_REDIS)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hanging() -> Iterator[Receiver]:
    yield from running_receiver()


async def test_a_replica_killed_mid_attempt_leaves_its_deliveries_to_another(
    tmp_path: Path, postgres_url: str, redis_server: RedisProcess, hanging: Receiver
) -> None:
    hanging.hang_s = 60.0
    hanging.answer_with(default="hang")
    environment = replica_environment(
        tmp_path,
        redis_server.url,
        postgres_url,
        GROUPBUY_WEBHOOKS_ALLOW_HTTP="true",
        GROUPBUY_WEBHOOKS_ALLOW_PRIVATE_NETWORKS="true",
        GROUPBUY_WEBHOOKS_TIMEOUT_S="5",
        GROUPBUY_WEBHOOKS_CLAIM_MARGIN_S="1",
        GROUPBUY_WEBHOOKS_MAX_IN_FLIGHT=str(IN_FLIGHT),
        GROUPBUY_WEBHOOKS_POLL_INTERVAL_S="0.05",
    )
    upgraded = await asyncio.to_thread(run_groupbuy, tmp_path, environment, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    replicas = await start_replicas(tmp_path, 3, environment)
    try:
        first = replicas.replicas[0].client
        created = await first.post(
            "/v1/admin/webhooks",
            json={"endpoint_id": "shop", "url": hanging.url, "event_types": ["packet.sent"]},
            headers=ADMIN,
        )
        assert created.status_code == 201, created.text
        secret = created.json()["secret"]
        deposit = {"amount_cents": 100_000, "reference": "r1"}
        answer = await first.post("/v1/accounts/alice/deposits", json=deposit, headers=ADMIN)
        assert answer.status_code == 201, answer.text
        for n in range(PACKETS):
            packet = {"sender_id": "alice", "amount_cents": 100, "count": 1, "packet_id": f"p{n}"}
            sent = await replicas.call("POST", "/v1/redpackets", packet)
            assert sent.status == 201, sent.body

        # Every slot of the endpoint is in flight, hanging at the receiver.
        in_flight = await arrived(hanging, IN_FLIGHT, timeout_s=30)
        owners = {r.name: local_ports(r.service.process.pid) for r in replicas.replicas}
        victim_name = next(n for n, ports in owners.items() if in_flight[0].client_port in ports)
        victim = next(r for r in replicas.replicas if r.name == victim_name)
        held = {r.headers["webhook-id"] for r in in_flight if r.client_port in owners[victim_name]}
        victim.kill()
        hanging.answer_with(default="200")

        deadline = time.monotonic() + 90
        while True:
            answered = [r for r in hanging.received if r.answer == "200"]
            if len({r.headers["webhook-id"] for r in answered}) >= PACKETS:
                break
            assert time.monotonic() < deadline, f"{len(answered)} of {PACKETS} delivered"
            await asyncio.sleep(0.1)
        live = replicas.live()[0].client

        async def listed_delivered() -> set[str]:
            delivered: set[str] = set()
            cursor = None
            while True:
                params = {
                    "status": "delivered",
                    "limit": "100",
                    **({"cursor": cursor} if cursor else {}),
                }
                page = (
                    await live.get(
                        "/v1/admin/webhooks/shop/deliveries", params=params, headers=ADMIN
                    )
                ).json()
                delivered |= {d["webhook_id"] for d in page["deliveries"]}
                cursor = page["next_cursor"]
                if cursor is None:
                    return delivered

        # The receiver has answered every one; their outcomes are recorded by the
        # deliverers' next passes: wait for the listing to show them.
        while len(delivered := await listed_delivered()) < PACKETS:
            assert time.monotonic() < deadline, f"{len(delivered)} of {PACKETS} recorded"
            await asyncio.sleep(0.1)
        events = (await live.get("/v1/events?limit=1000", headers=ADMIN)).json()["events"]
    finally:
        await replicas.aclose()
        failed = stop_replicas(replicas)
    assert not failed, failed
    feed_ids = {f"evt_{e['id']}" for e in events if e["type"] == "packet.sent"}
    assert len(feed_ids) == PACKETS and delivered == feed_ids
    ok = Counter(r.headers["webhook-id"] for r in hanging.received if r.answer == "200")
    assert set(ok) == feed_ids and set(ok.values()) == {1}  # at least once, never twice
    attempts = Counter(r.headers["webhook-id"] for r in hanging.received)
    assert held and all(attempts[webhook_id] >= 2 for webhook_id in held)
    packets = {
        verified(secret, r)["data"]["data"]["packet_id"]
        for r in hanging.received
        if r.answer == "200"
    }
    assert packets == {f"p{n}" for n in range(PACKETS)}
