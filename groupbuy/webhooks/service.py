"""WebhookService: what the admin API asks of webhooks, and the deliverer the process runs."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from groupbuy_client.wire import Outcome, iso_ms

from groupbuy import errors
from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.storage.events import FEED_COMMITTED
from groupbuy.webhooks import history, queue
from groupbuy.webhooks.addresses import host_problem, url_problem
from groupbuy.webhooks.deliverer import Deliverer, wall_clock_ms
from groupbuy.webhooks.sender import Sender
from groupbuy.webhooks.signing import headers
from groupbuy.webhooks.store import EndpointSpec, EndpointStore, secrets_in_use
from groupbuy.webhooks.thread import DelivererThread

TEST_EVENT = "webhook.test"


class WebhookService:
    """Endpoints, their deliveries, replays and test pings; `clock` gives epoch ms."""

    def __init__(
        self,
        database: Database,
        settings: WebhookSettings,
        clock: Callable[[], int] = wall_clock_ms,
        sender: Sender | None = None,
    ) -> None:
        self._db = database
        self.settings = settings
        self._clock = clock
        self.store = EndpointStore(database, clock, settings.secret_overlap_s)
        self.sender = sender or Sender(
            settings.timeout_s, settings.max_in_flight, settings.allow_private_networks
        )
        self.deliverer = Deliverer(database, settings, self.sender, clock)
        # With `own_thread`, a copy of it runs on a thread instead (start_delivering).
        self.thread: DelivererThread | None = None
        if settings.own_thread:
            self.thread = DelivererThread(database.url, database.timeout_s, settings, clock)

    def start_delivering(self) -> None:
        """Run the deliverer in the background: on its own thread with `own_thread`, else
        on this loop; events this process commits wake it at once (others' at its next
        poll)."""
        if self.thread is not None:
            self.thread.start()
        else:
            self.deliverer.start()
        self._db.on_commit(FEED_COMMITTED, self.wake)

    async def stop_delivering(self) -> None:
        """Stop the deliverer started by start_delivering (attempts in flight end first)."""
        self._db.off_commit(FEED_COMMITTED, self.wake)
        if self.thread is not None:
            await self.thread.stop()
        await self.deliverer.stop()

    def wake(self) -> None:
        """Start a delivery pass now (new work was queued)."""
        if self.thread is not None:
            self.thread.wake()
        self.deliverer.wake()

    async def check_url(self, url: str) -> None:
        """422 unless `url` is an allowed http(s) URL whose host resolves to addresses
        deliveries may reach."""
        problem = url_problem(url, self.settings.allow_http)
        if problem is None and not self.settings.allow_private_networks:
            problem = await host_problem(url)
        if problem is not None:
            raise errors.InvalidRequest(
                f"invalid body: url: {problem}", errors=[{"field": "url", "message": problem}]
            )

    async def create(self, spec: EndpointSpec) -> Outcome:
        """Register an endpoint (201 with its secret; 200 for the same again; 409)."""
        await self.check_url(spec.url)
        return await self.store.create(spec)

    async def get(self, endpoint_id: str) -> dict[str, Any]:
        """One endpoint, without its secret."""
        return await self.store.get(endpoint_id)

    async def page(self, cursor: str | None, limit: int) -> dict[str, Any]:
        """A page of endpoints by id."""
        return await self.store.page(cursor, limit)

    async def update(self, endpoint_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Change an endpoint; a new URL is checked like a registered one."""
        if "url" in changes:
            await self.check_url(changes["url"])
        shown = await self.store.update(endpoint_id, changes)
        if "url" in changes:
            await self.sender.forget(endpoint_id)
        return shown

    async def delete(self, endpoint_id: str) -> dict[str, Any]:
        """Remove an endpoint with its deliveries."""
        shown = await self.store.delete(endpoint_id)
        await self.sender.forget(endpoint_id)
        return shown

    async def rotate(self, endpoint_id: str) -> dict[str, Any]:
        """A new secret; the old one signs beside it for `secret_overlap_s`."""
        return await self.store.rotate(endpoint_id)

    async def deliveries(
        self, endpoint_id: str, status: str | None, cursor: str | None, limit: int
    ) -> dict[str, Any]:
        """An endpoint's deliveries, newest first, each with its newest attempts."""
        await self.store.get(endpoint_id)
        return await history.page(self._db, endpoint_id, status, cursor, limit)

    async def attempts(
        self, endpoint_id: str, webhook_id: str, cursor: str | None, limit: int
    ) -> dict[str, Any]:
        """One delivery's attempts, newest first, a page at a time."""
        await self.store.get(endpoint_id)
        return await history.attempts(self._db, endpoint_id, webhook_id, cursor, limit)

    async def replay(self, endpoint_id: str, after: int, until: int | None) -> dict[str, Any]:
        """Queue the feed's events `after < id <= until` for the endpoint again."""
        row = await self.store.row(endpoint_id)
        # Derive first: the replay covers every event up to the endpoint's position.
        await queue.derive(self._db, self._clock())
        upper = until if until is not None else 2**63 - 1
        types = json.loads(row.event_types)
        queued = await history.replay(self._db, endpoint_id, types, after, upper, self._clock())
        self.wake()
        return {"endpoint_id": endpoint_id, "after": after, "until": until, "queued": queued}

    async def test(self, endpoint_id: str) -> dict[str, Any]:
        """Send a `webhook.test` message now and answer with its attempt (not recorded as a
        delivery; whatever the endpoint subscribes to, enabled or not)."""
        row = await self.store.row(endpoint_id)
        now = self._clock()
        webhook_id = f"test_{secrets.token_hex(12)}"
        at = iso_ms(now)
        body = json.dumps(
            {
                "type": TEST_EVENT,
                "timestamp": at,
                "data": {"endpoint_id": endpoint_id, "at": at},
            },
            separators=(",", ":"),
        ).encode()
        signed = headers(secrets_in_use(row, now), webhook_id, now // 1000, body)
        reply = await self.sender.post(endpoint_id, row.url, body, signed)
        attempt: dict[str, Any] = {
            "webhook_id": webhook_id,
            "succeeded": reply.succeeded,
            "duration_ms": reply.duration_ms,
        }
        if reply.status_code is not None:
            attempt["status_code"] = reply.status_code
        else:
            attempt["error"] = reply.error
        attempt["answer"] = reply.answer.decode("utf-8", "replace")
        return attempt

    async def measure(self) -> dict[str, tuple[int, float]]:
        """Per endpoint: pending deliveries and the lag in seconds (for /metrics)."""
        return await history.backlog(self._db, self._clock())
