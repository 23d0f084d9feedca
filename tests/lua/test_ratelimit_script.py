"""lua/ratelimit_take.lua called directly, on fakeredis and on a real redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from groupbuy.storage.keys import Keys
from groupbuy.storage.specs import Scripts

KEY, USER = Keys("t").rate_buckets("k1", "grab", "u1")
SECOND_US = 1_000_000


class Buckets:
    """Calls the script with a controllable time shift, as the service does."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.scripts = Scripts(redis)
        self.shift_ms = 0

    async def take(self, *limits: tuple[str, int, int]) -> list[int]:
        """limits: (key, quota, window_s) each."""
        args: list[Any] = [self.shift_ms]
        for _key, quota, window_s in limits:
            args += [quota, window_s * SECOND_US]
        reply = await self.scripts.call("ratelimit_take", [k for k, _q, _w in limits], args)
        return [int(v) for v in reply]


@pytest.fixture
async def b(redis_client: Any) -> Buckets:
    buckets = Buckets(redis_client)
    await buckets.scripts.load()
    return buckets


async def test_a_full_bucket_takes_its_quota_at_once_then_refuses(b: Buckets) -> None:
    answers = [await b.take((KEY, 5, 10)) for _ in range(6)]
    assert [a[0] for a in answers] == [0, 0, 0, 0, 0, 1]
    assert [a[1] for a in answers] == [4, 3, 2, 1, 0, 0]
    # A refusal says how long until one more fits: one refill interval (10 s / 5) at most.
    wait_us = answers[-1][3]
    assert 0 < wait_us <= 2 * SECOND_US
    assert 9 <= answers[-1][2] <= 10  # full again in 10 s, less the time the calls took


async def test_the_bucket_refills_at_quota_per_window(b: Buckets) -> None:
    for _ in range(5):
        assert (await b.take((KEY, 5, 10)))[0] == 0
    assert (await b.take((KEY, 5, 10)))[0] == 1
    b.shift_ms += 2_100  # one interval (2 s): one request fits again, not two
    assert (await b.take((KEY, 5, 10)))[0] == 0
    assert (await b.take((KEY, 5, 10)))[0] == 1
    b.shift_ms += 10_100  # a whole window: full again
    answer = await b.take((KEY, 5, 10))
    assert answer[:2] == [0, 4]


async def test_a_refusal_by_the_user_bucket_takes_nothing_from_the_key_bucket(b: Buckets) -> None:
    for _ in range(2):
        assert (await b.take((KEY, 100, 60), (USER, 2, 60)))[0] == 0
    key_bucket = await b.redis.get(KEY)
    refused = await b.take((KEY, 100, 60), (USER, 2, 60))
    assert refused[0] == 1
    assert refused[1] == 98 and refused[4] == 0  # the key's bucket: as after two requests
    assert refused[3] == 0 < refused[6]  # only the user's bucket has to wait
    assert await b.redis.get(KEY) == key_bucket
    other = Keys("t").rate_buckets("k1", "grab", "u2")
    assert (await b.take((KEY, 100, 60), (other[1], 2, 60)))[:2] == [0, 97]


async def test_every_bucket_expires_once_full_again(b: Buckets) -> None:
    await b.take((KEY, 2, 1), (USER, 20, 60))
    key_ttl, user_ttl = await b.redis.pttl(KEY), await b.redis.pttl(USER)
    assert 400 < key_ttl <= 501  # 500 ms of debt (+1)
    assert 2_900 < user_ttl <= 3_001  # 3 s of debt (+1)


async def test_a_refused_call_writes_nothing(b: Buckets) -> None:
    await b.take((KEY, 1, 60))
    before = await b.redis.get(KEY)
    assert (await b.take((KEY, 1, 60)))[0] == 1
    assert await b.redis.get(KEY) == before


async def test_calls_still_work_after_script_flush(b: Buckets) -> None:
    assert (await b.take((KEY, 3, 10)))[0] == 0
    await b.redis.script_flush()
    assert (await b.take((KEY, 3, 10)))[:2] == [0, 1]


@pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])
async def test_concurrent_calls_let_exactly_the_quota_through(b: Buckets) -> None:
    answers = await asyncio.gather(*(b.take((KEY, 50, 3600)) for _ in range(200)))
    assert sum(1 for a in answers if a[0] == 0) == 50
    assert sorted(a[1] for a in answers if a[0] == 0) == list(range(50))
