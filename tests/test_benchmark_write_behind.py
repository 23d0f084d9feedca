"""The write-behind benchmark's baseline (benchmarks/write_behind.py): the raw driver must
write the rows the write-behind writes, or the ratio compares different work."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from groupbuy_client.wire import from_ms
from sqlalchemy import insert, select

from benchmarks.write_behind import write_raw
from groupbuy.redpacket.models import AccountRow, GrabRow, LedgerEntryRow, PacketRow
from groupbuy.redpacket.recording import apply_packet_records
from groupbuy.redpacket.records import packet_event_key, parse_packet_record
from groupbuy.storage.db import Database
from groupbuy.storage.events import EventRow

AT_MS = 1_764_700_000_123  # when the records happened (a time with milliseconds)
FRESH = "raw-"  # the baseline's prefix on packet and user ids


def _records() -> list[Any]:
    """A packet's stream: two grabs, then its sale's end."""
    grab = {"type": "grab", "at_ms": str(AT_MS), "packet_id": "p1", "epoch": "0"}
    return [
        parse_packet_record({**grab, "user_id": "u1", "amount_cents": "30", "seq": "1"}),
        parse_packet_record({**grab, "user_id": "u2", "amount_cents": "70", "seq": "2"}),
        parse_packet_record({"type": "packet.sold_out", "at_ms": str(AT_MS + 1),
                             "packet_id": "p1", "sender_id": "s1", "version": "3"}),
    ]  # fmt: skip


async def _packet(db: Database, packet_id: str) -> None:
    at = from_ms(AT_MS - 1000)
    async with db.transaction() as session:
        await session.execute(insert(PacketRow), [{"packet_id": packet_id, "sender_id": "s1",
            "amount_cents": 100, "count": 2, "strategy": "equal", "expires_in_s": 60,
            "status": "active", "created_at": at, "expires_at": at}])  # fmt: skip


async def _written(db: Database, packet_id: str, users: list[str]) -> dict[str, Any]:
    """What SQL holds of one packet and its grabbers, ids without the baseline's prefix."""
    ledger, sold_out = LedgerEntryRow, packet_event_key("packet.sold_out", packet_id)
    async with db.sessions() as session:
        grabs = (await session.execute(select(GrabRow.user_id, GrabRow.seq, GrabRow.amount_cents,
            GrabRow.grabbed_at).where(GrabRow.packet_id == packet_id)
            .order_by(GrabRow.seq))).all()  # fmt: skip
        entries = (await session.execute(select(ledger.business_key, ledger.user_id, ledger.kind,
            ledger.amount_cents, ledger.balance_after_cents, ledger.created_at)
            .where(ledger.user_id.in_(users)).order_by(ledger.id))).all()  # fmt: skip
        balances = (await session.execute(select(AccountRow.user_id, AccountRow.balance_cents)
            .where(AccountRow.user_id.in_(users)).order_by(AccountRow.user_id))).all()  # fmt: skip
        packet = (await session.execute(select(PacketRow.status, PacketRow.sold_out_at)
            .where(PacketRow.packet_id == packet_id))).one()  # fmt: skip
        events = (await session.execute(select(EventRow.type, EventRow.at, EventRow.dedup_key,
            EventRow.data).where(EventRow.dedup_key == sold_out))).all()  # fmt: skip
    found = {"grabs": grabs, "entries": entries, "balances": balances, "packet": [packet],
             "events": [(*e[:3], json.loads(e[3])) for e in events]}  # fmt: skip
    rows = {name: [[_instant(v) for v in row] for row in found_rows]
            for name, found_rows in found.items()}  # fmt: skip
    unprefixed: dict[str, Any] = json.loads(json.dumps(rows, default=str).replace(FRESH, ""))
    return unprefixed


def _instant(value: object) -> object:
    """A time as the instant it names: SQLite gives some back without their zone (UTC)."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


async def test_the_raw_baseline_writes_the_rows_the_write_behind_writes(db: Database) -> None:
    """The same records through the write-behind's apply and through the raw driver (under
    fresh ids) leave the same grab rows, ledger credits, balances, packet status and
    sold-out event; the raw writer also marks the packet's records done."""
    await _packet(db, "p1")
    await _packet(db, FRESH + "p1")
    async with db.transaction() as session:
        await apply_packet_records(session, _records())
    await write_raw(db, [_records()], FRESH)
    mine = await _written(db, "p1", ["u1", "u2"])
    raw = await _written(db, FRESH + "p1", [FRESH + "u1", FRESH + "u2"])
    assert raw == mine
    assert len(mine["grabs"]) == len(mine["entries"]) == 2 and mine["packet"][0][0] == "sold_out"
    assert [e[0] for e in mine["events"]] == ["packet.sold_out"]
    async with db.sessions() as session:
        done = await session.scalar(
            select(PacketRow.records_done).where(PacketRow.packet_id == FRESH + "p1")
        )
    assert done is True
