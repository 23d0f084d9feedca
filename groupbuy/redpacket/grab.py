"""The grab, whole: one user takes the next share of a packet (packet_grab), the hot path.

Its script's spec, its script call, the operation (`GrabService`) and its answers
(`grabbed`, `already_grabbed`; `refuse` for the others). A grab is one Lua script that
checks the packet's terms (recipients, password, the sender), decides the share and
appends the grab to the packet's outbox stream (the write-behind turns it into a grab row
and a ledger credit). When Redis does not hold the packet, the grab asks the recovery
handed in, and nothing else here knows how a packet comes back.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import NoReturn, Protocol

from groupbuy_client import wire
from redis.asyncio import Redis

from groupbuy import errors
from groupbuy.metrics import GRAB_OUTCOMES, counts_outcomes, grab_outcome
from groupbuy.redpacket.acks import AckJournal
from groupbuy.redpacket.codes import PacketCode, raise_for
from groupbuy.redpacket.specs import (
    NO_PACKET,
    OK,
    PACKET_ARGV,
    PACKET_KEYS,
    PACKET_NOT_FOUND,
    REQUEST_TOKEN_BYTES,
    PacketReply,
    PacketScripts,
)
from groupbuy.redpacket.terms import password_hash
from groupbuy.storage.keys import Keys
from groupbuy.storage.specs import ScriptSpec, shape, slots

_GRABBED = ("amount_cents", "remaining_count", "seq", "epoch", "grabbed_at_ms")

PACKET_GRAB = ScriptSpec(
    "packet_grab",
    "One user takes the next share of a packet, at most once.",
    keys=PACKET_KEYS,
    args=(
        *PACKET_ARGV,
        *slots(
            ("user_id", "the user"),
            ("request_token", "fresh for each grab request, stored with the grab"),
            ("resend_window_ms", "how long a resend with the same token answers the same"),
            ("password_digest", "password_hash(pw_salt, the password given); '' for none"),
        ),
    ),
    replies={
        OK: shape(
            "grabbed (or a resend found the grab its first run took)",
            *((name, int) for name in _GRABBED),
        ),
        PacketCode.ALREADY_GRABBED: shape("grabbed before, this amount", ("amount_cents", int)),
        PacketCode.USER_BLOCKED: shape("an admin blocked the user"),
        PacketCode.SENDER_CANNOT_GRAB: shape("the sender, and sender_may_grab was false"),
        PacketCode.NOT_A_RECIPIENT: shape("the packet has recipients and the user is not one"),
        PacketCode.SOLD_OUT: shape("every share is taken"),
        PacketCode.WITHDRAWN: shape("the sender withdrew it"),
        PacketCode.EXPIRED: shape("its time is up (the first call after it closes it)"),
        PacketCode.PASSWORD_LOCKED: shape("the user gave the wrong password too often"),
        PacketCode.WRONG_PASSWORD: shape(
            "the password is missing or wrong (a wrong one is counted)", ("attempts_left", int)
        ),
        PACKET_NOT_FOUND: NO_PACKET,
    },
)


async def packet_grab(
    packets: PacketScripts,
    packet_id: str,
    user_id: str,
    request_token: str,
    resend_window_ms: int,
    password_digest: str = "",
) -> PacketReply:
    """packet_grab (the hot path: one frame; its KEYS are kept per packet, and no caller
    changes a key list)."""
    args = {
        "packet_id": packet_id,
        "shift_ms": packets.clock.shift_ms,
        "user_id": user_id,
        "request_token": request_token,
        "resend_window_ms": resend_window_ms,
        "password_digest": password_digest,
    }
    keys = packets.packet_key_list(packet_id)
    return PACKET_GRAB.parse(
        await packets.caller.call(PACKET_GRAB.name, keys, PACKET_GRAB.arg_list(args))
    )


class MissingPacket(Protocol):
    """What a grab does when Redis does not hold the packet (RecoveryService does it)."""

    async def grab_missing(self, packet_id: str, user_id: str) -> wire.Grabbed | None:
        """Put the packet back in Redis and answer None (grab again), or answer the grab
        from SQL's record of the ended packet."""


# Password packets whose salt a process keeps (a flash grabs a few packets at a time).
SALTS_KEPT = 4096


class PasswordSalts:
    """Each password packet's salt, read from Redis once per process (it never changes:
    a rebuild writes the same salt back from SQL), so a grab can hash its password."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._salts: dict[str, str] = {}  # packet id -> salt; emptied past SALTS_KEPT

    async def digest(self, packet_id: str, password: str | None) -> str:
        """password_hash(the packet's salt, password); '' when no password is given, or
        the packet has none, or Redis does not hold it (the script then decides)."""
        if password is None:
            return ""
        salt = self._salts.get(packet_id)
        if salt is None:
            found = await self._redis.hget(self._keys.packet_keys(packet_id).terms, "pw_salt")
            if not found:
                return ""
            salt = found.decode() if isinstance(found, bytes) else str(found)
            if len(self._salts) >= SALTS_KEPT:
                self._salts.clear()
            self._salts[packet_id] = salt
        return password_hash(salt, password)


def nothing_recorded() -> None:
    """The `recorded` hook of a grab service that no write-behind follows (tools, tests)."""


class GrabService:
    """Grabs: one share per user and packet, decided by packet_grab; `recorded` is called
    after each grab that wrote a record to the packet's outbox stream."""

    def __init__(
        self,
        scripts: PacketScripts,
        acks: AckJournal,
        missing: MissingPacket,
        salts: PasswordSalts,
        resend_window_ms: int = 60_000,
        recorded: Callable[[], None] = nothing_recorded,
    ) -> None:
        self._packets = scripts
        self._acks = acks
        self._missing = missing
        self._salts = salts
        self._resend_window_ms = resend_window_ms
        self._recorded = recorded

    @counts_outcomes(GRAB_OUTCOMES, grab_outcome)
    async def grab(self, packet_id: str, user_id: str, password: str | None = None) -> wire.Grabbed:
        """Take one share for the user; a repeat answers `already_grabbed` with the same amount.

        Each request carries a fresh token into the script, stored with the grab: when the
        Redis client resends the call after a timeout and the first run did happen, the
        resend finds its own token and answers `grabbed` as the first run did. A password
        travels only as its salted digest.
        """
        token = secrets.token_urlsafe(REQUEST_TOKEN_BYTES)
        grab = (self._packets, packet_id, user_id, token, self._resend_window_ms)
        digest = "" if password is None else await self._salts.digest(packet_id, password)
        reply = await packet_grab(*grab, digest)
        if reply.code is PacketCode.PACKET_NOT_FOUND:
            answer = await self._missing.grab_missing(packet_id, user_id)
            if answer is not None:
                return answer
            reply = await packet_grab(*grab, await self._salts.digest(packet_id, password))
            if reply.code is PacketCode.PACKET_NOT_FOUND:
                raise errors.RedisUnavailable(f"packet {packet_id!r} is missing from Redis")
        if reply.code is PacketCode.OK:
            self._acks.note(
                packet_id, user_id, reply.epoch, reply.seq, reply.amount_cents, reply.grabbed_at_ms
            )
            self._recorded()  # the credit reaches SQL with the flush this starts
            return grabbed(reply.amount_cents, reply.remaining_count)
        if reply.code is PacketCode.ALREADY_GRABBED:
            return already_grabbed(reply.amount_cents)
        if reply.code is PacketCode.USER_BLOCKED:
            raise errors.UserBlocked(f"user {user_id!r} is blocked", user_id=user_id)
        if reply.code is PacketCode.WRONG_PASSWORD:
            left = reply.attempts_left
            raise errors.WrongPassword(
                f"wrong or missing password for packet {packet_id!r}; {left} attempts left",
                attempts_left=left,
            )
        refuse(reply.code, packet_id)


def grabbed(amount_cents: int, remaining_count: int) -> wire.Grabbed:
    """The answer of a grab that took a share now."""
    return {"status": "grabbed", "amount_cents": amount_cents, "remaining_count": remaining_count}


def already_grabbed(amount_cents: int) -> wire.Grabbed:
    """The answer of a grab by a user who grabbed this amount before."""
    return {"status": "already_grabbed", "amount_cents": amount_cents}


# What a refused grab's problem says, by code (the others: "packet 'p1' is sold out").
_REFUSALS = {
    PacketCode.SENDER_CANNOT_GRAB: "the sender of packet {} may not grab it",
    PacketCode.NOT_A_RECIPIENT: "packet {} is for its recipients only",
    PacketCode.PASSWORD_LOCKED: "too many wrong passwords for packet {}",
}


def refuse(code: PacketCode, packet_id: str) -> NoReturn:
    """Raise the API error of a grab refused with `code` (sold out, expired, not found...)."""
    told = _REFUSALS.get(code)
    if told is not None:
        raise_for(code, told.format(repr(packet_id)))
    raise_for(code, f"packet {packet_id!r} is {code.name.lower().replace('_', ' ')}")
