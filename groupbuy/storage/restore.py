"""One rebuilder at a time for state that Redis lost and SQL still knows as live.

A packet or a team that Redis no longer has is rebuilt from SQL by the first caller that
notices; the others that notice at the same moment wait for it instead of rebuilding it a
second time. The lock lives under the same hash tag as what it guards, and the rebuild
script itself refuses to overwrite what exists, so a lock that ran out changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import LockError

from groupbuy import errors

# Long enough for the SQL reads and one script call; a holder that dies frees it by then.
LOCK_TTL_S = 10.0
# How long a caller waits for another one's rebuild before it answers 503.
WAIT_S = 5.0


@contextlib.asynccontextmanager
async def rebuilding(redis: Any, lock_key: str, state_key: str) -> AsyncIterator[bool]:
    """Hold the rebuild lock of one packet or team; yields True when the caller must rebuild
    (`state_key` is still missing), False when another caller rebuilt it meanwhile."""
    lock = redis.lock(lock_key, timeout=LOCK_TTL_S, sleep=0.02, blocking_timeout=WAIT_S)
    if not await lock.acquire():
        raise errors.RedisUnavailable(f"{state_key} is being rebuilt from SQL; retry")
    try:
        yield not await redis.exists(state_key)
    finally:
        with contextlib.suppress(LockError):
            await lock.release()
