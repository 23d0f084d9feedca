"""Rate limits decided in the process (groupbuy/storage/ratelocal.py): the decision from
the process's copy, the counts behind it, the credit that bounds what Redis has not
counted, and the bound itself with several processes on one real Redis."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import redis.exceptions

from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import Keys
from groupbuy.storage.ratelocal import Limit, LocalLimiter
from groupbuy.storage.scripts import Scripts

SECOND_US = 1_000_000
KEY, USER = Keys("t").rate_buckets("k1", "grab", "u1")


class Now:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.s = 1000.0

    def __call__(self) -> float:
        return self.s


class Redis:
    """Stands for the scripts registry: records each ratelimit_debit call, answers how far
    ahead each bucket is (`ahead_us`, default: what the calls counted), fails while `down`,
    and holds each call while `held` is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[Any]]] = []
        self.counted: dict[str, int] = {}
        self.ahead_us: dict[str, int] = {}
        self.down = False
        self.held: asyncio.Event | None = None
        self.cancelled = False  # the next call is cancelled (the task running it is)

    async def call(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        assert name == "ratelimit_debit"
        self.calls.append((keys, args))
        if self.held is not None:
            await self.held.wait()
        if self.cancelled:
            self.cancelled = False
            raise asyncio.CancelledError
        if self.down:
            raise redis.exceptions.ConnectionError("Error 111 connecting")
        reply = [0]
        for i, key in enumerate(keys):
            quota, window, count = args[1 + 3 * i : 4 + 3 * i]
            self.counted[key] = self.counted.get(key, 0) + count
            reply.append(self.ahead_us.get(key, self.counted[key] * window // quota))
        return reply


class Heard:
    """What the limiter told its service."""

    def __init__(self) -> None:
        self.answered: list[str] = []
        self.failed: list[tuple[str, Exception]] = []


def limiter(fake: Redis, now: Now, heard: Heard) -> LocalLimiter:
    scripts: Any = fake
    return LocalLimiter(
        scripts,
        RedisClock(),
        heard.answered.append,
        lambda key_id, error: heard.failed.append((key_id, error)),
        monotonic=now,
    )


async def settle(local: LocalLimiter) -> None:
    """Wait for the counts in flight (the flush ends by itself once nothing is left)."""
    await local.aclose()


async def test_requests_are_decided_here_and_counted_behind_them() -> None:
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    fake.held = asyncio.Event()  # Redis answers nothing: the decisions do not wait for it
    limits: list[Limit] = [(5, 10 * SECOND_US, 5)]
    replies = [await local.take("k1", [KEY], limits) for _ in range(6)]
    assert [r[0] for r in replies] == [0, 0, 0, 0, 0, 1]
    assert [r[1] for r in replies] == [4, 3, 2, 1, 0, 0]
    assert replies[0][2] == 2 and replies[4][2] == 10  # seconds until full again
    assert replies[-1][3] == 2 * SECOND_US  # one interval (10 s / 5) until one more fits
    fake.held.set()
    await settle(local)
    # The five let through were counted in one call (those of one loop turn share it).
    assert fake.counted == {KEY: 5}
    assert len(fake.calls) == 1
    assert heard.answered == ["k1"]


async def test_time_refills_the_copy() -> None:
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    limits: list[Limit] = [(2, 10 * SECOND_US, 2)]
    assert [(await local.take("k1", [KEY], limits))[0] for _ in range(3)] == [0, 0, 1]
    await settle(local)
    now.s += 5.1  # one interval: room for one
    assert [(await local.take("k1", [KEY], limits))[0] for _ in range(2)] == [0, 1]
    await settle(local)
    assert fake.counted == {KEY: 3}


async def test_past_its_credit_a_request_waits_for_the_count_in_flight() -> None:
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    limits: list[Limit] = [(100, 10 * SECOND_US, 2)]
    fake.held = asyncio.Event()
    for _ in range(2):
        assert (await local.take("k1", [KEY], limits))[0] == 0
    third = asyncio.create_task(local.take("k1", [KEY], limits))
    await asyncio.sleep(0.01)
    assert not third.done()  # two let through that Redis has not counted: the credit
    # Meanwhile other processes took 98 of the 100: with these two, all of them.
    fake.ahead_us[KEY] = 10 * SECOND_US
    fake.held.set()
    refused = await third
    assert refused[0] == 1 and refused[1] == 0
    await settle(local)
    assert fake.counted == {KEY: 2}  # a refused request is not counted


async def test_a_keys_counts_leave_one_at_a_time_so_their_answers_cannot_cross() -> None:
    """Two counts of one key in flight side by side could be answered in the other order
    than Redis ran them; the copy would then hold the first twice and refuse requests with
    room left. What a key lets through while its count is out leaves after the answer."""
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    limits: list[Limit] = [(100, 100 * SECOND_US, 10)]
    fake.held = asyncio.Event()
    assert (await local.take("k1", [KEY], limits))[0] == 0
    await asyncio.sleep(0.01)  # the turn ends: its count leaves, and Redis holds it
    for _ in range(3):
        assert (await local.take("k1", [KEY], limits))[0] == 0
    await asyncio.sleep(0.01)
    assert len(fake.calls) == 1  # the other three wait for the first count's answer
    fake.held.set()
    await settle(local)
    assert [args[3] for _keys, args in fake.calls] == [1, 3]
    assert fake.counted == {KEY: 4}
    assert local.buckets[KEY].owed == 0
    # The copy is Redis's bucket: 4 of 100 taken; with this one, 95 left.
    assert (await local.take("k1", [KEY], limits))[1] == 95
    await settle(local)


async def test_a_read_waits_for_the_keys_count_in_flight() -> None:
    """A read beside a count could have its answer cross the count's: it waits."""
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    limits: list[Limit] = [(100, 100 * SECOND_US, 10)]
    fake.held = asyncio.Event()
    assert (await local.take("k1", [KEY], limits))[0] == 0
    await asyncio.sleep(0.01)  # the count leaves, and Redis holds it
    reading = asyncio.create_task(local.read("k1", [KEY], limits))
    await asyncio.sleep(0.01)
    assert len(fake.calls) == 1  # the read waits for the count's answer
    fake.held.set()
    await reading
    await settle(local)
    assert [args[3] for _keys, args in fake.calls] == [1, 0]  # the count, then the read
    assert (await local.take("k1", [KEY], limits))[1] == 98
    await settle(local)


async def test_a_count_cancelled_in_flight_frees_its_key_and_its_credit() -> None:
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    limits: list[Limit] = [(100, 100 * SECOND_US, 1)]
    fake.cancelled = True
    assert (await local.take("k1", [KEY], limits))[0] == 0
    # The credit (1) is spent until the count ends; it ends cancelled, uncounted.
    second = await asyncio.wait_for(local.take("k1", [KEY], limits), 1)
    assert second[0] == 0
    await asyncio.wait_for(settle(local), 1)
    assert fake.counted == {KEY: 1}  # the second; the first went through uncounted
    assert local.buckets[KEY].owed == 0


async def test_a_malformed_answer_is_heard_as_a_failure_and_frees_the_credit() -> None:
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    limits: list[Limit] = [(100, 100 * SECOND_US, 1)]
    fake.ahead_us[KEY] = "not a number"  # type: ignore[assignment]
    assert (await local.take("k1", [KEY], limits))[0] == 0
    await asyncio.wait_for(settle(local), 1)
    assert [key_id for key_id, _error in heard.failed] == ["k1"]
    assert isinstance(heard.failed[0][1], ValueError)
    assert local.buckets[KEY].owed == 0


async def test_a_refusal_by_one_bucket_takes_from_none() -> None:
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    limits: list[Limit] = [(100, 60 * SECOND_US, 1), (2, 60 * SECOND_US, 1)]
    for _ in range(2):
        assert (await local.take("k1", [KEY, USER], limits))[0] == 0
        await settle(local)
    refused = await local.take("k1", [KEY, USER], limits)
    assert refused[0] == 1
    assert refused[1] == 98 and refused[3] == 0  # the key's bucket, as after two
    assert refused[4] == 0 and refused[6] > 0  # only the user's has to wait
    await settle(local)
    assert fake.counted == {KEY: 2, USER: 2}


async def test_a_failed_count_lets_the_waiting_requests_go_and_says_so() -> None:
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    limits: list[Limit] = [(100, 10 * SECOND_US, 1)]
    fake.held, fake.down = asyncio.Event(), True
    assert (await local.take("k1", [KEY], limits))[0] == 0
    waiting = asyncio.create_task(local.take("k1", [KEY], limits))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    fake.held.set()
    # Not counted: the credit is free again, and the request waiting for it goes ahead.
    assert (await waiting)[0] == 0
    await settle(local)
    assert [key_id for key_id, _error in heard.failed] == ["k1", "k1"]
    assert isinstance(heard.failed[0][1], redis.exceptions.ConnectionError)
    assert local.buckets[KEY].owed == 0


async def test_a_read_copies_the_buckets_before_the_first_decision() -> None:
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    fake.ahead_us[USER] = 60 * SECOND_US  # this user's one request in the minute is taken
    limits: list[Limit] = [(100, 60 * SECOND_US, 1), (1, 60 * SECOND_US, 1)]
    await local.read("k1", [KEY, USER], limits)
    assert fake.calls[0][1] == [0, 100, 60 * SECOND_US, 0, 1, 60 * SECOND_US, 0]
    refused = await local.take("k1", [KEY, USER], limits)
    assert refused[0] == 1 and refused[4:6] == [0, 60]


async def test_full_buckets_with_nothing_owed_are_forgotten() -> None:
    fake, now, heard = Redis(), Now(), Heard()
    local = limiter(fake, now, heard)
    limits: list[Limit] = [(20, 2 * SECOND_US, 1)]
    users = Keys("t").rate_buckets
    for n in range(1100):
        await local.take("k1", users("k1", "grab", f"u{n}", by_key=False), limits)
    await settle(local)
    assert len(local.buckets) == 1100
    now.s += 2.1  # every user's bucket is full again
    await local.take("k1", users("k1", "grab", "last", by_key=False), limits)
    await settle(local)
    assert len(local.buckets) == 1  # the last one, still owing time


@pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])
@pytest.mark.parametrize("processes", [1, 4])
async def test_processes_on_one_bucket_let_through_at_most_quota_plus_their_credits(
    redis_client: Any, processes: int
) -> None:
    """Each LocalLimiter stands for a process (its own copy, its own counts); all hammer one
    bucket of 200 an hour on the real server, with 5% local credit (10 each)."""
    quota, window_us, credit = 200, 3600 * SECOND_US, 10
    limits: list[Limit] = [(quota, window_us, credit)]
    scripts = Scripts(redis_client)
    await scripts.load()
    heard = Heard()
    limiters = [
        LocalLimiter(scripts, RedisClock(), heard.answered.append, lambda *a: None)
        for _ in range(processes)
    ]
    let_through = refused = 0
    began = asyncio.get_running_loop().time()

    async def hammer(local: LocalLimiter) -> None:
        nonlocal let_through, refused
        for _ in range(150):
            if (await local.take("k1", [KEY], limits))[0] == 0:
                let_through += 1
            else:
                refused += 1
            await asyncio.sleep(0)

    await asyncio.gather(*(hammer(local) for local in limiters for _ in range(8)))
    for local in limiters:
        await local.aclose()
    took_s = asyncio.get_running_loop().time() - began
    refill = math.ceil(took_s * quota * SECOND_US / window_us)
    # Never under the quota (a refusal is never wrong), never over it by more than the credits.
    assert quota <= let_through <= quota + refill + processes * credit, (let_through, refused)
    if processes == 1:
        assert let_through <= quota + refill  # one process: exact
    # Redis counted every request let through: its bucket is that far ahead.
    ahead_us = float(await redis_client.get(KEY)) - float(await redis_time_us(redis_client))
    assert let_through - 1 - refill <= ahead_us / (window_us / quota) <= let_through


async def redis_time_us(client: Any) -> int:
    seconds, micros = await client.time()
    return int(seconds) * SECOND_US + int(micros)
