"""The HTTP client of deliveries (aiohttp): one connection pool per endpoint, a deadline per
attempt, no redirects, at most 64 KiB of an answer read.

aiohttp rather than httpx: on this machine an aiohttp session drove ~5,000 requests/s where
httpx's pool managed 350-950 (docs/webhooks.md); one pool per endpoint keeps a dead
endpoint's waiting connections from taking a healthy one's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from groupbuy.webhooks.addresses import AddressRefused, guarded_socket

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
    bounded by `timeout_s` from the first byte sent to the last one read."""

    def __init__(
        self, timeout_s: float, max_connections: int, allow_private_networks: bool
    ) -> None:
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.allow_private_networks = allow_private_networks
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    def _session(self, endpoint_id: str) -> aiohttp.ClientSession:
        session = self._sessions.get(endpoint_id)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections,
                socket_factory=None if self.allow_private_networks else guarded_socket,
                # The address check must see every connection's address: no cached
                # answer should outlive a change of the name's records by much.
                ttl_dns_cache=10,
            )
            session = aiohttp.ClientSession(
                connector=connector,
                # One deadline for the whole attempt is set around it (asyncio.timeout).
                timeout=aiohttp.ClientTimeout(total=None),
                headers={"user-agent": USER_AGENT},
                auto_decompress=False,
                trust_env=False,
            )
            self._sessions[endpoint_id] = session
        return session

    async def post(self, endpoint_id: str, url: str, body: bytes, headers: dict[str, str]) -> Reply:
        """POST `body` to `url`; never raises for what the endpoint or the network did."""
        started = time.perf_counter()
        status: int | None = None
        retry_after: str | None = None
        answer = b""
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self._session(endpoint_id).post(
                    url,
                    data=body,
                    headers={**headers, "content-type": "application/json"},
                    allow_redirects=False,
                )
                complete = False
                try:
                    status = response.status
                    retry_after = response.headers.get("retry-after")
                    answer, complete = await _read_bounded(response)
                finally:
                    # Unread bytes beyond the bound are not drained: the connection goes.
                    if complete:
                        response.release()
                    else:
                        response.close()
        except TimeoutError:
            return self._reply(started, status, "timeout", answer, retry_after)
        except aiohttp.ClientConnectorError as error:
            refused = isinstance(error.os_error, AddressRefused)
            return self._reply(
                started, None, "address_refused" if refused else "connect_failed", b"", None
            )
        except AddressRefused:
            return self._reply(started, None, "address_refused", b"", None)
        except aiohttp.ServerDisconnectedError:
            return self._reply(started, status, "connection_closed", answer, retry_after)
        except (aiohttp.ClientError, OSError) as error:
            return self._reply(started, status, _error_name(error), answer, retry_after)
        return self._reply(started, status, None, answer, retry_after)

    @staticmethod
    def _reply(
        started: float,
        status: int | None,
        error: str | None,
        answer: bytes,
        retry_after: str | None,
    ) -> Reply:
        duration_ms = round((time.perf_counter() - started) * 1000)
        # An answer cut short (a timeout or a close while reading it) has no status to trust.
        kept_status = status if error is None else None
        return Reply(kept_status, error, duration_ms, answer[:KEPT_ANSWER_BYTES], retry_after)

    async def forget(self, endpoint_id: str) -> None:
        """Close an endpoint's pool (its URL changed, or it is gone)."""
        session = self._sessions.pop(endpoint_id, None)
        if session is not None:
            await session.close()

    async def aclose(self) -> None:
        """Close every pool."""
        for endpoint_id in list(self._sessions):
            await self.forget(endpoint_id)


async def _read_bounded(response: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """Up to MAX_ANSWER_BYTES of the body, and whether that was all of it."""
    chunks: list[bytes] = []
    size = 0
    while size < MAX_ANSWER_BYTES:
        chunk = await response.content.read(MAX_ANSWER_BYTES - size)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), response.content.at_eof()


def _error_name(error: BaseException) -> str:
    return f"connection_error: {type(error).__name__}"
