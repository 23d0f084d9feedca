"""The packet scripts' replies, parsed: one frozen dataclass per reply shape, named fields.

The wrappers in scripts.py turn each `{code, ...}` list into one of these, so nothing
outside this module reads a reply by position. A code that a script's contract does not
list is a bug and raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from groupbuy.redpacket.codes import PacketCode
from groupbuy.storage.scripts import reply_dict


@dataclass(frozen=True)
class CodeOnly:
    """A reply that is its code alone: `{OK}` or `{EXISTING}` of packet_create, `{EXISTING}`
    of packet_restore, `{NOT_FOUND}`, `{USER_BLOCKED}`, `{SOLD_OUT}`, `{EXPIRED}`."""

    code: PacketCode


@dataclass(frozen=True)
class Restored:
    """packet_restore rebuilt the packet; `status` is active, or sold_out when every share
    was already recorded."""

    code: ClassVar[PacketCode] = PacketCode.OK
    status: str


@dataclass(frozen=True)
class Grabbed:
    """packet_grab took a share for the user (or a resend found the one its first run took)."""

    code: ClassVar[PacketCode] = PacketCode.OK
    amount_cents: int
    remaining_count: int
    seq: int
    epoch: int
    grabbed_at_ms: int


@dataclass(frozen=True)
class AlreadyGrabbed:
    """packet_grab: the user grabbed this packet before, this amount."""

    code: ClassVar[PacketCode] = PacketCode.ALREADY_GRABBED
    amount_cents: int


@dataclass(frozen=True)
class PacketState:
    """packet_read: the packet hash and its grabs hash (user -> grab value), at `now_ms`."""

    code: ClassVar[PacketCode] = PacketCode.OK
    packet: dict[str, str]
    grabs: dict[str, str]
    now_ms: int


@dataclass(frozen=True)
class Closed:
    """packet_expire closed the packet now and recorded the refund of `refunded_cents`."""

    code: ClassVar[PacketCode] = PacketCode.OK
    refunded_cents: int


@dataclass(frozen=True)
class NotDue:
    """packet_expire: the packet's time is not up until `expires_ms`."""

    code: ClassVar[PacketCode] = PacketCode.NOT_DUE
    expires_ms: int


@dataclass(frozen=True)
class Ended:
    """packet_expire: the packet had already ended, as `status` (sold_out or expired)."""

    code: ClassVar[PacketCode] = PacketCode.EXISTING
    status: str


@dataclass(frozen=True)
class Admitted:
    """packet_admit let the send through; `counted` when this request counted it in the
    sender's day (take it back if the send then does not happen)."""

    code: ClassVar[PacketCode] = PacketCode.OK
    counted: bool


@dataclass(frozen=True)
class OverCap:
    """packet_admit: the send would pass the cap `limit` (its name); `current` is what the
    sender sent today in the cap's unit."""

    code: ClassVar[PacketCode] = PacketCode.LIMIT_EXCEEDED
    limit: str
    current: int
    cap: int


@dataclass(frozen=True)
class Unadmitted:
    """packet_unadmit; `taken_back` is False when the send was not counted."""

    code: ClassVar[PacketCode] = PacketCode.OK
    taken_back: bool


CreateReply = CodeOnly
RestoreReply = Restored | CodeOnly
GrabReply = Grabbed | AlreadyGrabbed | CodeOnly
ReadReply = PacketState | CodeOnly
ExpireReply = Closed | NotDue | Ended | CodeOnly
AdmitReply = Admitted | OverCap | CodeOnly

R = TypeVar("R")
Shapes = Mapping[PacketCode, Callable[[list[Any]], R]]


def _code_only(code: PacketCode) -> Callable[[list[Any]], CodeOnly]:
    return lambda _rest: CodeOnly(code)


def _parse(script: str, reply: list[Any], shapes: Shapes[R]) -> R:
    # An IntEnum hashes as its int: the reply's code finds its shape without building the
    # enum member first (this runs on every grab).
    shape = shapes.get(reply[0])
    if shape is None:
        code = PacketCode(int(reply[0]))
        raise RuntimeError(f"{script} answered {code!r}, which its contract does not list")
    return shape(reply[1:])


def _codes(*codes: PacketCode) -> dict[PacketCode, Callable[[list[Any]], CodeOnly]]:
    return {code: _code_only(code) for code in codes}


_CREATE: Shapes[CreateReply] = _codes(PacketCode.OK, PacketCode.EXISTING)
_RESTORE: Shapes[RestoreReply] = {
    PacketCode.OK: lambda rest: Restored(str(rest[0])),
    **_codes(PacketCode.EXISTING),
}
_GRAB: Shapes[GrabReply] = {
    PacketCode.OK: lambda rest: Grabbed(*map(int, rest)),
    PacketCode.ALREADY_GRABBED: lambda rest: AlreadyGrabbed(int(rest[0])),
    **_codes(PacketCode.USER_BLOCKED, PacketCode.SOLD_OUT, PacketCode.EXPIRED),
    **_codes(PacketCode.NOT_FOUND),
}
_READ: Shapes[ReadReply] = {
    PacketCode.OK: lambda rest: PacketState(reply_dict(rest[0]), reply_dict(rest[1]), int(rest[2])),
    **_codes(PacketCode.NOT_FOUND),
}
_EXPIRE: Shapes[ExpireReply] = {
    PacketCode.OK: lambda rest: Closed(int(rest[0])),
    PacketCode.NOT_DUE: lambda rest: NotDue(int(rest[0])),
    PacketCode.EXISTING: lambda rest: Ended(str(rest[0])),
    **_codes(PacketCode.NOT_FOUND),
}
_ADMIT: Shapes[AdmitReply] = {
    PacketCode.OK: lambda rest: Admitted(bool(int(rest[0]))),
    PacketCode.LIMIT_EXCEEDED: lambda rest: OverCap(str(rest[0]), int(rest[1]), int(rest[2])),
    **_codes(PacketCode.USER_BLOCKED),
}
_UNADMIT: Shapes[Unadmitted] = {PacketCode.OK: lambda rest: Unadmitted(bool(int(rest[0])))}


def create_reply(reply: list[Any]) -> CreateReply:
    """packet_create's reply: `{OK}` created, `{EXISTING}` already there."""
    return _parse("packet_create", reply, _CREATE)


def restore_reply(reply: list[Any]) -> RestoreReply:
    """packet_restore's reply."""
    return _parse("packet_restore", reply, _RESTORE)


def grab_reply(reply: list[Any]) -> GrabReply:
    """packet_grab's reply."""
    return _parse("packet_grab", reply, _GRAB)


def read_reply(reply: list[Any]) -> ReadReply:
    """packet_read's reply."""
    return _parse("packet_read", reply, _READ)


def expire_reply(reply: list[Any]) -> ExpireReply:
    """packet_expire's reply."""
    return _parse("packet_expire", reply, _EXPIRE)


def admit_reply(reply: list[Any]) -> AdmitReply:
    """packet_admit's reply."""
    return _parse("packet_admit", reply, _ADMIT)


def unadmit_reply(reply: list[Any]) -> Unadmitted:
    """packet_unadmit's reply."""
    return _parse("packet_unadmit", reply, _UNADMIT)
