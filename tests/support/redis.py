"""Redis clients for the tests: fakeredis with Lua, or a real server by URL."""

from __future__ import annotations

from typing import Any

import fakeredis
import redis.asyncio as aioredis


def make_async_redis(url: str) -> Any:
    """A fresh asyncio client: fakeredis on its own server when `url` is empty."""
    if not url:
        return fakeredis.FakeAsyncRedis(
            server=fakeredis.FakeServer(version=(7, 0)), decode_responses=True
        )
    return aioredis.Redis.from_url(url, decode_responses=True, max_connections=512)
