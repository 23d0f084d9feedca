"""The packet scripts called through their wrappers (PacketScripts), with the key layout
the service uses, at a clock shift a test moves: the harness of the tests in tests/lua/."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.grab import packet_grab
from groupbuy.redpacket.send import packet_create
from groupbuy.redpacket.specs import PacketReply, PacketScripts
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import Keys
from groupbuy.storage.specs import Reply, Scripts

PID = "pk1"
RETENTION_MS = 3_600_000
WINDOW_MS = 30_000  # packet_grab's resend window

# The replies that are a code alone.
OK = Reply(PacketCode.OK)
EXISTING = Reply(PacketCode.EXISTING)
PACKET_NOT_FOUND = Reply(PacketCode.PACKET_NOT_FOUND)
SOLD_OUT = Reply(PacketCode.SOLD_OUT)
EXPIRED = Reply(PacketCode.EXPIRED)
USER_BLOCKED = Reply(PacketCode.USER_BLOCKED)


class Harness:
    """Calls the packet scripts with the service's key layout at a controllable time shift."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.scripts = Scripts(redis)
        self.clock = RedisClock()
        self.packets = PacketScripts(self.scripts, Keys("t"), self.clock)
        self.keys = Keys("t").packet_keys(PID)
        self.tokens = 0

    @property
    def shift_ms(self) -> int:
        return self.clock.shift_ms

    @shift_ms.setter
    def shift_ms(self, value: int) -> None:
        self.clock.shift_ms = value

    async def now_ms(self) -> int:
        return await self.clock.now_ms(self.redis)

    async def grab(self, user: str, token: str | None = None, digest: str = "") -> PacketReply:
        """packet_grab as the service calls it: a fresh request token unless one is given."""
        self.tokens += 1
        token = token or f"tok{self.tokens}"
        return await packet_grab(self.packets, PID, user, token, WINDOW_MS, digest)

    async def create(
        self, shares: list[int], ttl_ms: int = 60_000, recipients: Sequence[str] = (), **terms: Any
    ) -> PacketReply:
        now = await self.now_ms()
        return await packet_create(
            self.packets,
            PID,
            shares,
            recipients,
            **(plain_terms(len(recipients)) | terms),
            sender_id="sender",
            amount_cents=sum(shares),
            count=len(shares),
            strategy="double_mean",
            created_ms=now,
            expires_ms=now + ttl_ms,
            retention_ms=RETENTION_MS,
        )

    async def records(self) -> list[dict[str, str]]:
        return [fields for _id, fields in await self.redis.xrange(self.keys.outbox)]


def plain_terms(recipients: int = 0) -> dict[str, Any]:
    """The terms of a packet without a greeting, password or commitment (RECORDED's tail)."""
    return {
        "message": "",
        "shares_sha256": "",
        "recipients_count": recipients,
        "gate": "r" if recipients else "",
        "pw_salt": "",
        "pw_hash": "",
    }
