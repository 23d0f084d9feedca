"""Grabs answered `grabbed` that never reached SQL: the loss reconciliation reports by name.

Each process journals the grabs it acknowledged (groupbuy/redpacket/acks.py) and the
write-behind drops a journal row once the grab row is in. A row still there is either on
its way (its packet's outbox stream has records waiting) or lost: Redis lost the packet
before its record was written, and the packet was rebuilt from SQL without it (the ack
belongs to an epoch the packet has left), or its stream is empty with no grab row. A grab
whose record SQL refused is not lost: it is named with its dead letter.
"""

from __future__ import annotations

from typing import Any

from groupbuy_client.wire import iso_ms, to_ms
from sqlalchemy import and_, delete, exists, select

from groupbuy.ops.reconcile.rules import Findings, Mismatch
from groupbuy.redpacket.models import AcknowledgedGrabRow, GrabRow, PacketEpochRow
from groupbuy.storage.db import Database
from groupbuy.storage.deadletters import DeadLetterRow
from groupbuy.storage.keys import Keys

_Ack = AcknowledgedGrabRow


async def unrecorded_acks(redis: Any, database: Database, keys: Keys, limit: int) -> list[Mismatch]:
    """Forget the acknowledgements whose grab row arrived; name the ones Redis lost.

    SQL is read before the outbox streams here, so a record written and acknowledged
    between the two reads looks lost once. Suspects are looked at a second time: that
    grab row is in by then, and only what is missing both times is reported.
    """
    first = await _unrecorded_once(redis, database, keys, limit)
    if not first:
        return []
    seen = {_identity(m) for m in first}
    return [m for m in await _unrecorded_once(redis, database, keys, limit) if _identity(m) in seen]


def _identity(mismatch: Mismatch) -> tuple[Any, ...]:
    return tuple(mismatch.get(k) for k in ("kind", "packet_id", "user_id", "seq"))


async def _unrecorded_once(
    redis: Any, database: Database, keys: Keys, limit: int
) -> list[Mismatch]:
    # The same grab: same user, amount and instant (a grab row's time is the script's, as
    # the acknowledgement's is). A user who grabbed again after a rebuild has another
    # instant, even when chance gives them the same amount.
    recorded = exists().where(
        GrabRow.packet_id == _Ack.packet_id,
        GrabRow.user_id == _Ack.user_id,
        GrabRow.amount_cents == _Ack.amount_cents,
        GrabRow.grabbed_at == _Ack.acked_at,
    )
    async with database.transaction() as session:
        await session.execute(delete(_Ack).where(recorded))
    async with database.sessions() as session:
        rows = (
            await session.execute(
                select(_Ack, PacketEpochRow.epoch, GrabRow.amount_cents, DeadLetterRow.id)
                .outerjoin(PacketEpochRow, PacketEpochRow.packet_id == _Ack.packet_id)
                .outerjoin(
                    GrabRow,
                    and_(GrabRow.packet_id == _Ack.packet_id, GrabRow.user_id == _Ack.user_id),
                )
                .outerjoin(
                    DeadLetterRow,
                    and_(
                        DeadLetterRow.stream == "packets",
                        DeadLetterRow.owner_id == _Ack.packet_id,
                        DeadLetterRow.record_type == "grab",
                        DeadLetterRow.user_id == _Ack.user_id,
                    ),
                )
                .order_by(_Ack.packet_id, _Ack.seq)
                .limit(limit)
            )
        ).all()
    if not rows:
        return []
    packet_ids = sorted({ack.packet_id for ack, *_ in rows})
    async with redis.pipeline(transaction=False) as pipe:
        for packet_id in packet_ids:
            pipe.xlen(keys.packet_outbox(packet_id))
        waiting = dict(zip(packet_ids, await pipe.execute(), strict=True))
    found: list[Mismatch] = []
    for ack, epoch, recorded_cents, dead_letter_id in rows:
        left_behind = ack.epoch < (epoch or 0)
        if not left_behind and waiting[ack.packet_id]:
            continue  # its record may still be on its way
        mismatch = Findings(packet_id=ack.packet_id, user_id=ack.user_id)
        if dead_letter_id is not None and not left_behind:
            mismatch.add(
                "grab_dead_lettered",
                amount_cents=ack.amount_cents,
                seq=ack.seq,
                acknowledged_at=iso_ms(to_ms(ack.acked_at)),
                dead_letter_id=dead_letter_id,
            )
            found += mismatch
            continue
        mismatch.add(
            "grab_acknowledged_unrecorded",
            amount_cents=ack.amount_cents,
            seq=ack.seq,
            epoch=ack.epoch,
            acknowledged_at=iso_ms(to_ms(ack.acked_at)),
            recorded_cents=recorded_cents,
        )
        found += mismatch
    return found
