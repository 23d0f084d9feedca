"""A grab resent by the Redis client after a stall answers what its first run did.

When Redis's reply takes longer than the socket timeout, the client gives up on the
connection and sends the EVALSHA again on a new one, yet the first call did run. A proxy
holds the replies of the first calls until the client resends, through the client and
the coalescing layer the service builds for itself (SPEC §4.5, §4.8).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from sqlalchemy import select

from groupbuy.redpacket.models import GrabRow, LedgerEntryRow
from groupbuy.services import Services, build_services
from groupbuy.settings import load_settings
from groupbuy.storage.db import Database
from tests.support.proxy import FaultyProxy, faulty_proxy
from tests.support.settings import API_KEYS

pytestmark = [pytest.mark.real]

GRABBERS = 200
SOCKET_TIMEOUT_S = 0.5


@pytest.fixture(params=["auto_pipeline", "plain"])
async def behind_proxy(
    request: pytest.FixtureRequest, real_redis_url: str, database_url: str
) -> AsyncIterator[tuple[Services, FaultyProxy, aioredis.Redis]]:
    """The services as production wires them (their own Redis client, retries and, unless
    `plain`, the coalescing layer), talking to the real server through a proxy."""
    direct = aioredis.Redis.from_url(real_redis_url, decode_responses=True)
    await direct.flushall()
    async with faulty_proxy(real_redis_url) as proxy:
        settings = load_settings(
            None,
            {
                "GROUPBUY_API_KEYS": API_KEYS,
                "GROUPBUY_DATABASE_URL": database_url,
                "GROUPBUY_REDIS_URL": proxy.url,
                "GROUPBUY_REDIS_SOCKET_TIMEOUT_S": str(SOCKET_TIMEOUT_S),
                "GROUPBUY_REDIS_AUTO_PIPELINE": str(request.param == "auto_pipeline").lower(),
            },
        )
        database = Database(settings.database.effective_url)
        services = build_services(settings, database=database)
        await services.scripts.load()
        try:
            yield services, proxy, direct
        finally:
            await services.scripts.aclose()
            await services.redis.aclose()
            await database.dispose()
            await direct.aclose()


async def test_grabs_resent_after_a_stall_answer_grabbed_once_each(
    behind_proxy: tuple[Services, FaultyProxy, aioredis.Redis],
) -> None:
    services, proxy, direct = behind_proxy
    packets = services.packets
    await packets.accounts.deposit("sender", 20_000 + GRABBERS, "funds")
    await packets.sending.send("sender", 20_000, GRABBERS, packet_id="stalled")
    grabs_key = services.keys.packet_keys("stalled").grabs
    # Open the connections the stalled calls will use (a new connection's handshake would
    # be held too, and its call would never reach Redis).
    await packets.sending.send("sender", GRABBERS, GRABBERS, packet_id="warm-up")
    await asyncio.gather(*(packets.grabs.grab("warm-up", f"w{i}") for i in range(GRABBERS)))

    # Every reply is held: the first runs happen in Redis, their answers do not arrive.
    proxy.stall()
    users = [f"u{i}" for i in range(GRABBERS)]
    calls = asyncio.gather(*(packets.grabs.grab("stalled", user) for user in users))
    for _poll in range(40):  # well within the socket timeout
        if await direct.hlen(grabs_key) == GRABBERS:
            break
        await asyncio.sleep(0.01)
    assert await direct.hlen(grabs_key) == GRABBERS
    connections_before = proxy.connections
    # Replies on new connections pass again; the held ones stay held, so the client times
    # out and resends every call on a new connection.
    proxy.stall(False)
    answers = dict(zip(users, await calls, strict=True))

    assert proxy.connections > connections_before  # the calls really were resent
    assert {a["status"] for a in answers.values()} == {"grabbed"}
    assert sum(a["amount_cents"] for a in answers.values()) == 20_000
    assert sorted(a["remaining_count"] for a in answers.values()) == list(range(GRABBERS))

    # Each grabbed answer is one grab row and one ledger credit of the answered amount.
    await packets.writer.drain_all()
    async with services.database.sessions() as session:
        rows = (await session.scalars(select(GrabRow).where(GrabRow.packet_id == "stalled"))).all()
        credits = (
            await session.scalars(
                select(LedgerEntryRow).where(
                    LedgerEntryRow.kind == "grab_credit",
                    LedgerEntryRow.business_key.like("grab:stalled:%"),
                )
            )
        ).all()
    assert {r.user_id: r.amount_cents for r in rows} == {
        u: a["amount_cents"] for u, a in answers.items()
    }
    assert len(rows) == GRABBERS
    assert sorted((c.user_id, c.amount_cents) for c in credits) == sorted(
        (u, a["amount_cents"]) for u, a in answers.items()
    )
