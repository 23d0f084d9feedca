"""lua/guess_count.lua and the throttle over it (groupbuy/storage/throttles.py), called
directly on fakeredis, a real redis-server and a Redis Cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from groupbuy.settings import AuthSettings
from groupbuy.storage.keys import Keys
from groupbuy.storage.specs import Scripts
from groupbuy.storage.throttles import GUESS_COUNT, GuessThrottle, address_subject
from tests.support.backends import ALL

ON_EVERY_BACKEND = pytest.mark.parametrize("backend", ALL)

COUNTER = Keys("t").guesses("203.0.113.7")


async def guess_count(scripts: Scripts, counter: str, add: int, window_ms: int) -> tuple[int, int]:
    """One guess_count call by its spec: the failures in the window and the ms left."""
    reply = await GUESS_COUNT.run(
        scripts, GUESS_COUNT.key_list(counter=counter), {"add": add, "window_ms": window_ms}
    )
    return reply.failures, reply.ms_left


@pytest.fixture
async def scripts(redis_client: Any) -> Scripts:
    registry = Scripts(redis_client)
    await registry.load()
    return registry


@ON_EVERY_BACKEND
async def test_counts_in_a_window_started_by_the_first_failure(
    scripts: Scripts, redis_client: Any
) -> None:
    assert await guess_count(scripts, COUNTER, 0, 60_000) == (0, 0)
    assert await redis_client.exists(COUNTER) == 0  # a read writes nothing
    failures, left_ms = await guess_count(scripts, COUNTER, 1, 60_000)
    assert failures == 1 and 59_000 < left_ms <= 60_000
    await asyncio.sleep(0.05)
    failures, later_ms = await guess_count(scripts, COUNTER, 1, 60_000)
    assert failures == 2 and later_ms < left_ms  # the window is not pushed back
    assert (await guess_count(scripts, COUNTER, 0, 60_000))[0] == 2


@ON_EVERY_BACKEND
async def test_the_count_ends_with_its_window(scripts: Scripts) -> None:
    await guess_count(scripts, COUNTER, 1, 50)
    await asyncio.sleep(0.12)
    assert await guess_count(scripts, COUNTER, 0, 50) == (0, 0)
    assert (await guess_count(scripts, COUNTER, 1, 50))[0] == 1


@ON_EVERY_BACKEND
async def test_calls_still_work_after_script_flush(scripts: Scripts, redis_client: Any) -> None:
    await guess_count(scripts, COUNTER, 1, 60_000)
    await redis_client.script_flush()
    assert (await guess_count(scripts, COUNTER, 1, 60_000))[0] == 2


@ON_EVERY_BACKEND
async def test_the_throttle_refuses_an_address_for_the_rest_of_its_window(
    scripts: Scripts,
) -> None:
    throttle = GuessThrottle(
        AuthSettings(guess_limit=3, guess_window_s=30, guess_exempt=("10.0.0.0/8",)),
        scripts,
        Keys("t"),
    )
    for _ in range(3):
        assert await throttle.refused_for("::ffff:203.0.113.7") is None
        await throttle.failed("203.0.113.7")  # the same address, mapped into IPv6 or not
    refused = await throttle.refused_for("::ffff:203.0.113.7")
    assert refused is not None and 29 <= refused <= 30
    assert await throttle.refused_for("203.0.113.8") is None
    for _ in range(5):
        await throttle.failed("10.1.2.3")
    assert await throttle.refused_for("10.1.2.3") is None  # exempt


def test_addresses_are_counted_normalised_and_names_as_digests() -> None:
    assert address_subject("2001:DB8::1")[0] == "2001:db8::1"
    assert address_subject("::ffff:192.0.2.1")[0] == "192.0.2.1"
    subject, ip = address_subject("testclient")
    assert ip is None and subject.startswith("n-") and "testclient" not in subject
