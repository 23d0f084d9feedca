"""Callers waiting for their owners' records share group-commit rounds."""

from __future__ import annotations

import asyncio

import pytest

from groupbuy.storage.groupcommit import GroupCommit, Waiters


def ONE_LANE(_owner: str) -> str:  # noqa: N802 - read as a constant
    return ""


class Recorder:
    """A commit that records each round's owners and can be held or made to fail."""

    def __init__(self) -> None:
        self.rounds: list[list[str]] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.fail: Exception | None = None

    async def commit(self, waiters: Waiters) -> None:
        self.rounds.append(list(waiters))
        await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        for n, future in enumerate(waiters.values()):
            future.set_result(n + 1)


async def test_callers_at_once_share_one_round_whatever_their_owner() -> None:
    recorder = Recorder()
    rounds = GroupCommit(recorder.commit, ONE_LANE)
    got = await asyncio.gather(*(rounds.join(owner) for owner in ["a", "b", "a", "c"]))
    assert recorder.rounds == [["a", "b", "c"]]
    assert got == [1, 2, 1, 3]  # callers of one owner get that owner's result


async def test_a_caller_during_a_round_joins_the_next_one() -> None:
    recorder = Recorder()
    recorder.hold.clear()
    rounds = GroupCommit(recorder.commit, ONE_LANE)
    first = asyncio.create_task(rounds.join("a"))
    await asyncio.sleep(0.01)  # the round has read its owners and is writing
    later = [asyncio.create_task(rounds.join(owner)) for owner in ["a", "b", "b"]]
    await asyncio.sleep(0.01)
    assert recorder.rounds == [["a"]]  # the next round waits for this one to end
    recorder.hold.set()
    await asyncio.gather(first, *later)
    assert recorder.rounds == [["a"], ["a", "b"]]


async def test_a_failed_round_fails_its_callers_and_the_next_round_runs() -> None:
    recorder = Recorder()
    recorder.fail = RuntimeError("SQL is away")
    rounds = GroupCommit(recorder.commit, ONE_LANE)
    results = await asyncio.gather(rounds.join("a"), rounds.join("b"), return_exceptions=True)
    assert [str(r) for r in results] == ["SQL is away", "SQL is away"]
    recorder.fail = None
    assert await rounds.join("a") == 1


async def test_owners_the_commit_leaves_unresolved_get_zero() -> None:
    async def nothing(waiters: Waiters) -> None:
        del waiters

    assert await GroupCommit(nothing, ONE_LANE).join("a") == 0


async def test_a_cancelled_caller_does_not_cancel_the_round() -> None:
    recorder = Recorder()
    recorder.hold.clear()
    rounds = GroupCommit(recorder.commit, ONE_LANE)
    leaving = asyncio.create_task(rounds.join("a"))
    staying = asyncio.create_task(rounds.join("a"))
    await asyncio.sleep(0.01)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    recorder.hold.set()
    assert await asyncio.wait_for(staying, 1) == 1
    assert recorder.rounds == [["a"]]


async def test_owners_in_lanes_of_their_own_do_not_wait_for_each_other() -> None:
    release = asyncio.Event()
    rounds_seen: list[list[str]] = []

    async def commit(waiters: Waiters) -> None:
        rounds_seen.append(list(waiters))
        if "a" in waiters:
            await release.wait()  # a's round is slow
        for future in waiters.values():
            future.set_result(1)

    rounds = GroupCommit(commit, lambda owner: owner)
    slow = asyncio.create_task(rounds.join("a"))
    await asyncio.sleep(0.01)
    assert await asyncio.wait_for(rounds.join("b"), 1) == 1  # not behind a's round
    later = asyncio.create_task(rounds.join("a"))  # a's next round waits for its first
    await asyncio.sleep(0.01)
    assert rounds_seen == [["a"], ["b"]] and not slow.done()
    release.set()
    assert list(await asyncio.gather(slow, later)) == [1, 1]
    assert rounds_seen == [["a"], ["b"], ["a"]]


async def test_a_committed_caller_goes_on_before_the_round_ends_a_settled_one_after() -> None:
    """Work after the owners' results (the acknowledgements) holds only settled callers,
    and its failure reaches them alone."""
    after, failure = asyncio.Event(), RuntimeError("the acknowledgement failed")

    async def commit(waiters: Waiters) -> None:
        for future in waiters.values():
            future.set_result(1)  # committed
        await after.wait()
        raise failure

    rounds = GroupCommit(commit, ONE_LANE)
    settled = asyncio.create_task(rounds.join("a"))
    assert await rounds.join("a", settled=False) == 1
    await asyncio.sleep(0.01)
    assert not settled.done()
    after.set()
    with pytest.raises(RuntimeError) as raised:
        await settled
    assert raised.value is failure


async def test_the_next_round_starts_once_the_one_before_has_answered() -> None:
    """A round's work after its answers (the acknowledgements) runs beside the next round;
    a settled caller of a later round waits for it."""
    after = asyncio.Event()
    rounds_seen: list[list[str]] = []

    async def commit(waiters: Waiters) -> None:
        rounds_seen.append(list(waiters))
        for future in waiters.values():
            future.set_result(1)
        if len(rounds_seen) == 1:
            await after.wait()  # the first round's acknowledgements take their time

    rounds = GroupCommit(commit, ONE_LANE)
    first = asyncio.create_task(rounds.join("a"))
    await asyncio.sleep(0.01)
    assert await rounds.join("b", settled=False) == 1  # ran while the first still works
    assert rounds_seen == [["a"], ["b"]] and not first.done()
    settled = asyncio.create_task(rounds.join("c"))  # a drain: waits for the work before too
    await asyncio.sleep(0.01)
    assert rounds_seen == [["a"], ["b"], ["c"]] and not settled.done()
    after.set()
    assert await first == 1 and await settled == 1
