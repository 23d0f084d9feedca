"""The rate limiter when its buckets' Redis does not answer: requests go through unlimited,
and the key's next requests skip the call for a while instead of each waiting for it to
fail (on a cluster, a dead shard holding the key's buckets would slow every shard)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.exceptions

from groupbuy.settings import RateLimitSettings
from groupbuy.storage import throttles as ratelimit
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import Keys
from groupbuy.storage.throttles import SKIP_AFTER_FAILURE_S, RateLimitService


class Now:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.s = 1000.0

    def monotonic(self) -> float:
        return self.s


class Buckets:
    """Stands for the scripts registry: counts the calls per API key, fails while `down`,
    and holds a call while `held` is set."""

    def __init__(self) -> None:
        self.down = True
        self.calls: dict[str, int] = {}
        self.held: asyncio.Event | None = None

    async def call(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        assert name == "ratelimit_take"
        key = keys[0].split("{rl:")[1].split("}")[0]
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.held is not None:
            await self.held.wait()
        if self.down:
            raise redis.exceptions.ConnectionError("Error 111 connecting")
        return [0, 99, 1, 0, 19, 1, 0]


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> Now:
    clock = Now()
    monkeypatch.setattr(ratelimit, "time", clock)
    return clock


async def test_after_a_failure_the_key_skips_its_buckets_then_one_request_tries_again(
    now: Now,
) -> None:
    buckets = Buckets()
    scripts: Any = buckets
    service = RateLimitService(RateLimitSettings(), scripts, Keys("gb", cluster=True), RedisClock())

    assert await service.take("grab", "k1", "u1") is None  # open, not shut
    assert buckets.calls == {"k1": 1}
    for n in range(20):
        assert await service.take("grab", "k1", f"u{n}") is None
    assert buckets.calls == {"k1": 1}  # no call while the key skips
    # Another key's buckets are asked (they may live on a shard that answers).
    assert await service.take("grab", "k2", "u1") is None
    assert buckets.calls == {"k1": 1, "k2": 1}

    now.s += SKIP_AFTER_FAILURE_S
    buckets.held = asyncio.Event()
    probe = asyncio.create_task(service.take("grab", "k1", "u1"))
    await asyncio.sleep(0)
    assert buckets.calls["k1"] == 2
    # While the one request tries, the others still skip.
    assert await service.take("grab", "k1", "u2") is None
    assert buckets.calls["k1"] == 2
    buckets.held.set()
    assert await probe is None  # still down: skipped again for a while
    buckets.held = None
    assert await service.take("grab", "k1", "u3") is None
    assert buckets.calls["k1"] == 2

    buckets.down = False
    now.s += SKIP_AFTER_FAILURE_S
    decision = await service.take("grab", "k1", "u1")
    assert decision is not None and decision.allowed
    assert buckets.calls["k1"] == 3
    for n in range(5):  # back: every request is counted again
        assert await service.take("grab", "k1", f"u{n}") is not None
    assert buckets.calls["k1"] == 8
