"""hiredis's command packer, which AutoPipeline uses in place of redis-py's own."""

from __future__ import annotations

from typing import Any

import pytest
from hiredis import pack_command
from redis.asyncio.connection import Connection

# What ScriptCall.command() and ReplicaWait.command() hold: a sha, key and argument
# strings (non-ASCII ones too), integers of any size and sign, floats, bytes.
COMMANDS: list[tuple[Any, ...]] = [
    ("EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", 2, "gb:{a:1}:team", "k2", "user-1"),
    ("EVALSHA", "ab", 0, 0, -3, 7, 10**20, -(2**63), "ü€", "", b"raw\x00\xff"),
    ("EVALSHA", "ab", 1, "k", 1.5, 0.1, 1e-7, 123456789.125, float("inf")),
    ("WAIT", 1, 100),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c[0]}-{len(c)}")
def test_hiredis_pack_command_packs_as_redis_py_does(command: tuple[Any, ...]) -> None:
    """groupbuy/storage/pipelining.py, AutoPipeline._round_trip: a batch is packed with
    hiredis.pack_command, then sent with send_packed_command; Redis must receive the very
    bytes redis-py's own packer (Connection.pack_command) would have sent."""
    assert pack_command(command) == b"".join(Connection().pack_command(*command))
