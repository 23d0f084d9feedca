"""Records ended attempts in batches: the attempts that end while one batch is being
written go together into the next, one transaction each, so a fast endpoint's throughput
is not one commit per delivery."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from groupbuy.webhooks.outcomes import Completion, Outcome

Write = Callable[[list[Outcome]], Awaitable[list[Completion]]]


class Recorder:
    """Batches `record` calls into `write` calls; each caller gets its own completion (or
    the batch's error)."""

    def __init__(self, write: Write) -> None:
        self._write = write
        self._waiting: list[tuple[Outcome, asyncio.Future[Completion]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(self, outcome: Outcome) -> Completion:
        """Record one ended attempt with whatever else ends meanwhile."""
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._waiting.append((outcome, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                await asyncio.sleep(0)  # the attempts ending in this turn join the batch
                batch, self._waiting = self._waiting, []
                try:
                    completions = await self._write([outcome for outcome, _ in batch])
                except Exception as error:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                except asyncio.CancelledError:
                    for _, future in batch:
                        future.cancel()
                    raise
                for (_, future), completion in zip(batch, completions, strict=True):
                    if not future.done():
                        future.set_result(completion)
        finally:
            self._writer = None

    async def aclose(self) -> None:
        """Stop writing; callers still waiting get CancelledError."""
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        for _, future in self._waiting:
            future.cancel()
        self._waiting = []
