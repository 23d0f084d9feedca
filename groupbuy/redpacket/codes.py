"""Result codes of the packet_* scripts; a refusal's name is its HTTP problem code."""

from __future__ import annotations

from enum import IntEnum

from groupbuy.errors import raise_for

__all__ = ["PacketCode", "raise_for"]


class PacketCode(IntEnum):
    """Mirror of the code numbers in lua/_packet_codes.lua. A refusal is named after the API
    error it becomes (SOLD_OUT: errors.SoldOut, problem sold_out; `raise_for`)."""

    OK = 0
    EXISTING = 1
    PACKET_NOT_FOUND = 2
    ALREADY_GRABBED = 3
    SOLD_OUT = 4
    EXPIRED = 5
    NOT_DUE = 6
    USER_BLOCKED = 7
    LIMIT_EXCEEDED = 8
