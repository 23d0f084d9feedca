"""Group commit: callers waiting for their owners' records to reach SQL share rounds.

A round writes what several owners (activities) have waiting, in as few transactions as
the records allow, and answers each owner's callers as soon as that owner's records are
committed. A lane's rounds follow each other: one starts once the one before has
answered its callers, while that one's work after its commit (the acknowledgements in
Redis) goes on beside it. A caller arriving meanwhile joins the lane's round that is
gathering (every record written before it joined is in that round's reads). With one
lane for every owner (SQLite, one writer at a time), N concurrent confirms of any number
of activities cost about two rounds, not N transactions queueing for the writer; with a
lane per owner (PostgreSQL, writers side by side), each activity's confirms share their
own rounds, and activities do not wait for each other. Nothing waits on purpose: a round
starts as soon as the previous one has answered, and how much one transaction takes is
the writer's bound (its batch size).
"""

from __future__ import annotations

import asyncio
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
    # The lane's rounds still running when this one was made: a settled caller waits for
    # them too (their acknowledgements may still be on their way).
    before: set[asyncio.Task[None]] = field(default_factory=set)
    error: Exception | None = None
    # Set once every owner's future is resolved (or the round ended): the next round of
    # the lane starts then, while this one's work after the commit goes on.
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    def watch(self) -> None:
        """Set `answered` once every owner's future is resolved (the owners are final)."""
        futures = list(self.waiters.values())

        def check(_future: object = None) -> None:
            if all(future.done() for future in futures):
                self.answered.set()

        for future in futures:
            future.add_done_callback(check)
        check()


def _retrieved(future: asyncio.Future[int]) -> None:
    # Every caller of an owner may have been cancelled: its error is then nobody's to see.
    if not future.cancelled():
        future.exception()


class GroupCommit:
    """Rounds of `commit(waiters)`, one after another in each lane; `commit` resolves each owner's
    future once that owner's records are in SQL (those it leaves unresolved get its error,
    or 0). `lane(owner)` names the owner's lane: one lane for all shares rounds across
    owners; a lane per owner lets owners' rounds run side by side."""

    def __init__(
        self, commit: Callable[[Waiters], Awaitable[None]], lane: Callable[[str], str]
    ) -> None:
        self._commit = commit
        self._lane = lane
        self._gathering: dict[str, _Round] = {}  # per lane: the next round, not started yet
        self._running: dict[str, _Round] = {}  # per lane: the newest round started
        self._tasks: dict[str, set[asyncio.Task[None]]] = {}  # per lane: rounds running

    async def join(self, owner: str, settled: bool = True) -> int:
        """Wait for the owner's records written before this call to reach SQL; how many the
        round applied. `settled`: wait for the whole round too, its work after the commit
        included (a drain's caller), and raise its error; else return once committed (an
        answer that waits on SQL). The round runs in its own task: a cancelled caller never
        interrupts it mid-SQL."""
        lane = self._lane(owner)
        round_ = self._gathering.get(lane)
        if round_ is None:
            running = self._tasks.setdefault(lane, set())
            round_ = self._gathering[lane] = _Round(before=set(running))
            task = asyncio.create_task(self._run(lane, self._running.get(lane), round_))
            running.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(lambda done: self._forget(lane, done))
            round_.task = task
        future = round_.waiters.get(owner)
        if future is None:
            future = round_.waiters[owner] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieved)
        applied = await asyncio.shield(future)
        if settled and round_.task is not None:
            await asyncio.wait({round_.task, *round_.before})  # a cancelled wait stops none
            if round_.error is not None:
                raise round_.error
        return applied

    def _forget(self, lane: str, task: asyncio.Task[None]) -> None:
        """A round of the lane ended: no longer running (nor the lane, with none left)."""
        running = self._tasks.get(lane)
        if running is not None:
            running.discard(task)
            if not running:
                del self._tasks[lane]

    async def _run(self, lane: str, previous: _Round | None, round_: _Round) -> None:
        waiters = round_.waiters
        try:
            if previous is not None:
                await previous.answered.wait()
            if self._gathering.get(lane) is round_:
                del self._gathering[lane]  # from here on, callers join the round after this
            self._running[lane] = round_
            round_.watch()
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
            round_.answered.set()
            if self._gathering.get(lane) is round_:
                del self._gathering[lane]
            if self._running.get(lane) is round_:
                del self._running[lane]
