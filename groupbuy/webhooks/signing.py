"""Standard Webhooks signatures: `webhook-id`, `webhook-timestamp` and `webhook-signature`.

The signed content is `<webhook-id>.<webhook-timestamp>.<body>`, the key the bytes the
secret's base64 part encodes, the signature `v1,<base64 HMAC-SHA256>`; while a rotated-out
secret still overlaps, one signature per secret, space-separated (standardwebhooks.com).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
# 24 random bytes: within the 24-64 bytes the specification recommends.
SECRET_BYTES = 24


def new_secret() -> str:
    """A fresh endpoint secret, `whsec_<base64 of 24 random bytes>`."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key a `whsec_...` secret stands for (the bytes its base64 part encodes)."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)


def signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64>` signature of a message with one secret."""
    content = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(
    secrets_in_use: list[str], webhook_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt, signed with every secret in use (the
    current one first)."""
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(
            signature(secret, webhook_id, timestamp, body) for secret in secrets_in_use
        ),
    }
