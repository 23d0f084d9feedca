"""Result codes of the packet_* scripts and the one place that turns them into errors."""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NoReturn

from groupbuy import errors


class PacketCode(IntEnum):
    """Mirror of the code numbers at the top of lua/_packet_lib.lua."""

    OK = 0
    EXISTING = 1
    NOT_FOUND = 2
    ALREADY_GRABBED = 3
    SOLD_OUT = 4
    EXPIRED = 5
    NOT_DUE = 6
    USER_BLOCKED = 7
    LIMIT_EXCEEDED = 8


_ERRORS: dict[PacketCode, type[errors.GroupBuyError]] = {
    PacketCode.NOT_FOUND: errors.PacketNotFound,
    PacketCode.SOLD_OUT: errors.SoldOut,
    PacketCode.EXPIRED: errors.Expired,
    PacketCode.USER_BLOCKED: errors.UserBlocked,
    PacketCode.LIMIT_EXCEEDED: errors.LimitExceeded,
}


def raise_for(code: PacketCode, detail: str | None = None, **extra: Any) -> NoReturn:
    """Raise the API error that a failure code stands for."""
    error = _ERRORS.get(code)
    if error is None:
        raise RuntimeError(f"script code {code!r} has no error mapping")
    raise error(detail, **extra)
