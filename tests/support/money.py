"""Checks of what SQL says about money: conservation (SPEC §4.4) and row counts."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.redpacket.models import AccountRow, GrabRow, LedgerEntryRow, PacketRow
from groupbuy.services import Services


async def total(session: AsyncSession, query: Select[Any]) -> int:
    """The single number a COALESCE(SUM(...), 0) or COUNT(*) query returns."""
    value = await session.scalar(query)
    assert value is not None, query
    return int(value)


async def assert_money_conserved(services: Services) -> None:
    """SPEC §4.4 at a quiescent point: deposits == balances + money held in active packets."""
    async with services.database.sessions() as session:
        deposits = await total(
            session,
            select(func.coalesce(func.sum(LedgerEntryRow.amount_cents), 0)).where(
                LedgerEntryRow.kind == "deposit"
            ),
        )
        balances = await total(
            session, select(func.coalesce(func.sum(AccountRow.balance_cents), 0))
        )
        held = 0
        for packet in (await session.scalars(select(PacketRow))).all():
            grabbed = await total(
                session,
                select(func.coalesce(func.sum(GrabRow.amount_cents), 0)).where(
                    GrabRow.packet_id == packet.packet_id
                ),
            )
            if packet.status in ("active", "pending"):
                held += packet.amount_cents - grabbed
            elif packet.status in ("expired", "withdrawn"):  # SPEC §4.3 after the refund
                assert grabbed + packet.refunded_cents == packet.amount_cents, packet.packet_id
            else:
                assert grabbed == packet.amount_cents, packet.packet_id
        # every balance is the sum of its entries
        per_user = dict(
            (
                await session.execute(
                    select(LedgerEntryRow.user_id, func.sum(LedgerEntryRow.amount_cents)).group_by(
                        LedgerEntryRow.user_id
                    )
                )
            ).all()
        )
        accounts = dict(
            (await session.execute(select(AccountRow.user_id, AccountRow.balance_cents))).all()
        )
    assert deposits == balances + held, (deposits, balances, held)
    assert {u: b for u, b in accounts.items()} == {u: per_user.get(u, 0) for u in accounts}


async def count(services: Services, model: type, **where: object) -> int:
    """How many rows of a model match the given column values."""
    query = select(func.count()).select_from(model)
    for column, value in where.items():
        query = query.where(getattr(model, column) == value)
    async with services.database.sessions() as session:
        return int(await session.scalar(query) or 0)
