"""Deliveries' POSTs: one pool of keep-alive connections per endpoint (groupbuy.webhooks.http1),
a deadline per attempt, no redirects, at most 64 KiB of an answer read.

One pool per endpoint keeps a dead endpoint's waiting connections from taking a healthy
one's.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass

from groupbuy.webhooks.addresses import AddressRefused
from groupbuy.webhooks.http1 import (
    ConnectFailed,
    ConnectionClosed,
    Origin,
    Pool,
    ProtocolError,
)

# The most of an answer's body read; the rest is not waited for (the connection is closed).
MAX_ANSWER_BYTES = 64 * 1024
# The most of it kept with the attempt.
KEPT_ANSWER_BYTES = 1024
USER_AGENT = "groupbuy-webhooks/1"


@dataclass(frozen=True)
class Reply:
    """What one POST came to: an HTTP status, or an error naming why there was none."""

    status_code: int | None
    error: str | None
    duration_ms: int
    answer: bytes  # the first KEPT_ANSWER_BYTES of the body
    retry_after: str | None = None

    @property
    def succeeded(self) -> bool:
        """A 2xx answer arrived in time."""
        return self.status_code is not None and 200 <= self.status_code < 300


class Sender:
    """POSTs deliveries: a pool of at most `max_connections` per endpoint, each attempt
    bounded by `timeout_s` from the first byte sent to the last one read. `ssl_context`
    checks https endpoints' certificates (the system's trust store by default)."""

    def __init__(
        self,
        timeout_s: float,
        max_connections: int,
        allow_private_networks: bool,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.allow_private_networks = allow_private_networks
        self._ssl_context = ssl_context
        self._pools: dict[str, Pool] = {}
        # Pools of endpoints whose URL changed, closing in the background.
        self._closing: set[asyncio.Future[None]] = set()

    def _pool(self, endpoint_id: str, url: str) -> Pool:
        pool = self._pools.get(endpoint_id)
        if pool is None or pool.url != url:
            if pool is not None:
                closing = asyncio.ensure_future(pool.aclose())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
            if self._ssl_context is None:  # made once, when first needed (it is slow)
                self._ssl_context = ssl.create_default_context()
            pool = Pool(
                url,
                Origin.of(url),
                size=self.max_connections,
                limit=MAX_ANSWER_BYTES,
                allow_private_networks=self.allow_private_networks,
                ssl_context=self._ssl_context,
                user_agent=USER_AGENT,
            )
            self._pools[endpoint_id] = pool
        return pool

    async def post(self, endpoint_id: str, url: str, body: bytes, headers: dict[str, str]) -> Reply:
        """POST `body` to `url`; never raises for what the endpoint or the network did."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = await self._pool(endpoint_id, url).post(body, headers)
        except TimeoutError:
            return self._failed(started, "timeout")
        except AddressRefused:
            return self._failed(started, "address_refused")
        except ConnectFailed:
            return self._failed(started, "connect_failed")
        except ConnectionClosed:
            return self._failed(started, "connection_closed")
        except (ProtocolError, OSError, ValueError) as error:
            return self._failed(started, f"connection_error: {type(error).__name__}")
        kept = answer.body[:KEPT_ANSWER_BYTES]
        return Reply(answer.status, None, _ms_since(started), kept, answer.retry_after)

    @staticmethod
    def _failed(started: float, error: str) -> Reply:
        """An attempt that ended without an answer, and why."""
        return Reply(None, error, _ms_since(started), b"")

    async def forget(self, endpoint_id: str) -> None:
        """Close an endpoint's pool (its URL changed, or it is gone)."""
        pool = self._pools.pop(endpoint_id, None)
        if pool is not None:
            await pool.aclose()

    async def aclose(self) -> None:
        """Close every pool."""
        for endpoint_id in list(self._pools):
            await self.forget(endpoint_id)
        if self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)


def _ms_since(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)
