"""The deliverer on a thread of its own (`webhooks.own_thread`): its own event loop, SQL
engine and HTTP pools, so a request loop kept full by the API does not leave deliveries
only the gaps between requests. The GIL is still one per process: the two loops share a
core's worth of Python between them (docs/benchmarks-findings.md has the figures).

Claims, ordering and per-endpoint limits are the in-loop deliverer's own (the same
Deliverer runs on the thread); only where it runs changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks.deliverer import Deliverer, wall_clock_ms
from groupbuy.webhooks.sender import Sender

# How long start-up on the thread (an engine, a pool) may take before stop gives up on it.
READY_TIMEOUT_S = 30.0


class DelivererThread:
    """Runs a Deliverer on a thread with its own loop and connections to `url`."""

    def __init__(
        self,
        url: str,
        timeout_s: float,
        settings: WebhookSettings,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._settings = settings
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._deliverer: Deliverer | None = None

    def start(self) -> None:
        """Start the thread; its deliverer begins passing as soon as its loop runs."""
        self._ready.clear()
        self._thread = threading.Thread(target=self._main, name="webhook-deliverer", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        try:
            await self._deliver()
        finally:
            self._ready.set()  # stop waits for this, even when start-up failed

    async def _deliver(self) -> None:
        database = Database(self._url, self._timeout_s)
        sender = Sender(
            self._settings.timeout_s,
            self._settings.max_in_flight,
            self._settings.allow_private_networks,
        )
        deliverer = Deliverer(database, self._settings, sender, self._clock)
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._deliverer = deliverer
        deliverer.start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            # Stop lets the attempts in flight end and gives unattempted claims back.
            await deliverer.stop()
            await database.dispose()

    def wake(self) -> None:
        """Start a pass now (callable from any thread); before the loop runs, its first
        pass looks anyway."""
        loop, deliverer = self._loop, self._deliverer
        if loop is not None and deliverer is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended: nothing to wake
                loop.call_soon_threadsafe(deliverer.wake)

    async def stop(self) -> None:
        """Stop the deliverer as the in-loop one stops (attempts in flight end, claims not
        attempted are given back), then join the thread."""
        thread = self._thread
        if thread is None:
            return
        await asyncio.to_thread(self._ready.wait, READY_TIMEOUT_S)
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop ended already (start failed)
                loop.call_soon_threadsafe(stop.set)
        await asyncio.to_thread(thread.join)
        self._thread = None
        self._loop = self._stop = self._deliverer = None
