"""A packet's shares, committed at send: drawn once, kept in SQL, proven by one SHA-256.

The commitment is SHA-256 over the salt (16 random bytes) followed by each share in grab
order as an 8-byte big-endian unsigned integer. The i-th share goes to the grab of seq i.
It is answered at send (`shares_sha256`); the shares and the salt are revealed once the
packet has ended, so anyone can check that the i-th grab got the i-th share
(docs/concepts.md has a verifier).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from groupbuy.redpacket.split import split

SALT_BYTES = 16
SHARE_BYTES = 8  # big-endian, unsigned: a share is at most max_amount_cents < 2**63


@dataclass(frozen=True)
class Commitment:
    """A packet's shares in grab order, its salt, and the digest that binds them."""

    shares: tuple[int, ...]
    salt: bytes

    @classmethod
    def draw(cls, strategy: str, amount_cents: int, count: int) -> Commitment:
        """Draw the shares (with `secrets`) and a fresh salt."""
        shares = split(strategy, amount_cents, count)
        return cls(tuple(shares), secrets.token_bytes(SALT_BYTES))

    @classmethod
    def unpack(cls, packed: bytes, salt: bytes) -> Commitment:
        """The commitment from its stored form (`packed`: the shares as `pack` wrote them)."""
        if len(packed) % SHARE_BYTES:
            raise ValueError(f"{len(packed)} bytes of shares is not a whole number of shares")
        shares = (
            int.from_bytes(packed[at : at + SHARE_BYTES], "big")
            for at in range(0, len(packed), SHARE_BYTES)
        )
        return cls(tuple(shares), salt)

    def pack(self) -> bytes:
        """The shares as stored and hashed: 8 bytes big-endian each, in grab order."""
        return b"".join(share.to_bytes(SHARE_BYTES, "big") for share in self.shares)

    @property
    def sha256(self) -> str:
        """The commitment: hex SHA-256 of the salt then the packed shares."""
        return hashlib.sha256(self.salt + self.pack()).hexdigest()

    def undrawn(self, taken: Iterable[int]) -> list[tuple[int, int]]:
        """What a rebuilt packet still holds: (seq, share) of every share whose seq no
        recorded grab has, in committed order. The i-th share is seq i: a grab Redis lost
        before SQL had it leaves its seq free, and the next grab takes that very share."""
        gone = set(taken)
        return [(seq, share) for seq, share in enumerate(self.shares, 1) if seq not in gone]


def holds(shares: Sequence[int], grabs: Iterable[tuple[int, int]]) -> bool:
    """True when every grab (seq, amount) got the share at its seq: the i-th share is seq i."""
    return all(1 <= seq <= len(shares) and shares[seq - 1] == amount for seq, amount in grabs)
