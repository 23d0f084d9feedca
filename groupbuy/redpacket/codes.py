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
    NOT_A_RECIPIENT = 9
    WRONG_PASSWORD = 10
    PASSWORD_LOCKED = 11
    SENDER_CANNOT_GRAB = 12
    WITHDRAWN = 13
    PACKET_ENDED = 14
    NOT_THE_SENDER = 15
