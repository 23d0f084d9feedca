"""The packet scripts' outbox records: each type's fields, its event's dedup key, and how a
batch of them becomes SQL rows, ledger entries and events (idempotently).

To add an event type: the script that changes state emits it (`emit({...})` in lua/), and
this module gains its record TypedDict (in PACKET_RECORDS), its name in EVENT_TYPES and
its branch in `apply_packet_records`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Literal, NamedTuple, Required, TypedDict, cast

from groupbuy_client.wire import from_ms
from sqlalchemy import Table, bindparam, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.redpacket.codec import KEY, grab_credit_key, refund_key
from groupbuy.redpacket.ledger import post_entries, post_entry
from groupbuy.redpacket.models import AcknowledgedGrabRow, GrabRow, PacketEpochRow, PacketRow
from groupbuy.storage.db import dialect_insert
from groupbuy.storage.events import Event, record_event
from groupbuy.storage.typedrecords import parse_record

log = logging.getLogger(__name__)

# <type>:<packet_id>
EVENT_TYPES = ("packet.sent", "packet.sold_out", "packet.withdrawn", "packet.refunded")


# -- event dedup keys -----------------------------------------------------------------


class PacketEventKey(NamedTuple):
    """The identity of a packet event: ``<type>:<packet_id>``."""

    type: str
    packet_id: str


def packet_event_key(event_type: str, packet_id: str) -> str:
    """The dedup key an event of the packet engine is recorded under (one per packet)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"{event_type!r} is not an event of the packet engine")
    return KEY.join((event_type, packet_id))


def parse_event_key(key: str) -> PacketEventKey | None:
    """A packet event's dedup key, or None for an event of another engine."""
    event_type, *parts = key.split(KEY)
    if event_type not in EVENT_TYPES:
        return None
    if len(parts) != 1 or not parts[0]:
        raise ValueError(f"event key {key!r} is not '<type>:<packet_id>'")
    return PacketEventKey(event_type, parts[0])


# -- outbox records: the fields each `emit({...})` of the packet scripts writes -----------


class _Fenced(TypedDict, total=False):
    epoch: str  # the epoch of the Redis state that wrote it (records from before epochs: 0)


class GrabRecord(_Fenced):
    """lua/packet_grab.lua: one grabbed share."""

    type: Literal["grab"]
    at_ms: str
    packet_id: str
    user_id: str
    amount_cents: str
    seq: str


class _Ending(_Fenced, total=False):
    version: str  # the packet's version after the change (records from before versions: none)


class PacketSoldOut(_Ending):
    """lua/packet_grab.lua (the last share) or lua/packet_restore.lua: nothing left."""

    type: Literal["packet.sold_out"]
    at_ms: str
    packet_id: str
    sender_id: str


class PacketWithdrawn(_Ending):
    """lua/_packet_lib.lua (a withdrawal), just before its packet.refunded: the sender
    took the packet back."""

    type: Literal["packet.withdrawn"]
    at_ms: str
    packet_id: str
    sender_id: str


class PacketRefunded(_Ending, total=False):
    """lua/_packet_lib.lua (an expiry or a withdrawal), or a packet that expired before it
    was sent: the rest goes back to the sender. The last record of its packet."""

    type: Required[Literal["packet.refunded"]]
    at_ms: Required[str]
    packet_id: Required[str]
    sender_id: Required[str]
    refunded_cents: Required[str]
    remaining_count: Required[str]
    reason: str  # expired | withdrawn (records from before withdrawals: none, expired)


PacketEnding = PacketSoldOut | PacketWithdrawn | PacketRefunded
PacketRecord = GrabRecord | PacketEnding
PACKET_RECORDS: dict[str, type[PacketRecord]] = {
    "grab": GrabRecord,
    "packet.sold_out": PacketSoldOut,
    "packet.withdrawn": PacketWithdrawn,
    "packet.refunded": PacketRefunded,
}
"""Every packet record type by its `type` field."""


def parse_packet_record(fields: Mapping[str, str]) -> PacketRecord:
    """An outbox entry's fields as the packet record its `type` names: ValueError for an
    unknown type, KeyError for a missing field."""
    return parse_record("packet", PACKET_RECORDS, fields)


async def apply_packet_records(session: AsyncSession, records: list[PacketRecord]) -> None:
    """Apply a batch of packet-script records to SQL; records applied before change nothing.

    Grabs, the bulk of the traffic, go in with three statements per batch (grab rows,
    ledger credits, balances); the rare endings are applied one by one after them.
    Records of an epoch the packet has left (Redis lost that state and it was rebuilt from
    SQL since) are fenced out: their grabs are kept as acknowledged grabs to report.
    """
    records = await _fence(session, records)
    grabs: list[GrabRecord] = []
    endings: list[PacketEnding] = []
    for f in records:
        if f["type"] == "grab":
            grabs.append(f)
        else:
            endings.append(f)
    if grabs:
        # Parameters as a list (executemany): the statement compiles once and is cached;
        # a multi-row VALUES clause compiled anew for every batch, several times slower.
        await session.execute(
            dialect_insert(session, GrabRow.__table__).on_conflict_do_nothing(),
            [_grab_row(f) for f in grabs],
        )
        await post_entries(session, [_grab_credit(f) for f in grabs])
        # Recorded now: their acknowledgements have nothing left to prove (the journal row
        # of one that arrives later is dropped by reconciliation).
        table = cast(Table, AcknowledgedGrabRow.__table__)
        acks = table.c
        await session.execute(
            delete(table).where(
                acks.packet_id == bindparam("p"),
                acks.user_id == bindparam("u"),
                acks.epoch == bindparam("e"),
            ),
            [{"p": f["packet_id"], "u": f["user_id"], "e": record_epoch(f)} for f in grabs],
        )
    for ending in endings:
        await _apply_ending(session, ending)


def record_epoch(f: PacketRecord) -> int:
    """The epoch of the Redis state that wrote a record (records before epochs: 0)."""
    return int(f.get("epoch", "0"))


async def _fence(session: AsyncSession, records: list[PacketRecord]) -> list[PacketRecord]:
    """The records of each packet's current epoch; the others are set aside.

    On PostgreSQL the packets' rows are share-locked first, so a rebuild (which locks its
    row for update before it raises the epoch and reads the grabs) waits for this batch to
    commit, and this batch waits for the rebuild: never both at once.
    """
    packet_ids = sorted({f["packet_id"] for f in records})
    rows = await session.execute(
        select(PacketRow.packet_id, PacketEpochRow.epoch)
        .outerjoin(PacketEpochRow, PacketEpochRow.packet_id == PacketRow.packet_id)
        .where(PacketRow.packet_id.in_(packet_ids))
        .with_for_update(read=True, of=PacketRow)
    )
    epochs = {packet_id: epoch or 0 for packet_id, epoch in rows}
    current = [f for f in records if record_epoch(f) == epochs.get(f["packet_id"], 0)]
    if len(current) == len(records):
        return records
    fenced = [f for f in records if record_epoch(f) != epochs.get(f["packet_id"], 0)]
    log.warning(
        "%d records of a rebuilt packet's lost epoch fenced out (grabs among them are "
        "reported by reconciliation)",
        len(fenced),
    )
    lost_grabs = [acknowledged_grab(f, "fenced") for f in fenced if f["type"] == "grab"]
    if lost_grabs:
        await session.execute(
            dialect_insert(session, AcknowledgedGrabRow.__table__).on_conflict_do_nothing(),
            lost_grabs,
        )
    return current


def acknowledged_grab(f: GrabRecord, source: str) -> dict[str, object]:
    """The acknowledged_grabs row of a grab record."""
    return {
        "packet_id": f["packet_id"],
        "user_id": f["user_id"],
        "epoch": record_epoch(f),
        "seq": int(f["seq"]),
        "amount_cents": int(f["amount_cents"]),
        "acked_at": from_ms(int(f["at_ms"])),
        "source": source,
    }


def _grab_row(f: GrabRecord) -> dict[str, object]:
    return {
        "packet_id": f["packet_id"],
        "user_id": f["user_id"],
        "seq": int(f["seq"]),
        "amount_cents": int(f["amount_cents"]),
        "grabbed_at": from_ms(int(f["at_ms"])),
    }


def _grab_credit(f: GrabRecord) -> dict[str, object]:
    return {
        "business_key": grab_credit_key(f["packet_id"], f["user_id"]),
        "user_id": f["user_id"],
        "kind": "grab_credit",
        "amount_cents": int(f["amount_cents"]),
        "created_at": from_ms(int(f["at_ms"])),
    }


async def _apply_ending(session: AsyncSession, f: PacketEnding) -> None:
    kind, packet_id, at_ms = f["type"], f["packet_id"], int(f["at_ms"])
    at = from_ms(at_ms)
    data: dict[str, object] = {"packet_id": packet_id, "sender_id": f["sender_id"]}
    if "version" in f:  # records written before packets had versions carry none
        data["version"] = int(f["version"])
    if f["type"] == "packet.sold_out":
        await _set(session, packet_id, status="sold_out", sold_out_at=at)
        await record_event(session, Event(kind, at_ms, packet_event_key(kind, packet_id), data))
    elif f["type"] == "packet.withdrawn":
        # The status changes with the refund that follows: the packet's last record.
        await _set(session, packet_id, withdrawn_at=at)
        await record_event(session, Event(kind, at_ms, packet_event_key(kind, packet_id), data))
    elif f["type"] == "packet.refunded":
        reason = f.get("reason", "expired")
        refunded = int(f["refunded_cents"])
        await post_entry(
            session,
            user_id=f["sender_id"],
            kind="refund_credit",
            amount_cents=refunded,
            business_key=refund_key(packet_id),
            at=at,
        )
        ended = {"expired_at": at} if reason == "expired" else {}
        await _set(session, packet_id, status=reason, refunded_cents=refunded, **ended)
        data |= {
            "refunded_cents": refunded,
            "ungrabbed_count": int(f["remaining_count"]),
            "reason": reason,
        }
        await record_event(session, Event(kind, at_ms, packet_event_key(kind, packet_id), data))
    else:
        raise ValueError(f"unknown packet record type {kind!r}")


async def _set(session: AsyncSession, packet_id: str, **values: object) -> None:
    await session.execute(
        update(PacketRow).where(PacketRow.packet_id == packet_id).values(**values)
    )
