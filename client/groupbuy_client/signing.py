"""Request signatures (signed requests): what is signed and how, shared by the server and
`groupbuy_client.client`.

A signed request carries `X-Groupbuy-Timestamp` (Unix seconds) and `X-Groupbuy-Signature`,
the lowercase hex HMAC-SHA256 keyed by the API key's secret over

    METHOD \\n TARGET \\n TIMESTAMP \\n BODYHASH

where TARGET is the path as sent, then `?` and the raw query string only when there is
one, and BODYHASH the lowercase hex SHA-256 of the body bytes (of b"" without a body).
Only the standard library is used here: callers install the client without the server.
"""

from __future__ import annotations

import hashlib
import hmac

TIMESTAMP_HEADER = "X-Groupbuy-Timestamp"
SIGNATURE_HEADER = "X-Groupbuy-Signature"
SIGNED_SUFFIX = "+signed"
"""Written after a key's role (`service+signed:<secret>`): that key must sign its requests."""


def body_hash(body: bytes) -> str:
    """The lowercase hex SHA-256 of the body bytes (of b"" when there is no body)."""
    return hashlib.sha256(body).hexdigest()


def target_of(path: bytes, query: bytes) -> bytes:
    """The TARGET of a request: the path as sent, with `?query` only when there is a query."""
    return path + b"?" + query if query else path


def canonical_request(method: str, target: bytes, timestamp: str, body: bytes) -> bytes:
    """The bytes a signature covers: METHOD, TARGET, TIMESTAMP and BODYHASH, one per line."""
    return b"\n".join(
        (method.encode("ascii"), target, timestamp.encode("ascii"), body_hash(body).encode())
    )


def signature(secret: str, method: str, target: bytes, timestamp: str, body: bytes) -> str:
    """The lowercase hex HMAC-SHA256 of the canonical request, keyed by the key's secret."""
    message = canonical_request(method, target, timestamp, body)
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
