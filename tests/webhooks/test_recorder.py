"""The recorder batches the outcomes that end together into one write, and hands each
caller its own completion, or the batch's error."""

from __future__ import annotations

import asyncio

import pytest

from groupbuy.webhooks.outcomes import Completion, Outcome
from groupbuy.webhooks.queue import Claimed
from groupbuy.webhooks.recorder import Recorder
from groupbuy.webhooks.sender import Reply


def outcome(n: int, status: int = 200) -> Outcome:
    claimed = Claimed(n, "t", "e", n, "team.formed", 0, b"{}")
    return Outcome(claimed, Reply(status, None, 1, b""), 0)


async def test_outcomes_ending_together_are_written_in_one_batch() -> None:
    batches: list[list[int]] = []

    async def write(outcomes: list[Outcome]) -> list[Completion]:
        batches.append([o.claimed.delivery_id for o in outcomes])
        await asyncio.sleep(0.01)
        return [Completion("delivered" if o.reply.succeeded else "pending") for o in outcomes]

    recorder = Recorder(write)
    first = await asyncio.gather(*(recorder.record(outcome(n)) for n in range(5)))
    assert batches == [[0, 1, 2, 3, 4]]
    assert [c.status for c in first] == ["delivered"] * 5
    # While one batch is written, the next ones gather behind it.
    late = asyncio.ensure_future(recorder.record(outcome(5, 500)))
    await asyncio.sleep(0)
    more = [asyncio.ensure_future(recorder.record(outcome(n))) for n in (6, 7)]
    results = await asyncio.gather(late, *more)
    assert batches[1:] == [[5, 6, 7]]
    assert [c.status for c in results] == ["pending", "delivered", "delivered"]


async def test_a_failed_write_fails_each_caller_of_its_batch_and_the_next_goes_on() -> None:
    calls = 0

    async def write(outcomes: list[Outcome]) -> list[Completion]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("database away")
        return [Completion("delivered") for _ in outcomes]

    recorder = Recorder(write)
    failed = await asyncio.gather(
        *(recorder.record(outcome(n)) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(f, ConnectionError) for f in failed)
    assert (await recorder.record(outcome(9))).status == "delivered"
    blocked = asyncio.ensure_future(recorder.record(outcome(10)))
    await asyncio.sleep(0)  # it waits for its batch
    await recorder.aclose()
    with pytest.raises(asyncio.CancelledError):
        await blocked
