"""The send's admission, in Redis before any money moves: the sender's block and daily
caps (packet_admit), and taking a count back when the send then does not happen
(packet_unadmit). Their specs and calls are here."""

from __future__ import annotations

import secrets
from typing import Any

from groupbuy import errors
from groupbuy.redpacket.codes import PacketCode, raise_for
from groupbuy.redpacket.models import PacketRow
from groupbuy.redpacket.specs import OK, REQUEST_TOKEN_BYTES, PacketReply, PacketScripts
from groupbuy.settings import RedPacketSettings
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.specs import ScriptSpec, flag, shape, slots

# A UTC day in ms, and how long a sender's day counters outlive their day (a send that read
# the clock just before midnight still finds them).
DAY_MS = 86_400_000
DAY_KEY_SLACK_MS = 3_600_000

PACKET_ADMIT = ScriptSpec(
    "packet_admit",
    "Let a send past the sender's checks (blocklist, daily caps) before any money moves.",
    keys=slots(
        ("blocklist", "blocked users hash (the copy of the sender's slot in a cluster)"),
        ("sender_day", "the sender's hash for this UTC day (Keys.sender_day)"),
    ),
    args=slots(
        ("sender_id", "the sender"),
        ("packet_id", "the packet"),
        ("amount_cents", "the packet's amount"),
        ("daily_count_cap", "sends per day (0: no cap)"),
        ("daily_amount_cap", "cents per day (0: no cap)"),
        ("day_expire_at_ms", "when the day's hash expires"),
        ("request_token", "fresh for each send request"),
    ),
    replies={
        OK: shape(
            "let through; counted: this request counted it in the sender's day (take it "
            "back if the send does not happen)",
            ("counted", flag),
        ),
        PacketCode.USER_BLOCKED: shape("an admin blocked the sender"),
        PacketCode.LIMIT_EXCEEDED: shape(
            "the send would pass the cap `limit`; current: what the sender sent today",
            ("limit", str),
            ("current", int),
            ("cap", int),
        ),
    },
)
PACKET_UNADMIT = ScriptSpec(
    "packet_unadmit",
    "Take back a send packet_admit counted when the send did not happen.",
    keys=slots(("sender_day", "the sender's hash for that UTC day")),
    args=slots(("packet_id", "the packet")),
    replies={OK: shape("taken_back: 0 when the send was not counted", ("taken_back", flag))},
)


async def packet_admit(
    packets: PacketScripts, blocklist: str, sender_day: str, **args: Any
) -> PacketReply:
    """packet_admit."""
    keys = PACKET_ADMIT.key_list(blocklist=blocklist, sender_day=sender_day)
    return await PACKET_ADMIT.run(packets.caller, keys, args)


async def packet_unadmit(packets: PacketScripts, sender_day: str, packet_id: str) -> PacketReply:
    """packet_unadmit."""
    keys = PACKET_UNADMIT.key_list(sender_day=sender_day)
    return await PACKET_UNADMIT.run(packets.caller, keys, {"packet_id": packet_id})


class Admission(UsesBackends):
    """The sender's checks before a send debits anything, and their take-back."""

    def __init__(
        self, backends: Backends, scripts: PacketScripts, limits: RedPacketSettings
    ) -> None:
        super().__init__(backends)
        self._packets = scripts
        self._limits = limits

    async def admit(self, sender_id: str, packet_id: str, amount_cents: int, now_ms: int) -> bool:
        """The send's first step, in Redis before any money moves: a blocked sender is refused
        (403) and the sender's daily caps are checked and counted atomically (409); True when
        this call counted the send (take it back if the send then does not happen)."""
        limits, day = self._limits, now_ms // DAY_MS
        admitted = await packet_admit(
            self._packets,
            self._keys.blocked_users(self._keys.sender_slot(sender_id)),
            self._keys.sender_day(sender_id, day),
            sender_id=sender_id,
            packet_id=packet_id,
            amount_cents=amount_cents,
            daily_count_cap=limits.sender_daily_count,
            daily_amount_cap=limits.sender_daily_amount_cents,
            day_expire_at_ms=(day + 1) * DAY_MS + DAY_KEY_SLACK_MS,
            # A resent call (the reply was lost) finds its own count: still "counted by this
            # send", so a send that then fails in SQL still takes it back.
            request_token=secrets.token_urlsafe(REQUEST_TOKEN_BYTES),
        )
        if admitted.code is PacketCode.OK:
            return bool(admitted.counted)
        if admitted.code is PacketCode.LIMIT_EXCEEDED:
            async with self._db.sessions() as session:
                if await session.get(PacketRow, packet_id) is not None:
                    return False  # a repeat of a send counted on an earlier day: answer it
            limit, current, cap = admitted.limit, admitted.current, admitted.cap
            raise_for(
                admitted.code,
                f"sender {sender_id!r} has sent {current} of the {limit} cap ({cap}) today (UTC)",
                limit=limit,
                current=current,
                cap=cap,
            )
        raise errors.UserBlocked(f"sender {sender_id!r} is blocked", user_id=sender_id)

    async def unadmit(self, sender_id: str, packet_id: str, now_ms: int) -> None:
        """Take back what admit counted for a send that did not happen."""
        key = self._keys.sender_day(sender_id, now_ms // DAY_MS)
        await packet_unadmit(self._packets, key, packet_id)
