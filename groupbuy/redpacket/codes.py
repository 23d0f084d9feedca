"""Result codes of the packet_* scripts."""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class PacketCode(IntEnum):
    """Mirror of the code numbers at the top of lua/_packet_lib.lua."""

    OK = 0
    EXISTING = 1
    NOT_FOUND = 2
    ALREADY_GRABBED = 3
    SOLD_OUT = 4
    EXPIRED = 5
    NOT_DUE = 6


def split_reply(reply: list[Any]) -> tuple[PacketCode, list[Any]]:
    """(code, rest) of a script reply; an unknown code is a bug and raises."""
    return PacketCode(int(reply[0])), list(reply[1:])
