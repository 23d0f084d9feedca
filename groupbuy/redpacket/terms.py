"""The terms a sender puts on a packet besides its money: who may grab it, with what
password, whether the sender may grab, and its greeting; how they are checked and stored.

The password is kept only as a salted SHA-256 (`password_hash`); the grab hands the
script the same digest of the password it was given, and the script compares them.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from groupbuy import errors

PASSWORD_SALT_BYTES = 16


def password_hash(salt_hex: str, password: str) -> str:
    """Hex SHA-256 of the salt's bytes then the password's UTF-8: what SQL and Redis keep,
    and what a grab sends its script to compare."""
    return hashlib.sha256(bytes.fromhex(salt_hex) + password.encode()).hexdigest()


@dataclass(frozen=True)
class Terms:
    """A send's terms as the caller gave them (the password in clear, never stored)."""

    message: str | None = None
    recipients: tuple[str, ...] = ()
    password: str | None = None
    sender_may_grab: bool = True

    def check(self, count: int) -> None:
        """Refuse (422) terms the packet cannot keep: a recipient twice, more shares than
        recipients (the body's model checks each id, the lengths and the characters)."""
        if len(set(self.recipients)) != len(self.recipients):
            raise errors.InvalidRequest("recipients lists a user twice")
        if self.recipients and count > len(self.recipients):
            raise errors.InvalidRequest(
                f"count ({count}) may be at most the number of recipients ({len(self.recipients)})"
            )

    def stored_password(self) -> tuple[str | None, str | None]:
        """(salt, hash) to store for the password, hex; (None, None) without one."""
        if self.password is None:
            return None, None
        salt = secrets.token_hex(PASSWORD_SALT_BYTES)
        return salt, password_hash(salt, self.password)

    def same_password(self, salt: str | None, stored: str | None) -> bool:
        """True when this password is the one stored (both absent counts as the same)."""
        if stored is None or salt is None:
            return self.password is None
        return self.password is not None and secrets.compare_digest(
            password_hash(salt, self.password), stored
        )


def pack_recipients(recipients: Sequence[str]) -> str:
    """The recipients as SQL keeps them: one id per line (ids hold no newline)."""
    return "\n".join(recipients)


def unpack_recipients(packed: str) -> list[str]:
    """The recipients from their SQL form."""
    return packed.split("\n") if packed else []
