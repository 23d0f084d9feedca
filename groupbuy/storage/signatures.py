"""The signatures of signed requests seen lately, kept in Redis so a replay is refused by
every API process alike."""

from __future__ import annotations

from typing import Any

from groupbuy.storage.keys import Keys


class SeenSignatures:
    """One Redis key per accepted signature, set only if absent, expiring after `ttl_ms`."""

    def __init__(self, redis: Any, keys: Keys, ttl_ms: int) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_ms = ttl_ms

    async def first_use(self, signature: str) -> bool:
        """Record the signature; True the first time, False when it was seen before."""
        # SET NX PX in one command: two requests racing with one signature cannot both win.
        created = await self._redis.set(
            self._keys.seen_signature(signature), b"1", nx=True, px=self._ttl_ms
        )
        return bool(created)
