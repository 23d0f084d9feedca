"""Typed wrappers of the packet_* scripts.

The contracts below are the only place that knows the order of these scripts' KEYS and
ARGV (docs/scripts.md is rendered from them; tests/lua/test_contracts.py checks the
`local` lines of the scripts against them). A wrapper takes named keys and arguments and
answers the reply parsed into the dataclass of its shape (replies.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from groupbuy.redpacket.replies import (
    AdmitReply,
    CreateReply,
    ExpireReply,
    GrabReply,
    ReadReply,
    RestoreReply,
    Unadmitted,
    admit_reply,
    create_reply,
    expire_reply,
    grab_reply,
    read_reply,
    restore_reply,
    unadmit_reply,
)
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.contracts import ScriptCaller, ScriptContract, Slot, slots
from groupbuy.storage.keys import Keys

# The KEYS and ARGV every packet script starts with (named in lua/_packet_lib.lua).
PACKET_KEYS = slots(
    ("packet_hash", "the packet's state hash"),
    ("packet_shares", "list of the amounts still to grab, in grab order"),
    ("packet_grabs", "hash user -> 'seq|amount_cents|grabbed_at_ms|request token'"),
    ("packet_outbox", "the packet's outbox stream"),
    ("packet_pending", "pending index: zset packet_id -> ms of its oldest outbox record"),
    ("packet_due", "due index: zset packet_id -> expires_ms (active packets only)"),
    ("packet_blocklist", "blocked users hash (the copy of the packet's slot in a cluster)"),
)
PACKET_ARGV = slots(
    ("packet_id", "the packet"),
    ("shift_ms", "clock shift in ms (0 in production)"),
)
# What packet_create and packet_restore write of the packet, as SQL records it.
_RECORDED = slots(
    ("sender_id", "the sender"),
    ("amount_cents", "the packet's amount"),
    ("count", "number of shares"),
    ("strategy", "how the amount was split"),
    ("created_ms", "when it was sent"),
    ("expires_ms", "when it expires"),
    ("retention_ms", "how long the keys outlive the expiry"),
)

PACKET_CREATE = ScriptContract(
    "packet_create",
    "Put a sent packet and its pre-drawn shares in Redis, idempotently.",
    keys=PACKET_KEYS,
    argv=(*PACKET_ARGV, *_RECORDED),
    more_argv=Slot("shares", "the shares in grab order (count of them, summing to amount)"),
    reply="`{OK}` created, `{EXISTING}` already there (nothing changed).",
)
PACKET_RESTORE = ScriptContract(
    "packet_restore",
    "Rebuild a live packet that Redis has lost, from its SQL record, once.",
    keys=PACKET_KEYS,
    argv=(
        *PACKET_ARGV,
        *_RECORDED,
        *slots(
            ("epoch", "SQL's epoch, already raised (records of the lost epoch are fenced out)"),
            ("seq_gap", "the highest recorded seq minus the number of recorded grabs"),
            ("version", "above every version the lost state can have had"),
            ("grab_count", "the number of recorded grabs"),
        ),
    ),
    more_argv=Slot(
        "grabs",
        "grab_count pairs (user_id, 'seq|amount|at_ms'), then the shares still to grab",
    ),
    reply="`{OK, status}` rebuilt (active or sold_out), `{EXISTING}` Redis has it.",
)
PACKET_GRAB = ScriptContract(
    "packet_grab",
    "One user takes the next share of a packet, at most once.",
    keys=PACKET_KEYS,
    argv=(
        *PACKET_ARGV,
        *slots(
            ("user_id", "the user"),
            ("request_token", "fresh for each grab request, stored with the grab"),
            ("resend_window_ms", "how long a resend with the same token answers the same"),
        ),
    ),
    reply=(
        "`{OK, amount_cents, remaining_count, seq, epoch, grabbed_at_ms}`, "
        "`{ALREADY_GRABBED, amount_cents}`, `{USER_BLOCKED}`, `{SOLD_OUT}`, `{EXPIRED}`, "
        "`{NOT_FOUND}`."
    ),
)
PACKET_READ = ScriptContract(
    "packet_read",
    "A packet's state and grabs after the lazy expiry check.",
    keys=PACKET_KEYS,
    argv=PACKET_ARGV,
    reply="`{OK, packet hash flat, grabs hash flat, now_ms}` or `{NOT_FOUND}`.",
)
PACKET_EXPIRE = ScriptContract(
    "packet_expire",
    "Close a packet whose time is up and record its refund, exactly once.",
    keys=PACKET_KEYS,
    argv=PACKET_ARGV,
    reply=("`{OK, refunded_cents}`, `{NOT_DUE, expires_ms}`, `{EXISTING, status}`, `{NOT_FOUND}`."),
)
PACKET_ADMIT = ScriptContract(
    "packet_admit",
    "Let a send past the sender's checks (blocklist, daily caps) before any money moves.",
    keys=slots(
        ("blocklist", "blocked users hash (the copy of the sender's slot in a cluster)"),
        ("sender_day", "the sender's hash for this UTC day (Keys.sender_day)"),
    ),
    argv=slots(
        ("sender_id", "the sender"),
        ("packet_id", "the packet"),
        ("amount_cents", "the packet's amount"),
        ("daily_count_cap", "sends per day (0: no cap)"),
        ("daily_amount_cap", "cents per day (0: no cap)"),
        ("day_expire_at_ms", "when the day's hash expires"),
        ("request_token", "fresh for each send request"),
    ),
    reply=(
        "`{OK, 1}` counted by this request, `{OK, 0}` nothing counted, `{USER_BLOCKED}`, "
        "`{LIMIT_EXCEEDED, cap name, current, cap}`."
    ),
)
PACKET_UNADMIT = ScriptContract(
    "packet_unadmit",
    "Take back a send packet_admit counted when the send did not happen.",
    keys=slots(("sender_day", "the sender's hash for that UTC day")),
    argv=slots(("packet_id", "the packet")),
    reply="`{OK, 1}` taken back, `{OK, 0}` it was not counted.",
)
CONTRACTS = (
    PACKET_CREATE,
    PACKET_RESTORE,
    PACKET_GRAB,
    PACKET_READ,
    PACKET_EXPIRE,
    PACKET_ADMIT,
    PACKET_UNADMIT,
)


class PacketScripts:
    """The packet scripts of one registry, called with named keys and arguments; each answers
    its reply parsed (replies.py)."""

    def __init__(self, scripts: ScriptCaller, keys: Keys, clock: RedisClock) -> None:
        self._scripts = scripts
        self._keys = keys
        self._clock = clock
        # A flash grab hits the same packets again and again: their KEYS, in the contract's
        # order, are worked out once per packet rather than on every grab.
        self._grab_keys = lru_cache(maxsize=4096)(self._packet_key_list)

    def _packet_key_list(self, packet_id: str) -> list[str]:
        return PACKET_GRAB.key_list(self._keys.packet_keys(packet_id))

    async def _packet(
        self,
        contract: ScriptContract,
        packet_id: str,
        more: Sequence[Any] = (),
        **args: Any,
    ) -> list[Any]:
        keys = contract.key_list(self._keys.packet_keys(packet_id))
        named = {"packet_id": packet_id, "shift_ms": self._clock.shift_ms, **args}
        reply: list[Any] = await contract.call(self._scripts, keys, named, more)
        return reply

    async def create(self, packet_id: str, shares: Sequence[int], **recorded: Any) -> CreateReply:
        """packet_create; `recorded`: the packet as SQL records it (sender_id ... retention_ms)."""
        return create_reply(await self._packet(PACKET_CREATE, packet_id, shares, **recorded))

    async def restore(
        self, packet_id: str, grabs_then_shares: Sequence[Any], **fields: Any
    ) -> RestoreReply:
        """packet_restore."""
        reply = await self._packet(PACKET_RESTORE, packet_id, grabs_then_shares, **fields)
        return restore_reply(reply)

    async def grab(
        self, packet_id: str, user_id: str, request_token: str, resend_window_ms: int
    ) -> GrabReply:
        """packet_grab (the hot path: one frame; its KEYS are kept per packet, and no caller
        changes a key list)."""
        args = {
            "packet_id": packet_id,
            "shift_ms": self._clock.shift_ms,
            "user_id": user_id,
            "request_token": request_token,
            "resend_window_ms": resend_window_ms,
        }
        keys = self._grab_keys(packet_id)
        return grab_reply(
            await self._scripts.call(PACKET_GRAB.name, keys, PACKET_GRAB.arg_list(args))
        )

    async def read(self, packet_id: str) -> ReadReply:
        """packet_read."""
        return read_reply(await self._packet(PACKET_READ, packet_id))

    async def expire(self, packet_id: str) -> ExpireReply:
        """packet_expire."""
        return expire_reply(await self._packet(PACKET_EXPIRE, packet_id))

    async def admit(self, blocklist: str, sender_day: str, **args: Any) -> AdmitReply:
        """packet_admit."""
        keys = PACKET_ADMIT.key_list(blocklist=blocklist, sender_day=sender_day)
        return admit_reply(await PACKET_ADMIT.call(self._scripts, keys, args))

    async def unadmit(self, sender_day: str, packet_id: str) -> Unadmitted:
        """packet_unadmit."""
        keys = PACKET_UNADMIT.key_list(sender_day=sender_day)
        args = {"packet_id": packet_id}
        return unadmit_reply(await PACKET_UNADMIT.call(self._scripts, keys, args))
