"""SQLite writers of one process take turns, urgent ones (an answer waits) first."""

from __future__ import annotations

import asyncio

import pytest

from groupbuy.storage.turns import URGENT_IN_A_ROW, WriterTurns


async def _take(turns: WriterTurns, name: str, urgent: bool, order: list[str]) -> None:
    await turns.acquire(urgent)
    order.append(name)
    await asyncio.sleep(0)
    turns.release()


async def test_an_urgent_writer_goes_before_the_others_waiting() -> None:
    turns = WriterTurns()
    await turns.acquire()  # a bulk transaction writing now
    order: list[str] = []
    waiting = [
        asyncio.create_task(_take(turns, "bulk1", False, order)),
        asyncio.create_task(_take(turns, "bulk2", False, order)),
        asyncio.create_task(_take(turns, "urgent1", True, order)),
        asyncio.create_task(_take(turns, "urgent2", True, order)),
    ]
    await asyncio.sleep(0.01)
    assert order == []  # nobody writes while the turn is held
    turns.release()
    await asyncio.gather(*waiting)
    assert order == ["urgent1", "urgent2", "bulk1", "bulk2"]


async def test_a_writer_cancelled_while_waiting_leaves_its_place() -> None:
    turns = WriterTurns()
    await turns.acquire()
    order: list[str] = []
    gone = asyncio.create_task(_take(turns, "gone", True, order))
    after = asyncio.create_task(_take(turns, "after", False, order))
    await asyncio.sleep(0.01)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    turns.release()
    await asyncio.wait_for(after, 1)
    assert order == ["after"]
    await asyncio.wait_for(turns.acquire(), 1)  # free again: nobody holds it


async def test_a_turn_handed_to_a_cancelled_writer_passes_on() -> None:
    turns = WriterTurns()
    await turns.acquire()
    first = asyncio.create_task(turns.acquire(urgent=True))
    order: list[str] = []
    second = asyncio.create_task(_take(turns, "second", False, order))
    await asyncio.sleep(0.01)
    turns.release()  # handed to `first`, which is cancelled before it runs
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)
    assert order == ["second"]


async def test_timeout_while_waiting_frees_nothing_it_did_not_hold() -> None:
    turns = WriterTurns()
    await turns.acquire()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await turns.acquire(urgent=True)
    order: list[str] = []
    other = asyncio.create_task(_take(turns, "other", False, order))
    await asyncio.sleep(0.01)
    assert order == []  # the first holder still holds the turn
    turns.release()
    await asyncio.wait_for(other, 1)
    assert order == ["other"]


async def test_a_bulk_writer_gets_a_turn_after_a_run_of_urgent_ones() -> None:
    turns = WriterTurns()
    await turns.acquire()
    order: list[str] = []
    urgent_count = URGENT_IN_A_ROW + 3
    waiting = [asyncio.create_task(_take(turns, "bulk", False, order))]
    waiting += [
        asyncio.create_task(_take(turns, f"urgent{i}", True, order)) for i in range(urgent_count)
    ]
    await asyncio.sleep(0.01)
    turns.release()
    await asyncio.gather(*waiting)
    urgent = [f"urgent{i}" for i in range(urgent_count)]
    assert order == [*urgent[:URGENT_IN_A_ROW], "bulk", *urgent[URGENT_IN_A_ROW:]]


async def test_a_free_moment_ends_a_run_of_urgent_turns() -> None:
    turns = WriterTurns()
    await turns.acquire()
    order: list[str] = []
    first = [
        asyncio.create_task(_take(turns, f"early{i}", True, order))
        for i in range(URGENT_IN_A_ROW + 2)
    ]
    await asyncio.sleep(0.01)
    turns.release()
    await asyncio.gather(*first)
    # The turn was free for a moment: a new run starts, and an urgent writer arriving
    # after a bulk one still goes first.
    await turns.acquire()
    late = [
        asyncio.create_task(_take(turns, "bulk", False, order)),
        asyncio.create_task(_take(turns, "urgent", True, order)),
    ]
    await asyncio.sleep(0.01)
    turns.release()
    await asyncio.gather(*late)
    assert order[-2:] == ["urgent", "bulk"]
