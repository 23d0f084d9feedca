"""The deliverer: derives deliveries from the feed, claims due ones in SQL, POSTs them, and
records what came of each, in every process that runs it (`groupbuy serve`, `groupbuy
worker`), sharing the work through the claims.

Each endpoint's attempts run as tasks of their own, at most `max_in_flight` at once: a
slow or dead endpoint holds only its own slots, never the loop or another endpoint's.
A finished attempt wakes the loop, so a fast endpoint's next deliveries go at once rather
than at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from groupbuy import metrics
from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks import queue
from groupbuy.webhooks.models import EndpointRow
from groupbuy.webhooks.queue import Claimed
from groupbuy.webhooks.sender import Reply, Sender
from groupbuy.webhooks.signing import headers
from groupbuy.webhooks.store import EndpointStore, secrets_in_use

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    """The process's clock in epoch milliseconds (production's; tests pass their own)."""
    return time.time_ns() // 1_000_000


class Deliverer:
    """Runs deliveries for every endpoint; `clock` gives epoch milliseconds."""

    def __init__(
        self,
        database: Database,
        settings: WebhookSettings,
        store: EndpointStore,
        sender: Sender,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._db = database
        self._settings = settings
        self._store = store
        self.sender = sender
        self._clock = clock
        self._claim_ms = round((settings.timeout_s + settings.claim_margin_s) * 1000)
        self._disable_after_ms = settings.disable_after_s * 1000
        self._in_flight: dict[str, set[asyncio.Task[None]]] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._stopping = False

    async def tick(self) -> int:
        """One pass: derive new deliveries, then claim and start what is due for every
        enabled endpoint with a free slot; returns how many attempts it started."""
        endpoints = await self._store.rows()
        if not endpoints:
            return 0
        now = self._clock()
        await queue.derive(self._db, now)
        started = 0
        for endpoint in endpoints:
            if endpoint.disabled:
                continue
            room = self._settings.max_in_flight - len(self._in_flight.get(endpoint.endpoint_id, ()))
            if room <= 0:
                continue
            claims = await queue.claim(
                self._db, endpoint.endpoint_id, now, self._settings.max_in_flight, self._claim_ms
            )
            for claimed in claims:
                self._start(endpoint, claimed)
            started += len(claims)
        return started

    def _start(self, endpoint: EndpointRow, claimed: Claimed) -> None:
        task = asyncio.create_task(self._attempt(endpoint, claimed))
        tasks = self._in_flight.setdefault(endpoint.endpoint_id, set())
        tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            tasks.discard(finished)
            self._wake.set()

        task.add_done_callback(done)

    async def _attempt(self, endpoint: EndpointRow, claimed: Claimed) -> None:
        try:
            await self._deliver(endpoint, claimed)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            # The claim expires and another pass (here or in another process) tries again.
            log.warning(
                "webhook delivery %s to %s could not be recorded: %s",
                claimed.webhook_id,
                endpoint.endpoint_id,
                type(error).__name__,
            )

    async def _deliver(self, endpoint: EndpointRow, claimed: Claimed) -> None:
        if len(claimed.body) > self._settings.max_payload_bytes:
            reason = f"payload_too_large: {len(claimed.body)} bytes"
            await queue.fail_unsendable(self._db, claimed, reason, self._clock())
            metrics.WEBHOOK_DELIVERIES.labels(endpoint.endpoint_id, "failed").inc()
            return
        sent_at = self._clock()
        signed = headers(
            secrets_in_use(endpoint, sent_at), claimed.webhook_id, sent_at // 1000, claimed.body
        )
        reply = await self.sender.post(endpoint.endpoint_id, endpoint.url, claimed.body, signed)
        metrics.WEBHOOK_ATTEMPT_SECONDS.labels(endpoint.endpoint_id).observe(
            reply.duration_ms / 1000
        )
        completion = await queue.complete(
            self._db, claimed, reply, self._clock(), self._disable_after_ms
        )
        metrics.WEBHOOK_DELIVERIES.labels(endpoint.endpoint_id, _outcome(reply, completion)).inc()
        if completion.disabled:
            log.warning(
                "webhook endpoint %s disabled (%s): its deliveries wait until it is enabled",
                endpoint.endpoint_id,
                completion.disabled,
            )

    def wake(self) -> None:
        """Start a pass now rather than at the next poll (new work was queued)."""
        self._wake.set()

    async def settle(self) -> None:
        """Wait for every attempt in flight to be recorded (tests, shutdown)."""
        while tasks := [t for group in self._in_flight.values() for t in group]:
            await asyncio.gather(*tasks, return_exceptions=True)

    def start(self) -> None:
        """Run passes in the background: after each attempt ends, else every poll interval."""
        self._stopping = False
        self._loop = asyncio.create_task(self._run(), name="webhook-deliverer")

    async def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                await self.tick()
            except Exception as error:  # SQL away: said by the database's reachability
                if not self._db.reachability.failed(error):
                    log.warning("webhook deliverer pass failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._settings.poll_interval_s)

    async def stop(self) -> None:
        """Stop passing, let the attempts in flight end (their claims would otherwise wait
        out their time), then close the connections."""
        self._stopping = True
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        try:
            async with asyncio.timeout(self._settings.timeout_s + 1):
                await self.settle()
        except TimeoutError:
            for group in self._in_flight.values():
                for task in group:
                    task.cancel()
        await self.sender.aclose()


def _outcome(reply: Reply, completion: queue.Completion) -> str:
    """The outcome label of an attempt: delivered, retrying, failed, or gone (a 410)."""
    if reply.succeeded:
        return "delivered"
    if reply.status_code == 410:
        return "gone"
    return "failed" if completion.status == "failed" else "retrying"
