"""The reads of one packet, whole: the packet with its first grabs, a page of its grabs,
one user's grab; live from Redis (packet_read, packet_grab_read) or from SQL once Redis
let the packet go.

Its scripts' specs and calls, the operation (`ReadService`) and its answers: `PacketView`,
one shape for a packet whichever store it is read from, and its API body. An ended
packet's body reveals its committed shares and salt. The SQL side (`recorded_packet`,
`recorded_grabs`, `packet_version`) serves the recovery and the listing too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from groupbuy_client import wire
from groupbuy_client.wire import iso_ms, to_ms
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.redpacket.codec import parse_grab
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.commitment import Commitment
from groupbuy.redpacket.models import (
    ENDED,
    GrabRow,
    PacketContentsRow,
    PacketEpochRow,
    PacketRow,
)
from groupbuy.redpacket.specs import (
    NO_PACKET,
    OK,
    PACKET_ARGV,
    PACKET_KEYS,
    PACKET_NOT_FOUND,
    PacketReply,
    PacketScripts,
)
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.db import Database
from groupbuy.storage.specs import Field, ScriptSpec, reply_dict, shape, slots

# The grabs a packet's body carries; the rest are paged (GET .../grabs).
GRABS_SHOWN = 100

PACKET_READ = ScriptSpec(
    "packet_read",
    "A packet's state and one page of its grabs, after the lazy expiry check.",
    keys=PACKET_KEYS,
    args=(
        *PACKET_ARGV,
        *slots(("cursor", "the page starts after this seq (0: the first grab)"), ("limit", "seqs")),
    ),
    replies={
        OK: shape(
            "the packet hash with its terms, the page (user -> grab value, in seq order), "
            "the number of grabs, the next page's cursor (-1: none), at now_ms",
            ("packet", reply_dict),
            ("page", list),
            ("total", int),
            ("next_cursor", int),
            ("now_ms", int),
        ),
        PACKET_NOT_FOUND: NO_PACKET,
    },
)
PACKET_GRAB_READ = ScriptSpec(
    "packet_grab_read",
    "One user's grab of a packet.",
    keys=PACKET_KEYS,
    args=(*PACKET_ARGV, *slots(("user_id", "the user"))),
    replies={
        OK: shape(
            "the grab's value, or none when the user has not grabbed",
            Field("grab", list, rest=True),
        ),
        PACKET_NOT_FOUND: NO_PACKET,
    },
)


async def packet_read(
    packets: PacketScripts, packet_id: str, cursor: int = 0, limit: int = GRABS_SHOWN
) -> PacketReply:
    """packet_read."""
    return await packets.run(PACKET_READ, packet_id, cursor=cursor, limit=limit)


class LostPacket(Protocol):
    """What a read does when Redis does not hold a packet SQL says is live
    (RecoveryService does it)."""

    async def bring_back(self, row: PacketRow) -> bool:
        """Put the packet back in Redis; False when its SQL record is the answer."""


Grab = tuple[str, int, int, int]  # (user, amount_cents, grabbed_at_ms, seq)


class ReadService(UsesBackends):
    """Reads of one packet, in one shape whichever store answers."""

    def __init__(self, backends: Backends, scripts: PacketScripts, lost: LostPacket) -> None:
        super().__init__(backends)
        self._packets = scripts
        self._lost = lost

    async def get(self, packet_id: str) -> wire.Packet:
        """A packet with its first grabs: live from Redis, or from SQL once Redis let it go."""
        view = await self._view(packet_id, 0, GRABS_SHOWN)
        revealed = await self._revealed(packet_id) if view.status in ENDED else None
        luckiest = await self._luckiest(view, revealed)
        return view.body(revealed, luckiest)

    async def grabs(self, packet_id: str, cursor: str | None, limit: int) -> wire.GrabsPage:
        """A page of the packet's grabs in grab order, after seq `cursor`."""
        view = await self._view(packet_id, int(cursor or 0), limit)
        return {"grabs": view.page_body(), "next_cursor": view.next_cursor()}

    async def grab_of(self, packet_id: str, user_id: str) -> wire.PacketGrab:
        """One user's grab (one Redis read), or 404 `not_grabbed`."""
        reading = await self._packets.run(PACKET_GRAB_READ, packet_id, user_id=user_id)
        if reading.code is PacketCode.OK:
            if not reading.grab:
                raise errors.NotGrabbed(f"{user_id!r} has not grabbed packet {packet_id!r}")
            grab = parse_grab(reading.grab[0])
            return _grab_body((user_id, grab.amount_cents, grab.at_ms, grab.seq))
        await recorded_packet(self._db, packet_id)  # 404 packet_not_found when SQL has none
        async with self._db.sessions() as session:
            row = await session.get(GrabRow, (packet_id, user_id))
        if row is None:
            raise errors.NotGrabbed(f"{user_id!r} has not grabbed packet {packet_id!r}")
        return _grab_body((user_id, row.amount_cents, to_ms(row.grabbed_at), row.seq))

    async def _view(self, packet_id: str, cursor: int, limit: int) -> PacketView:
        reading = await packet_read(self._packets, packet_id, cursor, limit)
        if reading.code is PacketCode.PACKET_NOT_FOUND:
            row = await recorded_packet(self._db, packet_id)
            if await self._lost.bring_back(row):
                reading = await packet_read(self._packets, packet_id, cursor, limit)
        if reading.code is PacketCode.OK:
            return PacketView.from_redis(
                packet_id, reading.packet, reply_dict(reading.page), reading.total, reading
            )
        row = await recorded_packet(self._db, packet_id)
        async with self._db.sessions() as session:
            total, grabbed = (
                await session.execute(
                    select(func.count(), func.coalesce(func.sum(GrabRow.amount_cents), 0)).where(
                        GrabRow.packet_id == packet_id
                    )
                )
            ).one()
            rows = await recorded_grabs(session, packet_id, cursor, limit + 1)
            mark = await session.get(PacketEpochRow, packet_id)
        more = len(rows) > limit
        rows = rows[:limit]
        after = rows[-1].seq if more else None
        return PacketView.from_rows(row, rows, (int(total), int(grabbed)), after, mark)

    async def _revealed(self, packet_id: str) -> Commitment | None:
        """The committed shares and salt of an ended packet (None: sent before commitments)."""
        async with self._db.sessions() as session:
            kept = await session.get(PacketContentsRow, packet_id)
        return Commitment.unpack(kept.shares, kept.shares_salt) if kept else None

    async def _luckiest(self, view: PacketView, revealed: Commitment | None) -> str | None:
        """Who got the largest share of a sold-out packet (the earlier grab on a tie): the
        commitment says which position, the grab order says who (one more read when it is
        past the first page)."""
        if view.status != "sold_out" or not view.grabs:
            return None
        if revealed is None:  # sent before commitments: the largest among the first grabs
            return max(view.grabs, key=lambda grab: grab[1])[0]
        shares = revealed.shares
        seq = shares.index(max(shares)) + 1  # the i-th share is seq i
        for user, _cents, _at, grab_seq in view.grabs:
            if grab_seq == seq:
                return user
        further = await self._view(view.packet_id, seq - 1, 1)
        return further.grabs[0][0] if further.grabs else None


async def recorded_packet(db: Database, packet_id: str) -> PacketRow:
    """The packet's SQL row; PacketNotFound when SQL never recorded it."""
    async with db.sessions() as session:
        row = await session.get(PacketRow, packet_id)
    if row is None:
        raise errors.PacketNotFound(f"no packet {packet_id!r}")
    return row


async def recorded_grabs(
    session: AsyncSession, packet_id: str, after: int = 0, limit: int | None = None
) -> Sequence[GrabRow]:
    """A packet's grab rows in seq order (grab order), after seq `after`."""
    query = (
        select(GrabRow)
        .where(GrabRow.packet_id == packet_id, GrabRow.seq > after)
        .order_by(GrabRow.seq)
        .limit(limit)
    )
    return (await session.scalars(query)).all()


def ending_changes(status: str) -> int:
    """The changes that ended a packet: 1 (sold out, expired) or 2 (withdrawn, refunded)."""
    return {"sold_out": 1, "expired": 1, "withdrawn": 2}.get(status, 0)


def packet_version(epoch: int, count: int, grabs: int, status: str) -> int:
    """A packet's version from what SQL knows: 1 when sent, +1 per grab, +1 or +2 when it
    ended (ending_changes).

    Each rebuild after Redis lost the packet (epoch e) starts above anything the lost state
    can have reached (at most count + 2 changes per epoch), so versions only grow.
    """
    return epoch * (count + 3) + 1 + grabs + ending_changes(status)


def _grab_body(grab: Grab) -> wire.PacketGrab:
    user, amount_cents, at, _seq = grab
    return {"user_id": user, "amount_cents": amount_cents, "grabbed_at": iso_ms(at)}


@dataclass(frozen=True)
class PacketView:
    """A packet as either store holds it (Redis live, SQL once ended), in one shape, with
    one page of its grabs."""

    packet_id: str
    sender_id: str
    amount_cents: int
    count: int
    strategy: str
    status: str  # active | sold_out | expired | withdrawn
    expires_ms: int
    refunded_cents: int
    message: str | None
    recipients_count: int
    password_protected: bool
    shares_sha256: str | None
    grabs: list[Grab]  # the page, in grab order
    grab_total: int  # every grab so far
    grabbed_cents: int  # their sum
    after: int | None  # the next page's cursor (the seq it starts after), None: no more
    version: int  # the packet's changes so far (SPEC §3); a newer body has a larger one

    @classmethod
    def from_redis(
        cls,
        packet_id: str,
        packet: dict[str, str],
        page: dict[str, str],
        total: int,
        reading: PacketReply,
    ) -> PacketView:
        """From a packet_read reply: the packet hash and a page (user -> grab value)."""
        grabs = []
        for user, value in page.items():
            grab = parse_grab(value)
            grabs.append((user, grab.amount_cents, grab.at_ms, grab.seq))
        amount = int(packet["amount"])
        return cls(
            packet_id=packet_id,
            sender_id=packet["sender_id"],
            amount_cents=amount,
            count=int(packet["count"]),
            strategy=packet["strategy"],
            status=packet["status"],
            expires_ms=int(packet["expires_ms"]),
            refunded_cents=int(packet.get("refunded", 0)),
            message=packet.get("message") or None,
            recipients_count=int(packet.get("recipients_count") or 0),
            password_protected="p" in packet.get("gate", "").partition(":")[0],
            shares_sha256=packet.get("shares_sha256") or None,
            grabs=grabs,
            grab_total=total,
            grabbed_cents=amount - int(packet["remaining_cents"]),
            after=reading.next_cursor if reading.next_cursor >= 0 else None,
            version=int(packet.get("version", 0)),
        )

    @classmethod
    def from_rows(
        cls,
        packet: PacketRow,
        page: Sequence[GrabRow],
        totals: tuple[int, int],
        after: int | None,
        mark: PacketEpochRow | None,
    ) -> PacketView:
        """From the SQL record of a packet Redis no longer holds: a page of its grab rows,
        the number and sum of all of them, and its epoch (how often Redis lost it and it
        was rebuilt)."""
        total, grabbed = totals
        epoch = mark.epoch if mark else 0
        status = "active" if packet.status == "pending" else packet.status
        refunded = packet.refunded_cents
        return cls(
            packet_id=packet.packet_id,
            sender_id=packet.sender_id,
            amount_cents=packet.amount_cents,
            count=packet.count,
            strategy=packet.strategy,
            status=status,
            expires_ms=to_ms(packet.expires_at),
            refunded_cents=refunded,
            message=packet.message,
            recipients_count=packet.recipients_count,
            password_protected=packet.password_hash is not None,
            shares_sha256=packet.shares_sha256,
            grabs=[(g.user_id, g.amount_cents, to_ms(g.grabbed_at), g.seq) for g in page],
            grab_total=total,
            grabbed_cents=grabbed,
            after=after,
            version=packet_version(epoch, packet.count, total, status),
        )

    def next_cursor(self) -> str | None:
        """The cursor of the page after this one, while grabs may follow it."""
        return None if self.after is None else str(self.after)

    def page_body(self) -> list[wire.PacketGrab]:
        """The page's grabs as the API shows them."""
        return [_grab_body(grab) for grab in self.grabs]

    def body(self, revealed: Commitment | None, luckiest: str | None) -> wire.Packet:
        """The API's packet JSON: the first grabs, and once ended the commitment's shares
        and salt."""
        show = revealed is not None and bool(revealed.salt)
        return {
            "packet_id": self.packet_id,
            "sender_id": self.sender_id,
            "amount_cents": self.amount_cents,
            "count": self.count,
            "strategy": cast(wire.SplitStrategy, self.strategy),
            "status": cast(wire.PacketStatus, self.status),
            "remaining_count": self.count - self.grab_total,
            "remaining_cents": self.amount_cents - self.grabbed_cents,
            "refunded_cents": self.refunded_cents,
            "expires_at": iso_ms(self.expires_ms),
            "message": self.message,
            "recipients_count": self.recipients_count,
            "password_protected": self.password_protected,
            "shares_sha256": self.shares_sha256,
            "grabs": self.page_body(),
            "grabs_next_cursor": self.next_cursor(),
            "luckiest_user_id": luckiest,
            "shares": list(revealed.shares) if show and revealed else None,
            "salt": revealed.salt.hex() if show and revealed else None,
            "version": self.version,
        }
