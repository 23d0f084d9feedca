"""Per-sender daily caps (SPEC §3, `[redpackets] sender_daily_amount_cents` and
`sender_daily_count`): a send that would pass either within the UTC day is refused with
409 limit_exceeded and nothing applied, decided atomically in Redis before money moves."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select
from starlette.testclient import TestClient

from groupbuy import errors
from groupbuy.redpacket.models import PacketRow
from groupbuy.services import Services
from groupbuy.settings import Settings
from tests.support.http import SERVICE, assert_ok, assert_problem, deposit, send
from tests.support.settings import settings_for

DAILY_COUNT = 3
DAILY_AMOUNT = 1_000
DAY_S = 86_400


@pytest.fixture
def settings(redis_url: str, database_url: str) -> Settings:
    """The tests' settings with both caps set (the `services` and `client` fixtures use it)."""
    base = settings_for(redis_url, database_url)
    caps = {"sender_daily_count": DAILY_COUNT, "sender_daily_amount_cents": DAILY_AMOUNT}
    return base.model_copy(update={"redpackets": base.redpackets.model_copy(update=caps)})


async def balance(services: Services, user: str) -> int:
    return int((await services.packets.accounts.account(user))["balance_cents"])


async def packets_of(services: Services, sender: str) -> int:
    async with services.database.sessions() as session:
        query = select(func.count()).where(PacketRow.sender_id == sender)
        return int(await session.scalar(query) or 0)


async def test_the_count_cap_refuses_with_nothing_applied(services: Services) -> None:
    packets = services.packets
    await packets.accounts.deposit("s", 10_000, "funds")
    for i in range(DAILY_COUNT):
        assert (await packets.sending.send("s", 10, 1, packet_id=f"p{i}")).created
    with pytest.raises(errors.LimitExceeded) as refused:
        await packets.sending.send("s", 10, 1, packet_id="p-over")
    assert refused.value.extra == {"limit": "sender_daily_count", "current": 3, "cap": 3}
    assert await balance(services, "s") == 10_000 - 30
    assert await packets_of(services, "s") == DAILY_COUNT
    # The same send again is answered, not counted again; another send still is refused.
    assert not (await packets.sending.send("s", 10, 1, packet_id="p0")).created
    with pytest.raises(errors.Conflict):
        await packets.sending.send("s", 11, 1, packet_id="p1")
    with pytest.raises(errors.LimitExceeded):
        await packets.sending.send("s", 10, 1)
    # A new UTC day starts from nothing (and a repeat of yesterday's send is still answered).
    services.clock.advance(DAY_S)
    assert not (await packets.sending.send("s", 10, 1, packet_id="p0")).created
    for i in range(DAILY_COUNT):
        assert (await packets.sending.send("s", 10, 1, packet_id=f"q{i}")).created
    with pytest.raises(errors.LimitExceeded):
        await packets.sending.send("s", 10, 1, packet_id="q-over")
    # Each sender has caps of their own.
    await packets.accounts.deposit("t", 100, "funds-t")
    assert (await packets.sending.send("t", 10, 1)).created


async def test_the_amount_cap_counts_every_cent_of_the_day(services: Services) -> None:
    packets = services.packets
    await packets.accounts.deposit("s", 10_000, "funds")
    assert (await packets.sending.send("s", 600, 6, packet_id="a")).created
    with pytest.raises(errors.LimitExceeded) as refused:
        await packets.sending.send("s", 401, 1, packet_id="b")
    assert refused.value.extra == {
        "limit": "sender_daily_amount_cents",
        "current": 600,
        "cap": DAILY_AMOUNT,
    }
    assert (await packets.sending.send("s", 400, 4, packet_id="c")).created  # exactly at the cap
    assert await balance(services, "s") == 10_000 - 1_000
    day_keys = await services.redis.keys(services.keys.sender_day("s", 0).rsplit(":", 1)[0] + ":*")
    assert len(day_keys) == 1
    ttl_ms = await services.redis.pttl(day_keys[0])
    assert 0 < ttl_ms <= (DAY_S + 3_600) * 1000  # gone a little after its day


async def test_a_send_that_did_not_happen_is_not_counted(services: Services) -> None:
    packets = services.packets
    await packets.accounts.deposit("s", 10, "funds")
    assert (await packets.sending.send("s", 10, 1, packet_id="a")).created
    for i in range(DAILY_COUNT + 2):
        with pytest.raises(errors.InsufficientFunds):
            await packets.sending.send("s", 10, 1, packet_id=f"broke{i}")
    await packets.accounts.deposit("s", 100, "more")
    assert (await packets.sending.send("s", 10, 1, packet_id="b")).created
    assert (await packets.sending.send("s", 10, 1, packet_id="c")).created
    with pytest.raises(errors.LimitExceeded):
        await packets.sending.send("s", 10, 1, packet_id="d")


@pytest.mark.real
@pytest.mark.parametrize("backend", ["real"])
async def test_parallel_sends_never_pass_the_caps(services: Services) -> None:
    packets = services.packets
    await packets.accounts.deposit("s", 100_000, "funds")

    async def attempt(i: int, amount: int) -> str:
        try:
            await packets.sending.send("s", amount, 1, packet_id=f"c{amount}-{i}")
        except errors.LimitExceeded as refused:
            return str(refused.extra["limit"])
        return "sent"

    # 50 at once, 10 cents each: the count cap (3) holds.
    outcomes = await asyncio.gather(*(attempt(i, 10) for i in range(50)))
    assert outcomes.count("sent") == DAILY_COUNT
    assert outcomes.count("sender_daily_count") == 50 - DAILY_COUNT
    assert await balance(services, "s") == 100_000 - DAILY_COUNT * 10
    assert await packets_of(services, "s") == DAILY_COUNT

    # The next day, 50 at once of 300 cents: the amount cap (1,000) holds first.
    services.clock.advance(DAY_S)
    outcomes = await asyncio.gather(*(attempt(i, 300) for i in range(50)))
    assert outcomes.count("sent") == 3
    assert outcomes.count("sender_daily_amount_cents") == 47
    assert await balance(services, "s") == 100_000 - DAILY_COUNT * 10 - 900


def test_limit_exceeded_over_http(client: TestClient) -> None:
    assert_ok(deposit(client, "s", 5_000, "funds"), 201)
    assert_ok(send(client, sender_id="s", amount_cents=900, count=3, packet_id="big"), 201)
    refused = send(client, sender_id="s", amount_cents=200, count=2, packet_id="over")
    body = assert_problem(refused, 409, "limit_exceeded")
    assert (body["limit"], body["current"], body["cap"]) == ("sender_daily_amount_cents", 900, 1000)
    assert assert_ok(client.get("/v1/accounts/s", headers=SERVICE), 200)["balance_cents"] == 4_100
    assert_ok(send(client, sender_id="s", amount_cents=900, count=3, packet_id="big"), 200)


async def test_a_resent_admission_is_still_taken_back(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Redis client resends a call whose reply it lost: the resend must still know the
    count is this send's, so a send that then fails in SQL takes it back."""
    scripts, call = services.scripts, services.scripts.call

    async def resending(name: str, keys: list[str], args: list[Any]) -> list[Any]:
        if name == "packet_admit":
            await call(name, keys, args)  # the first run, whose reply never arrived
        return await call(name, keys, args)

    monkeypatch.setattr(scripts, "call", resending)
    packets = services.packets
    for i in range(DAILY_COUNT + 1):
        with pytest.raises(errors.InsufficientFunds):
            await packets.sending.send("s", 10, 1, packet_id=f"broke{i}")
    await packets.accounts.deposit("s", 100, "funds")
    for i in range(DAILY_COUNT):
        assert (await packets.sending.send("s", 10, 1, packet_id=f"p{i}")).created
    with pytest.raises(errors.LimitExceeded):
        await packets.sending.send("s", 10, 1, packet_id="over")
