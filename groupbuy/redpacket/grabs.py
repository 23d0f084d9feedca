"""GrabService: the hot path, one packet_grab call per grab.

A grab is one Lua script that decides the share and appends the grab to the packet's
outbox stream (the write-behind turns it into a grab row and a ledger credit). When Redis
does not hold the packet, the grab asks the recovery handed in, and nothing else here
knows how a packet comes back.
"""

from __future__ import annotations

import secrets
from typing import Any, Protocol

from groupbuy import errors
from groupbuy.metrics import GRAB_OUTCOMES, counts_outcomes, grab_outcome
from groupbuy.redpacket.acks import AckJournal
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.common import REQUEST_TOKEN_BYTES, refuse
from groupbuy.redpacket.specs import PacketScripts


class MissingPacket(Protocol):
    """What a grab does when Redis does not hold the packet (RecoveryService does it)."""

    async def grab_missing(self, packet_id: str, user_id: str) -> dict[str, Any] | None:
        """Put the packet back in Redis and answer None (grab again), or answer the grab
        from SQL's record of the ended packet."""


class GrabService:
    """Grabs: one share per user and packet, decided by packet_grab."""

    def __init__(
        self,
        scripts: PacketScripts,
        acks: AckJournal,
        missing: MissingPacket,
        resend_window_ms: int = 60_000,
    ) -> None:
        self._packets = scripts
        self._acks = acks
        self._missing = missing
        self._resend_window_ms = resend_window_ms

    @counts_outcomes(GRAB_OUTCOMES, grab_outcome)
    async def grab(self, packet_id: str, user_id: str) -> dict[str, Any]:
        """Take one share for the user; a repeat answers `already_grabbed` with the same amount.

        Each request carries a fresh token into the script, stored with the grab: when the
        Redis client resends the call after a timeout and the first run did happen, the
        resend finds its own token and answers `grabbed` as the first run did.
        """
        token = secrets.token_urlsafe(REQUEST_TOKEN_BYTES)
        grab = (packet_id, user_id, token, self._resend_window_ms)
        reply = await self._packets.grab(*grab)
        if reply.code is PacketCode.PACKET_NOT_FOUND:
            answer = await self._missing.grab_missing(packet_id, user_id)
            if answer is not None:
                return answer
            reply = await self._packets.grab(*grab)
            if reply.code is PacketCode.PACKET_NOT_FOUND:
                raise errors.RedisUnavailable(f"packet {packet_id!r} is missing from Redis")
        if reply.code is PacketCode.OK:
            self._acks.note(
                packet_id, user_id, reply.epoch, reply.seq, reply.amount_cents, reply.grabbed_at_ms
            )
            return {
                "status": "grabbed",
                "amount_cents": reply.amount_cents,
                "remaining_count": reply.remaining_count,
            }
        if reply.code is PacketCode.ALREADY_GRABBED:
            return {"status": "already_grabbed", "amount_cents": reply.amount_cents}
        if reply.code is PacketCode.USER_BLOCKED:
            raise errors.UserBlocked(f"user {user_id!r} is blocked", user_id=user_id)
        refuse(reply.code, packet_id)
