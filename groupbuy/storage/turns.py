"""This process's SQLite writers, one at a time, the urgent ones first.

SQLite takes one writer at a time. Each writer of this process waits here for its turn
(handed over at once, where SQLite's busy handler would sleep in steps of up to 100 ms).
A transaction is urgent when an HTTP answer waits on it: a confirm (it answers only once
its member is in SQL), a deposit, a send, an admin change. Urgent writers go before every
waiting bulk transaction (the grabs' write-behind, the journal of answers, the webhooks'
queue), and wait at most for the one writing now. So a backlog left by an outage does
not hold back the calls that come after it.

Bulk writers are not starved: after `URGENT_IN_A_ROW` urgent turns in a row while a bulk
writer waits, the next turn is the bulk writer's.
"""

from __future__ import annotations

import asyncio
from collections import deque

# Urgent turns handed over in a row before a waiting bulk writer gets one. An urgent
# writer then waits for at most two transactions; the write-behind keeps draining under
# a steady stream of urgent writes.
URGENT_IN_A_ROW = 8


class WriterTurns:
    """A lock with two queues: an urgent waiter is handed the turn before any other that
    waits (up to URGENT_IN_A_ROW in a row); each queue is first come, first served."""

    def __init__(self) -> None:
        self._busy = False
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._other: deque[asyncio.Future[None]] = deque()
        self._urgent_run = 0  # urgent turns handed over in a row while others waited

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
        others_wait = any(not turn.done() for turn in self._other)
        if others_wait and self._urgent_run >= URGENT_IN_A_ROW:
            order = (self._other, self._urgent)
        else:
            order = (self._urgent, self._other)
        for queue in order:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)  # stays busy: the turn passes straight on
                    self._urgent_run = self._urgent_run + 1 if queue is self._urgent else 0
                    return
        self._busy = False
        self._urgent_run = 0
