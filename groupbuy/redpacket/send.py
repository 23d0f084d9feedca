"""The send, whole: debit the sender and make the packet live (packet_admit, packet_create).

The specs and calls of its scripts (the admission and its take-back, the creation), the
operation (`SendService`, which also finishes the sends whose Redis step failed) and its
answer (`sent_body`).

Money moves in SQL: a send draws the shares, then debits the sender and records the packet,
its committed shares and its terms in one SQL transaction, then puts them in Redis ("makes
it live"). The admission script checks the sender's block and daily caps first, before
any money moves.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import Any, cast

import redis.exceptions
from groupbuy_client import wire
from groupbuy_client.wire import Outcome, from_ms, iso_ms, to_ms
from sqlalchemy import CursorResult, delete, select, update

from groupbuy import errors
from groupbuy.redpacket import ledger
from groupbuy.redpacket.admission import Admission
from groupbuy.redpacket.codec import packet_debit_key
from groupbuy.redpacket.commitment import Commitment
from groupbuy.redpacket.models import PacketContentsRow, PacketRow
from groupbuy.redpacket.recording import apply_packet_records
from groupbuy.redpacket.records import PacketRefunded, packet_event_key
from groupbuy.redpacket.specs import (
    EXISTING,
    OK,
    PACKET_ARGV,
    PACKET_KEYS,
    RECORDED,
    PacketReply,
    PacketScripts,
    recorded_args,
)
from groupbuy.redpacket.split import split
from groupbuy.redpacket.terms import Terms, pack_recipients, unpack_recipients
from groupbuy.settings import RedPacketSettings
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.db import insert_ignore
from groupbuy.storage.events import Event, EventRow, record_event
from groupbuy.storage.specs import ScriptSpec, Slot, shape

log = logging.getLogger(__name__)

# A packet anyone may grab, the sender too, without a password or a greeting.
PLAIN = Terms()

PACKET_CREATE = ScriptSpec(
    "packet_create",
    "Put a sent packet, its committed shares and its recipients in Redis, once.",
    keys=PACKET_KEYS,
    args=(*PACKET_ARGV, *RECORDED),
    more_args=Slot(
        "shares",
        "the committed shares in grab order (count of them, summing to amount), then the "
        "recipients (recipients_count of them)",
    ),
    replies={OK: shape("created"), EXISTING: shape("already there (nothing changed)")},
)


async def packet_create(
    packets: PacketScripts,
    packet_id: str,
    shares: Sequence[int],
    recipients: Sequence[str],
    **recorded: Any,
) -> PacketReply:
    """packet_create; `recorded`: the packet as SQL records it (RECORDED, recorded_args)."""
    return await packets.run(PACKET_CREATE, packet_id, [*shares, *recipients], **recorded)


class SendService(UsesBackends):
    """Sends: the admission, the debit and the packet's record, then its Redis state."""

    def __init__(
        self, backends: Backends, scripts: PacketScripts, limits: RedPacketSettings
    ) -> None:
        super().__init__(backends)
        self._packets = scripts
        self._limits = limits
        self._admission = Admission(backends, scripts, limits)

    async def send(
        self,
        sender_id: str,
        amount_cents: int,
        count: int,
        packet_id: str | None = None,
        expires_in_s: int | None = None,
        strategy: str = "double_mean",
        terms: Terms = PLAIN,
    ) -> Outcome:
        """Debit the sender and create the packet; the same packet_id again returns it.

        A blocked sender (403) and a send past the sender's daily caps (409) are refused by
        the admission script before any money moves. The shares are drawn here, once: SQL
        keeps them with the packet, and the answer carries their commitment."""
        limits = self._limits
        terms.check(count)
        if count > limits.max_count:
            raise errors.InvalidRequest(f"count may be at most {limits.max_count}")
        if amount_cents > limits.max_amount_cents:
            raise errors.InvalidRequest(f"amount_cents may be at most {limits.max_amount_cents}")
        if amount_cents < count:
            raise errors.InvalidRequest("amount_cents must be at least count (1 cent per share)")
        packet_id = packet_id or f"p{secrets.token_hex(8)}"
        expires_in_s = expires_in_s or limits.expires_in_s
        now_ms = await self._clock.now_ms(self._redis)
        wanted = {
            "sender_id": sender_id,
            "amount_cents": amount_cents,
            "count": count,
            "strategy": strategy,
            "expires_in_s": expires_in_s,
            "message": terms.message,
            "recipients_count": len(terms.recipients),
            "sender_may_grab": terms.sender_may_grab,
        }
        commitment = Commitment.draw(strategy, amount_cents, count)
        # The sender's and the packet's slots are in the directory (Redis Cluster), each with
        # its copy of the blocked users, before the admission reads one and the packet is
        # written to the other.
        await self._slots.join(self._keys.sender_slot(sender_id), self._keys.packet_slot(packet_id))
        # The admission is a write script: over maxmemory Redis refuses it up front, so a
        # send Redis could not take is refused before the debit.
        counted = await self._admission.admit(sender_id, packet_id, amount_cents, now_ms)
        try:
            created, row = await self._record_send(packet_id, wanted, terms, commitment, now_ms)
        except Exception:
            if counted:  # refused (too little money) or failed: the send did not happen
                await self._admission.unadmit(sender_id, packet_id, now_ms)
            raise
        if counted and not created:  # a repeat: the first send was counted on its own day
            await self._admission.unadmit(sender_id, packet_id, now_ms)
        if not created and not await self._same_send(row, wanted, terms):
            raise errors.Conflict(f"packet {packet_id!r} exists with other parameters")
        if row.status == "pending":
            try:
                await self.make_live(row, joined=True, contents=(commitment, terms.recipients))
            except redis.exceptions.OutOfMemoryError:
                # Memory ran out between the admission and the packet: the client is told nothing
                # was applied, so the debit and the packet's record go (a repeat starts over).
                if created:
                    await self._unsend(row)
                    if counted:
                        await self._admission.unadmit(sender_id, packet_id, now_ms)
                raise
        return Outcome(dict(sent_body(row)), created)

    async def _same_send(self, row: PacketRow, wanted: dict[str, Any], terms: Terms) -> bool:
        """True when a repeated send asks for the packet that was recorded."""
        if any(getattr(row, k) != v for k, v in wanted.items()):
            return False
        if not terms.same_password(row.password_salt, row.password_hash):
            return False
        if not terms.recipients:
            return True
        async with self._db.sessions() as session:
            contents = await session.get(PacketContentsRow, row.packet_id)
        return contents is not None and unpack_recipients(contents.recipients) == list(
            terms.recipients
        )

    async def _record_send(
        self,
        packet_id: str,
        wanted: dict[str, Any],
        terms: Terms,
        commitment: Commitment,
        now_ms: int,
    ) -> tuple[bool, PacketRow]:
        """Record the packet, its contents and its debit in one SQL transaction: (created,
        the row); created is False when the packet id was recorded before (nothing
        changed)."""
        sender_id, amount_cents = wanted["sender_id"], wanted["amount_cents"]
        expires_in_s = wanted["expires_in_s"]
        salt, hashed = terms.stored_password()
        async with self._db.transaction(urgent=True) as session:
            created = await insert_ignore(
                session,
                PacketRow.__table__,
                {
                    "packet_id": packet_id,
                    **wanted,
                    "status": "pending",
                    "refunded_cents": 0,
                    "records_done": False,
                    "created_at": from_ms(now_ms),
                    "expires_at": from_ms(now_ms + expires_in_s * 1000),
                    "password_salt": salt,
                    "password_hash": hashed,
                    "shares_sha256": commitment.sha256,
                },
            )
            if created:
                session.add(
                    PacketContentsRow(
                        packet_id=packet_id,
                        shares_salt=commitment.salt,
                        shares=commitment.pack(),
                        recipients=pack_recipients(terms.recipients),
                    )
                )
                await ledger.post_entry(
                    session,
                    user_id=sender_id,
                    kind="packet_debit",
                    amount_cents=-amount_cents,
                    business_key=packet_debit_key(packet_id),
                    at=from_ms(now_ms),
                    require_funds=True,
                )
                await record_event(
                    session,
                    Event(
                        "packet.sent",
                        now_ms,
                        packet_event_key("packet.sent", packet_id),
                        {
                            "packet_id": packet_id,
                            **wanted,
                            "password_protected": hashed is not None,
                            "shares_sha256": commitment.sha256,
                            "version": 1,
                        },
                    ),
                )
            row = await session.get(PacketRow, packet_id, populate_existing=True)
        assert row is not None
        return created, row

    async def _unsend(self, row: PacketRow) -> None:
        """Take back a send whose packet Redis refused: its row, debit and event, in one
        transaction, unless the repair job has made it live meanwhile."""
        async with self._db.transaction(urgent=True) as session:
            gone = await session.execute(
                delete(PacketRow).where(
                    PacketRow.packet_id == row.packet_id, PacketRow.status == "pending"
                )
            )
            if cast(CursorResult[Any], gone).rowcount != 1:
                return
            await session.execute(
                delete(PacketContentsRow).where(PacketContentsRow.packet_id == row.packet_id)
            )
            await ledger.take_back(session, packet_debit_key(row.packet_id))
            await session.execute(
                delete(EventRow).where(
                    EventRow.dedup_key == packet_event_key("packet.sent", row.packet_id)
                )
            )
        log.warning("send of packet %s taken back: Redis refused the packet", row.packet_id)

    async def make_live(
        self,
        row: PacketRow,
        joined: bool = False,
        contents: tuple[Commitment, Sequence[str]] | None = None,
    ) -> None:
        """Create the Redis state of a recorded packet (idempotent), then mark it active;
        its slot joins the directory first unless the caller has `joined` it. `contents`:
        its committed shares and recipients, read from SQL unless the caller has them."""
        if not joined:
            await self._slots.join(self._keys.packet_slot(row.packet_id))
        commitment, recipients = contents or await self.contents(row)
        recorded = recorded_args(row, self._limits.retention_s)
        await packet_create(self._packets, row.packet_id, commitment.shares, recipients, **recorded)
        async with self._db.transaction(urgent=True) as session:
            await session.execute(
                update(PacketRow)
                .where(PacketRow.packet_id == row.packet_id, PacketRow.status == "pending")
                .values(status="active")
            )
        row.status = "active"

    async def contents(self, row: PacketRow) -> tuple[Commitment, list[str]]:
        """A recorded packet's committed shares and its recipients, from SQL. A packet sent
        before commitments were kept has none: its shares are drawn now, as they were then."""
        async with self._db.sessions() as session:
            kept = await session.get(PacketContentsRow, row.packet_id)
        if kept is None:
            drawn = split(row.strategy, row.amount_cents, row.count)
            return Commitment(tuple(drawn), b""), []
        commitment = Commitment.unpack(kept.shares, kept.shares_salt)
        return commitment, unpack_recipients(kept.recipients)

    async def repair_pending(self) -> dict[str, int]:
        """Finish sends whose Redis step failed: create the packet, or refund it if already over."""
        async with self._db.sessions() as session:
            pending = (
                await session.scalars(select(PacketRow).where(PacketRow.status == "pending"))
            ).all()
        now_ms = await self._clock.now_ms(self._redis)
        made_live = refunded = 0
        for row in pending:
            in_redis = await self._redis.exists(self._keys.packet_keys(row.packet_id).hash)
            if in_redis or to_ms(row.expires_at) > now_ms:
                await self.make_live(row)
                made_live += 1
            else:
                await self._refund_unsent(row)
                refunded += 1
        return {"pending": len(pending), "made_live": made_live, "refunded": refunded}

    async def _refund_unsent(self, row: PacketRow) -> None:
        # Its time ran out before it ever reached Redis: nobody grabbed, all goes back.
        # The same record a packet_expire script would have written, applied the same way
        # (its ledger and event keys make a second application, from any path, a no-op).
        refund: PacketRefunded = {
            "type": "packet.refunded",
            "at_ms": str(to_ms(row.expires_at)),
            "packet_id": row.packet_id,
            "sender_id": row.sender_id,
            "refunded_cents": str(row.amount_cents),
            "remaining_count": str(row.count),
        }
        async with self._db.transaction() as session:
            await apply_packet_records(session, [refund])
            await session.execute(
                update(PacketRow)
                .where(PacketRow.packet_id == row.packet_id)
                .values(records_done=True)  # there is no stream to drain
            )


def sent_body(row: PacketRow) -> wire.PacketSent:
    """A packet as its send answers it, from its SQL row (listings add their live fields)."""
    return {
        "packet_id": row.packet_id,
        "sender_id": row.sender_id,
        "amount_cents": row.amount_cents,
        "count": row.count,
        "strategy": cast(wire.SplitStrategy, row.strategy),
        "status": cast(wire.PacketStatus, "active" if row.status == "pending" else row.status),
        "expires_at": iso_ms(to_ms(row.expires_at)),
        "message": row.message,
        "shares_sha256": row.shares_sha256,
    }
