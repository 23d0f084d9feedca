"""Group commit: callers waiting for their owners' records to reach SQL share rounds.

A round writes what several owners (activities) have waiting, in as few transactions as
the records allow, and answers each owner's callers as soon as that owner's records are
committed. One round runs at a time in a lane; a caller arriving meanwhile joins the
lane's round that is gathering (every record written before it joined is in that round's
reads). With one lane for every owner (SQLite, one writer at a time), N concurrent
confirms of any number of activities cost about two rounds, not N transactions queueing
for the writer; with a lane per owner (PostgreSQL, writers side by side), each activity's
confirms share their own rounds, and activities do not wait for each other. Nothing
waits on purpose: a round starts as soon as the previous one ends, and how much one
transaction takes is the writer's bound (its batch size).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Waiters = dict[str, asyncio.Future[int]]
"""A round's owners, in the order they joined, each with the future its callers await:
the number of its records the round applied."""


@dataclass
class _Round:
    """A round: its owners' futures, the task that runs it, and the error it ended with
    (one met after its owners' records were committed: an acknowledgement that failed)."""

    waiters: Waiters = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    error: Exception | None = None


def _retrieved(future: asyncio.Future[int]) -> None:
    # Every caller of an owner may have been cancelled: its error is then nobody's to see.
    if not future.cancelled():
        future.exception()


class GroupCommit:
    """Rounds of `commit(waiters)`, one at a time in each lane; `commit` resolves each owner's
    future once that owner's records are in SQL (those it leaves unresolved get its error,
    or 0). `lane(owner)` names the owner's lane: one lane for all shares rounds across
    owners; a lane per owner lets owners' rounds run side by side."""

    def __init__(
        self, commit: Callable[[Waiters], Awaitable[None]], lane: Callable[[str], str]
    ) -> None:
        self._commit = commit
        self._lane = lane
        self._gathering: dict[str, _Round] = {}  # per lane: the next round, not started yet
        self._running: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def join(self, owner: str, settled: bool = True) -> int:
        """Wait for the owner's records written before this call to reach SQL; how many the
        round applied. `settled`: wait for the whole round too, its work after the commit
        included (a drain's caller), and raise its error; else return once committed (an
        answer that waits on SQL). The round runs in its own task: a cancelled caller never
        interrupts it mid-SQL."""
        lane = self._lane(owner)
        round_ = self._gathering.get(lane)
        if round_ is None:
            round_ = self._gathering[lane] = _Round()
            task = asyncio.create_task(self._run(lane, self._running.get(lane), round_))
            self._tasks.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(self._tasks.discard)
            round_.task = task
        future = round_.waiters.get(owner)
        if future is None:
            future = round_.waiters[owner] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieved)
        applied = await asyncio.shield(future)
        if settled and round_.task is not None:
            await asyncio.shield(round_.task)
            if round_.error is not None:
                raise round_.error
        return applied

    async def _run(self, lane: str, previous: asyncio.Task[None] | None, round_: _Round) -> None:
        me = asyncio.current_task()
        assert me is not None
        waiters = round_.waiters
        try:
            if previous is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(previous)
            if self._gathering.get(lane) is round_:
                del self._gathering[lane]  # from here on, callers join the round after this
            self._running[lane] = me
            await self._commit(waiters)
        except asyncio.CancelledError:
            for future in waiters.values():
                future.cancel()
            raise
        except Exception as error:
            round_.error = error
            for future in waiters.values():
                if not future.done():
                    future.set_exception(error)
        else:
            for future in waiters.values():
                if not future.done():
                    future.set_result(0)
        finally:
            if self._gathering.get(lane) is round_:
                del self._gathering[lane]
            if self._running.get(lane) is me:
                del self._running[lane]
