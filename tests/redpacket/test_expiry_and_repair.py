"""Expiry refunds exactly once; a send whose Redis step failed is finished or refunded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.exceptions
from sqlalchemy import select

from groupbuy import errors
from groupbuy.redpacket.models import LedgerEntryRow, PacketRow
from groupbuy.services import Services
from groupbuy.storage.events import EventRow
from tests.support.backends import ALL
from tests.support.fixtures import SendPacketViaServices
from tests.support.money import assert_money_conserved, count

# Also on a 3-master Redis Cluster.
pytestmark = pytest.mark.parametrize("backend", ALL)


async def _events(services: Services, kind: str) -> list[EventRow]:
    async with services.database.sessions() as session:
        return list((await session.scalars(select(EventRow).where(EventRow.type == kind))).all())


async def test_expiry_refunds_exactly_once_from_every_path(
    services: Services, sent_packet_via_services: SendPacketViaServices
) -> None:
    packets = services.packets
    await sent_packet_via_services(600, 6, funds=1000, expires_in_s=60)
    taken = sum([(await packets.grabs.grab("pk", f"u{i}"))["amount_cents"] for i in range(2)])
    assert (await packets.sweeps.expire("pk"))["expired"] is False  # not due yet
    services.clock.advance(60)
    # two schedulers at once, a lazy grab, and repeats
    results = await asyncio.gather(
        packets.sweeps.expire("pk"),
        packets.sweeps.expire_due(),
        packets.grabs.grab("pk", "late"),
        return_exceptions=True,
    )
    assert sum(isinstance(r, errors.Expired) for r in results) == 1
    await packets.sweeps.expire("pk")
    await packets.sweeps.expire_due()
    await packets.writer.drain_all()
    refunds = await count(services, LedgerEntryRow, kind="refund_credit")
    assert refunds == 1
    assert (await packets.accounts.account("sender"))["balance_cents"] == 1000 - 600 + (600 - taken)
    assert len(await _events(services, "packet.refunded")) == 1
    body = await packets.reads.get("pk")
    assert body["status"] == "expired" and body["refunded_cents"] == 600 - taken
    assert sum(g["amount_cents"] for g in body["grabs"]) + body["refunded_cents"] == 600
    await assert_money_conserved(services)


async def test_expire_due_only_touches_due_packets(services: Services) -> None:
    packets = services.packets
    await packets.accounts.deposit("sender", 1000, "funds")
    await packets.sending.send("sender", 100, 2, packet_id="soon", expires_in_s=10)
    await packets.sending.send("sender", 100, 2, packet_id="later", expires_in_s=100)
    await packets.sending.send("sender", 100, 1, packet_id="sold", expires_in_s=10)
    await packets.grabs.grab("sold", "u1")
    services.clock.advance(10)
    assert await packets.sweeps.expire_due() == {
        "due": 1,
        "expired": 1,
    }  # "sold" left when sold out
    await packets.writer.drain_all()
    assert (await packets.reads.get("later"))["status"] == "active"
    assert (await packets.reads.get("soon"))["status"] == "expired"
    assert (await packets.reads.get("sold"))["status"] == "sold_out"
    assert await packets.sweeps.expire_due() == {"due": 0, "expired": 0}
    await assert_money_conserved(services)


@pytest.fixture
def redis_step_fails(services: Services, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The next packet_create calls fail as if Redis were unreachable."""
    real = services.scripts.call
    failures = {"left": 1}

    async def call(name: str, keys: list[str], args: list[Any]) -> Any:
        if name == "packet_create" and failures["left"]:
            failures["left"] -= 1
            raise redis.exceptions.ConnectionError("Redis went away")
        return await real(name, keys, args)

    monkeypatch.setattr(services.scripts, "call", call)
    return failures


async def send_that_fails_in_redis(services: Services, expires_in_s: int | None = None) -> None:
    """Fund the sender and send "pk" while its Redis step fails (after the SQL commit)."""
    await services.packets.accounts.deposit("sender", 500, "funds")
    with pytest.raises(redis.exceptions.ConnectionError):
        await services.packets.sending.send(
            "sender", 300, 3, packet_id="pk", expires_in_s=expires_in_s
        )


async def test_a_failed_redis_step_is_finished_by_the_repair(
    services: Services, redis_step_fails: dict[str, int]
) -> None:
    packets = services.packets
    await send_that_fails_in_redis(services)
    # The money left the sender in the same transaction that recorded the packet.
    assert (await packets.accounts.account("sender"))["balance_cents"] == 200
    assert await packets.sending.repair_pending() == {"pending": 1, "made_live": 1, "refunded": 0}
    assert (await packets.reads.get("pk"))["status"] == "active"
    assert (await packets.grabs.grab("pk", "u1"))["status"] == "grabbed"
    assert await packets.sending.repair_pending() == {"pending": 0, "made_live": 0, "refunded": 0}
    await packets.writer.drain_all()
    await assert_money_conserved(services)


async def test_a_client_retry_finishes_the_send(
    services: Services, redis_step_fails: dict[str, int]
) -> None:
    packets = services.packets
    await send_that_fails_in_redis(services)
    again = await packets.sending.send("sender", 300, 3, packet_id="pk")
    assert not again.created and again.body["status"] == "active"
    assert (await packets.accounts.account("sender"))["balance_cents"] == 200  # debited once
    assert (await packets.grabs.grab("pk", "u1"))["status"] == "grabbed"


async def test_a_grab_finishes_the_send_too(
    services: Services, redis_step_fails: dict[str, int]
) -> None:
    packets = services.packets
    await send_that_fails_in_redis(services)
    assert (await packets.grabs.grab("pk", "u1"))["status"] == "grabbed"


async def test_a_send_that_never_reached_redis_is_refunded_after_its_expiry(
    services: Services, redis_step_fails: dict[str, int]
) -> None:
    packets = services.packets
    await send_that_fails_in_redis(services, expires_in_s=5)
    services.clock.advance(5)
    assert await packets.sending.repair_pending() == {"pending": 1, "made_live": 0, "refunded": 1}
    assert await packets.sending.repair_pending() == {"pending": 0, "made_live": 0, "refunded": 0}
    assert (await packets.accounts.account("sender"))["balance_cents"] == 500
    body = await packets.reads.get("pk")
    assert body["status"] == "expired" and body["refunded_cents"] == 300 and body["grabs"] == []
    with pytest.raises(errors.Expired):
        await packets.grabs.grab("pk", "u1")
    assert len(await _events(services, "packet.refunded")) == 1
    async with services.database.sessions() as session:
        row = await session.get(PacketRow, "pk")
    assert row is not None and row.records_done
    await assert_money_conserved(services)


async def test_concurrent_sends_never_overdraw(services: Services) -> None:
    packets = services.packets
    await packets.accounts.deposit("sender", 1000, "funds")
    results = await asyncio.gather(
        *(packets.sending.send("sender", 300, 3, packet_id=f"pk{i}") for i in range(6)),
        return_exceptions=True,
    )
    sent = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, errors.InsufficientFunds)]
    assert len(sent) == 3 and len(refused) == 3
    assert (await packets.accounts.account("sender"))["balance_cents"] == 100
    await assert_money_conserved(services)
