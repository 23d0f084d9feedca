"""This process's SQLite writers, one at a time, the urgent ones first.

SQLite takes one writer at a time. Each writer of this process waits here for its turn
(handed over at once, where SQLite's busy handler would sleep in steps of up to 100 ms).
A confirm answers only once its member is in SQL, so the team write-behind's transactions
are urgent: they go before every waiting bulk transaction (the grabs' write-behind, the
journal of answers, the webhooks' queue), and wait at most for the one writing now.
"""

from __future__ import annotations

import asyncio
from collections import deque


class WriterTurns:
    """A lock with two queues: an urgent waiter is handed the turn before any other that
    waits; each queue is first come, first served."""

    def __init__(self) -> None:
        self._busy = False
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._other: deque[asyncio.Future[None]] = deque()

    async def acquire(self, urgent: bool = False) -> None:
        """Wait for the turn (cancellable: a cancelled waiter leaves its place, and a turn
        handed to it meanwhile goes on to the next)."""
        if not self._busy:
            self._busy = True
            return
        queue = self._urgent if urgent else self._other
        turn = asyncio.get_running_loop().create_future()
        queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed the turn as it was cancelled: pass it on
            elif turn in queue:
                queue.remove(turn)
            raise

    def release(self) -> None:
        """End the turn: hand it to the next urgent waiter, else to the next other one."""
        for queue in (self._urgent, self._other):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)  # stays busy: the turn passes straight on
                    return
        self._busy = False
