"""Redis over maxmemory: every write answers 503 `redis_out_of_memory` with nothing applied,
reads still answer, and the keep-alive connection survives (a real redis-server)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.exceptions

from groupbuy.api.app import create_app
from groupbuy.services import Services
from tests.support.http import ADMIN
from tests.support.live import KeptAlive, serving
from tests.support.servers import RedisProcess, server_binary, start_redis
from tests.support.settings import settings_for

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        server_binary() is None and not os.environ.get("CI"), reason="needs a server binary"
    ),
]


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    """A server of this test's own: its maxmemory changes."""
    process = start_redis()
    try:
        yield process
    finally:
        process.stop()


def over_maxmemory(server: RedisProcess, on: bool) -> None:
    with redis.Redis(port=server.port) as admin:
        admin.config_set("maxmemory", "1" if on else "0")


def redis_state(server: RedisProcess) -> dict[str, Any]:
    """Every key with its type and content: what a refused call must leave as it was."""
    with redis.Redis(port=server.port, decode_responses=True) as client:
        state: dict[str, Any] = {}
        for key in sorted(client.scan_iter(count=1000)):
            kind = client.type(key)
            if kind == "hash":
                state[key] = client.hgetall(key)
            elif kind == "zset":
                state[key] = client.zrange(key, 0, -1, withscores=True)
            elif kind == "list":
                state[key] = client.lrange(key, 0, -1)
            elif kind == "stream":
                state[key] = client.xrange(key)
            else:
                state[key] = (kind, client.dump(key))
        return state


def test_writes_are_refused_whole_and_reads_answer(server: RedisProcess, database_url: str) -> None:
    settings = settings_for(server.url, database_url).replace("scheduler", enabled=False)
    with serving(create_app(settings)) as port:
        api = KeptAlive(port, ADMIN)
        assert (
            api.call(
                "POST", "/v1/accounts/alice/deposits", {"amount_cents": 10_000, "reference": "d1"}
            )[0]
            == 201
        )
        assert api.call("POST", "/v1/activities", {"activity_id": "a1"})[0] == 201
        assert (
            api.call("POST", "/v1/activities/a1/teams", {"leader_id": "L", "team_id": "t1"})[0]
            == 201
        )
        assert api.call("POST", "/v1/activities/a1/teams/t1/locks", {"user_id": "u1"})[0] == 201
        sent = {"sender_id": "alice", "amount_cents": 1_000, "count": 4, "packet_id": "p1"}
        assert api.call("POST", "/v1/redpackets", sent)[0] == 201
        assert api.call("POST", "/v1/redpackets/p1/grab", {"user_id": "g1"})[0] == 200
        reads = [
            "/v1/activities/a1",
            "/v1/activities/a1/teams/t1",
            "/v1/activities/a1/teams?status=open&has_free_seats=true",
            "/v1/activities/a1/users/u1/lock",
            "/v1/redpackets/p1",
            "/v1/accounts/alice",
            "/v1/events?after=0&limit=1000",
        ]
        before = {path: api.call("GET", path) for path in reads}
        keys_before = redis_state(server)

        over_maxmemory(server, True)
        try:
            writes: list[tuple[str, dict[str, Any]]] = [
                ("/v1/redpackets", {**sent, "packet_id": "p2"}),
                ("/v1/redpackets/p1/grab", {"user_id": "g2"}),
                ("/v1/activities", {"activity_id": "a2"}),
                ("/v1/activities/a1/teams", {"leader_id": "L2", "team_id": "t2"}),
                ("/v1/activities/a1/teams/t1/locks", {"user_id": "u2"}),
                ("/v1/activities/a1/locks", {"user_id": "u3"}),
                ("/v1/activities/a1/teams/t1/members", {"user_id": "u1", "order_id": "o1"}),
            ]
            for path, body in writes:
                status, problem = api.call("POST", path, body)
                assert (status, problem["code"]) == (503, "redis_out_of_memory"), (path, problem)
            status, problem = api.call("DELETE", "/v1/activities/a1/teams/t1/locks/u1")
            assert (status, problem["code"]) == (503, "redis_out_of_memory"), problem
            # A close is refused before SQL is touched: the activity stays open in both.
            status, problem = api.call("PATCH", "/v1/activities/a1", {"status": "closed"})
            assert (status, problem["code"]) == (503, "redis_out_of_memory"), problem
            # Reads answer, the same as before; nothing was written to Redis or SQL.
            assert {path: api.call("GET", path) for path in reads} == before
            assert redis_state(server) == keys_before
            assert api.call("GET", "/v1/redpackets/p2")[0] == 404
            assert api.call("GET", "/v1/activities/a2")[0] == 404
            # A deposit is SQL's alone: it is taken.
            deposit = {"amount_cents": 5, "reference": "d2"}
            assert api.call("POST", "/v1/accounts/bob/deposits", deposit)[0] == 201
        finally:
            over_maxmemory(server, False)

        # Memory is back: the very same calls are applied now, from scratch.
        assert api.call("POST", "/v1/redpackets", {**sent, "packet_id": "p2"})[0] == 201
        assert api.call("GET", "/v1/accounts/alice")[1]["balance_cents"] == 8_000
        assert (
            api.call("POST", "/v1/redpackets/p1/grab", {"user_id": "g2"})[1]["status"] == "grabbed"
        )
        assert api.call("POST", "/v1/activities", {"activity_id": "a2"})[0] == 201
        status, closed = api.call("PATCH", "/v1/activities/a1", {"status": "closed"})
        assert (status, closed["status"]) == (200, "closed")
        api.close()


async def test_a_send_refused_after_its_debit_is_taken_back(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory running out between the admission and the packet: debit, row and event go."""
    packets = services.packets
    await packets.accounts.deposit("alice", 5_000, "d1")
    call = services.scripts.call

    async def refuse_the_packet(name: str, keys: list[str], args: list[Any]) -> list[Any]:
        if name == "packet_create":
            raise redis.exceptions.OutOfMemoryError(
                "command not allowed when used memory > 'maxmemory'."
            )
        return await call(name, keys, args)

    monkeypatch.setattr(services.scripts, "call", refuse_the_packet)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        await packets.sending.send("alice", 1_000, 4, packet_id="p1")
    assert (await packets.accounts.account("alice"))["balance_cents"] == 5_000
    async with services.database.sessions() as session:
        from groupbuy.storage.events import read_events

        assert (await read_events(session, 0, 100))["events"] == []
    monkeypatch.setattr(services.scripts, "call", call)
    again = await packets.sending.send("alice", 1_000, 4, packet_id="p1")
    assert again.created
    assert (await packets.accounts.account("alice"))["balance_cents"] == 4_000
    assert (await packets.reads.get("p1"))["remaining_count"] == 4
