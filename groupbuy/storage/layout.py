"""Where the keys shared by many entities live: once on one Redis server, once per slot in
Redis Cluster.

Five indexes (sorted sets saying where background work waits), the dead-letter stream and
the copy of the blocked users the scripts read are not under any entity's hash tag. On
one Redis server each is one key. In Redis Cluster a script's keys must share one slot,
so each becomes one key per slot: its hash tag is a short string that lands in the slot
of the entity it serves (`slot_tag`), and a script passes those of its own entity's slot.
`Keys` asks its layout for these keys and for an entity's slot; everything that knows
about slots is here (and in groupbuy/storage/slots.py, the directory of slots in use).
"""

from __future__ import annotations

import string
from binascii import crc_hqx
from dataclasses import dataclass
from functools import cache
from typing import Protocol

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

SLOTS = REDIS_CLUSTER_HASH_SLOTS  # 16,384
_TAG_CHARS = (string.digits + string.ascii_letters).encode()

Slot = int | None
"""Which copy of a shared key: a cluster slot, or None on one Redis server (one copy)."""


@cache
def slot_tags() -> tuple[str, ...]:
    """For each of the 16,384 slots, a three-character tag (digits and letters) that Redis
    Cluster hashes to it: the hash tag of that slot's shared keys. Built once per process
    from the CRC's linearity instead of hashing ~240,000 candidates: the CRC of
    head + tail (2 bytes) is crc(tail) XOR crc(b"\0\0", starting from crc(head)), so for
    each slot it is enough to look up, for a few heads, the tail whose CRC completes it."""
    mask = SLOTS - 1
    tails: dict[int, bytes] = {}
    for first in _TAG_CHARS:
        for second in _TAG_CHARS:
            tail = bytes((first, second))
            tails.setdefault(crc_hqx(tail, 0) & mask, tail)
    heads = [(bytes((c,)), crc_hqx(b"\0\0", crc_hqx(bytes((c,)), 0)) & mask) for c in _TAG_CHARS]
    tags: list[str] = []
    for slot in range(SLOTS):
        tag = next(head + tails[slot ^ shift] for head, shift in heads if slot ^ shift in tails)
        tags.append(tag.decode())
    return tuple(tags)


def slot_tag(slot: int) -> str:
    """The hash tag (without braces) of the shared keys of `slot`."""
    return slot_tags()[slot]


class KeyLayout(Protocol):
    """Where the shared keys live, and which copy of them an entity's scripts use."""

    @property
    def cluster(self) -> bool:
        """Whether there is one copy of each shared key per slot (Redis Cluster)."""

    def slot_of(self, key: str) -> Slot:
        """Which copy of the shared keys the scripts touching `key` use."""

    def shared(self, prefix: str, name: str, slot: Slot) -> str:
        """The key `name` under `prefix`, in the copy `slot`."""


@dataclass(frozen=True)
class OneServer:
    """One Redis server: each shared key exists once, and every script uses it."""

    cluster = False

    def slot_of(self, key: str) -> Slot:
        """Always the one copy."""
        return None

    def shared(self, prefix: str, name: str, slot: Slot) -> str:
        """`<prefix>:<name>`."""
        return f"{prefix}:{name}"


@dataclass(frozen=True)
class ClusterLayout:
    """Redis Cluster: each shared key exists once per slot, under that slot's tag."""

    cluster = True

    def __post_init__(self) -> None:
        slot_tags()  # built at start-up rather than inside the first request

    def slot_of(self, key: str) -> Slot:
        """The cluster slot of `key`."""
        return key_slot(key.encode())

    def shared(self, prefix: str, name: str, slot: Slot) -> str:
        """`<prefix>:{<slot tag>}:<name>`; the slot must be named."""
        if slot is None:
            raise ValueError(f"in Redis Cluster there is one {name} key per slot: name the slot")
        return f"{prefix}:{{{slot_tag(slot)}}}:{name}"
