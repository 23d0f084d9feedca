"""One shape for a packet, whichever store it is read from, and its API body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from groupbuy.redpacket.codec import parse_grab
from groupbuy.redpacket.models import GrabRow, PacketRow
from groupbuy.storage.timefmt import iso_ms, to_ms


@dataclass(frozen=True)
class PacketView:
    """A packet as either store holds it (Redis live, SQL once Redis let it go), in one shape."""

    packet_id: str
    sender_id: str
    amount_cents: int
    count: int
    strategy: str
    status: str  # active | sold_out | expired (a pending send reads as active)
    expires_ms: int
    refunded_cents: int
    grabs: list[tuple[str, int, int]]  # (user, cents, grabbed_at_ms), in grab order

    @classmethod
    def from_redis(
        cls, packet_id: str, fields: dict[str, str], grabs: dict[str, str]
    ) -> PacketView:
        """From the packet hash and the grabs hash (user -> codec.grab_value)."""
        ordered = sorted((parse_grab(value), user) for user, value in grabs.items())
        return cls(
            packet_id=packet_id,
            sender_id=fields["sender_id"],
            amount_cents=int(fields["amount"]),
            count=int(fields["count"]),
            strategy=fields["strategy"],
            status=fields["status"],
            expires_ms=int(fields["expires_ms"]),
            refunded_cents=int(fields.get("refunded", 0)),
            grabs=[(user, grab.amount_cents, grab.grabbed_at_ms) for grab, user in ordered],
        )

    @classmethod
    def from_sql(cls, row: PacketRow, grabs: list[GrabRow]) -> PacketView:
        """From the packet's row and its grab rows in seq order."""
        return cls(
            packet_id=row.packet_id,
            sender_id=row.sender_id,
            amount_cents=row.amount_cents,
            count=row.count,
            strategy=row.strategy,
            status="active" if row.status == "pending" else row.status,
            expires_ms=to_ms(row.expires_at),
            refunded_cents=row.refunded_cents,
            grabs=[(g.user_id, g.amount_cents, to_ms(g.grabbed_at)) for g in grabs],
        )

    def body(self) -> dict[str, Any]:
        """The API's packet JSON; `luckiest_user_id` once sold out (ties: the earlier grab)."""
        grabbed = sum(cents for _user, cents, _at in self.grabs)
        luckiest = None
        if self.status == "sold_out" and self.grabs:
            # max() keeps the first of equals: ties go to the earlier grab
            luckiest = max(self.grabs, key=lambda grab: grab[1])[0]
        return {
            "packet_id": self.packet_id,
            "sender_id": self.sender_id,
            "amount_cents": self.amount_cents,
            "count": self.count,
            "strategy": self.strategy,
            "status": self.status,
            "remaining_count": self.count - len(self.grabs),
            "remaining_cents": self.amount_cents - grabbed,
            "refunded_cents": self.refunded_cents,
            "expires_at": iso_ms(self.expires_ms),
            "grabs": [
                {"user_id": user, "amount_cents": cents, "grabbed_at": iso_ms(at)}
                for user, cents, at in self.grabs
            ],
            "luckiest_user_id": luckiest,
        }
