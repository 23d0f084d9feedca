"""The coalescing layer: own replies, own errors, NOSCRIPT, drops, stalls, cancellation.

Runs on fakeredis and on the real server (the `redis_client` fixture); the fault cases
put a proxy between the client and the real server to cut or stall the connection in
the middle of a batch, then read Redis to check no call was applied twice.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from redis.backoff import NoBackoff

from groupbuy.storage.pipelining import AutoPipeline
from tests.support.proxy import faulty_proxy
from tests.support.redis import make_async_redis

# Applies an id once (idempotent like every service script) and says whether it was new.
APPLY_ONCE = """
if ARGV[2] == 'fail' then return redis.error_reply('bad argument: ' .. ARGV[1]) end
if redis.call('SADD', KEYS[1], ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return {0, ARGV[1]}
end
return {1, ARGV[1]}
"""


class Harness:
    """One script on one client, called through an AutoPipeline."""

    def __init__(self, client: Any, **options: Any) -> None:
        self.client = client
        self.script = client.register_script(APPLY_ONCE)
        tag = uuid.uuid4().hex[:8]
        self.keys = [f"applied:{{{tag}}}", f"order:{{{tag}}}"]
        options.setdefault("max_batch", 256)
        options.setdefault("max_in_flight", 2)
        options.setdefault("socket_timeout_s", 5.0)
        self.pipeline = AutoPipeline(client.connection_pool, **options)

    async def apply(self, item: str, mode: str = "") -> Any:
        return await self.pipeline.evalsha(
            self.script.sha, self.script.script, self.keys, [item, mode]
        )

    async def applied(self) -> list[str]:
        order: list[str] = await self.client.lrange(self.keys[1], 0, -1)
        return order


async def test_concurrent_callers_get_their_own_replies(redis_client: Any) -> None:
    harness = Harness(redis_client)
    await redis_client.script_load(APPLY_ONCE)  # so every call is sent exactly once
    items = [f"u{i}" for i in range(500)]

    async def caller(item: str) -> Any:
        for _ in range(random.randrange(3)):
            await asyncio.sleep(0)
        return await harness.apply(item)

    replies = await asyncio.gather(*(caller(item) for item in items))
    assert replies == [[0, item] for item in items]
    assert sorted(await harness.applied()) == sorted(items)
    # Coalesced: far fewer round trips than calls, and never more than a batch allows.
    assert harness.pipeline.calls == 500
    assert harness.pipeline.batches < 100
    assert harness.pipeline.largest_batch <= 256


@hypothesis_settings(max_examples=30, deadline=None)
@given(
    delays=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=40),
    max_batch=st.integers(min_value=1, max_value=8),
    max_in_flight=st.integers(min_value=1, max_value=3),
)
async def test_every_interleaving_answers_each_caller_its_own(
    delays: list[int], max_batch: int, max_in_flight: int
) -> None:
    client = make_async_redis("")
    try:
        harness = Harness(client, max_batch=max_batch, max_in_flight=max_in_flight)

        async def caller(i: int, delay: int) -> Any:
            for _ in range(delay):
                await asyncio.sleep(0)
            # every third caller repeats an earlier id: it must see "already applied"
            item = f"u{i - 1}" if i % 3 == 2 else f"u{i}"
            return item, await harness.apply(item)

        answers = await asyncio.gather(*(caller(i, d) for i, d in enumerate(delays)))
        for item, reply in answers:
            assert reply[1] == item
        fresh = [reply for _item, reply in answers if reply[0] == 0]
        assert sorted(r[1] for r in fresh) == sorted({item for item, _ in answers})
        assert harness.pipeline.largest_batch <= max_batch
    finally:
        await client.aclose()


async def test_a_call_made_when_idle_goes_out_alone(redis_client: Any) -> None:
    harness = Harness(redis_client)
    await redis_client.script_load(APPLY_ONCE)
    for i in range(3):
        assert await harness.apply(f"u{i}") == [0, f"u{i}"]
    assert (harness.pipeline.batches, harness.pipeline.calls) == (3, 3)


async def test_one_callers_script_error_does_not_fail_the_others(redis_client: Any) -> None:
    harness = Harness(redis_client)
    modes = ["fail" if i % 5 == 0 else "" for i in range(50)]
    replies = await asyncio.gather(
        *(harness.apply(f"u{i}", mode) for i, mode in enumerate(modes)), return_exceptions=True
    )
    for i, reply in enumerate(replies):
        if modes[i] == "fail":
            assert isinstance(reply, redis.exceptions.ResponseError)
            assert f"bad argument: u{i}" in str(reply)
        else:
            assert reply == [0, f"u{i}"]
    assert len(await harness.applied()) == 40
    assert harness.pipeline.batches < 50


async def test_noscript_in_the_middle_of_a_batch_is_loaded_and_sent_again(
    redis_client: Any,
) -> None:
    harness = Harness(redis_client)
    other = redis_client.register_script("return {0, 'other', ARGV[1]}")
    await redis_client.script_flush()
    await redis_client.script_load(other.script)  # the batch mixes a known and a missing sha

    calls = []
    for i in range(30):
        if i % 2:
            calls.append(harness.apply(f"u{i}"))
        else:
            calls.append(harness.pipeline.evalsha(other.sha, other.script, ["k"], [str(i)]))
    replies = await asyncio.gather(*calls)
    for i, reply in enumerate(replies):
        assert reply == ([0, f"u{i}"] if i % 2 else [0, "other", str(i)])
    assert len(await harness.applied()) == 15
    assert await redis_client.script_exists(harness.script.sha) == [True]


async def test_a_script_flushed_again_between_reload_and_resend_is_loaded_again(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SCRIPT FLUSH that lands right after the pipeline reloaded a script: the call is
    loaded and sent again instead of failing (it used to raise NoScriptError: a 500)."""
    harness = Harness(redis_client)
    real_reload = AutoPipeline._reload
    flushed_after_reload = 0

    async def reload_then_flush(self: AutoPipeline, connection: Any, missing: list[Any]) -> None:
        nonlocal flushed_after_reload
        await real_reload(self, connection, missing)
        if flushed_after_reload < 3:  # an operator's flush, before the call goes out again
            flushed_after_reload += 1
            await connection.send_command("SCRIPT", "FLUSH", check_health=False)
            await connection.read_response()

    monkeypatch.setattr(AutoPipeline, "_reload", reload_then_flush)
    assert await harness.apply("u1") == [0, "u1"]
    assert flushed_after_reload == 3
    assert await harness.applied() == ["u1"]


async def test_a_server_that_never_keeps_the_script_fails_the_call(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = Harness(redis_client)
    real_reload = AutoPipeline._reload

    async def reload_then_flush(self: AutoPipeline, connection: Any, missing: list[Any]) -> None:
        await real_reload(self, connection, missing)
        await connection.send_command("SCRIPT", "FLUSH", check_health=False)
        await connection.read_response()

    monkeypatch.setattr(AutoPipeline, "_reload", reload_then_flush)
    with pytest.raises(redis.exceptions.NoScriptError, match="5 times"):
        await harness.apply("u1")
    assert await harness.applied() == []


async def test_cancelled_callers_do_not_disturb_the_rest(redis_client: Any) -> None:
    harness = Harness(redis_client, max_batch=4, max_in_flight=1)
    await redis_client.script_load(APPLY_ONCE)
    tasks = [asyncio.create_task(harness.apply(f"u{i}")) for i in range(40)]
    for _turn in range(10_000):  # until the first batch (u0-u3) is in flight
        if harness.pipeline.batches:
            break
        await asyncio.sleep(0)
    assert harness.pipeline.batches == 1
    cancelled = {1, 2, *range(6, 40, 3)}  # two callers in flight, the others still queued
    for i in cancelled:
        tasks[i].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for i, result in enumerate(results):
        if i in cancelled:
            assert isinstance(result, asyncio.CancelledError)
        else:
            assert result == [0, f"u{i}"]
    applied = set(await harness.applied())
    assert {f"u{i}" for i in range(40) if i not in cancelled} <= applied
    # Later calls still work on the same pipeline.
    assert await harness.apply("after") == [0, "after"]


@pytest.mark.real
async def test_a_connection_dropped_mid_batch_resends_what_was_unanswered(
    real_redis_url: str,
) -> None:
    async with faulty_proxy(real_redis_url) as proxy:
        client = aioredis.Redis.from_url(proxy.url, decode_responses=True)
        try:
            harness = Harness(client, max_in_flight=1, backoff=NoBackoff())
            assert await harness.apply("warm-up") == [0, "warm-up"]
            # The next reply bytes pass only partly: a few callers are answered, the
            # connection then drops with the rest of the batch executed but unanswered.
            proxy.cut_after(60)
            items = [f"u{i}" for i in range(64)]
            replies = await asyncio.gather(*(harness.apply(item) for item in items))
            by_item = {reply[1]: reply[0] for reply in replies}
            assert set(by_item) == set(items)
            # Every caller got an answer; the resent ones find their id already applied.
            assert 0 in by_item.values()
            assert 1 in by_item.values()
            applied = await harness.applied()
            assert sorted(applied) == sorted(["warm-up", *items])  # nothing applied twice
            assert proxy.connections >= 2
        finally:
            await client.aclose()


@pytest.mark.real
async def test_a_server_that_stays_away_fails_every_caller_clearly(real_redis_url: str) -> None:
    async with faulty_proxy(real_redis_url) as proxy:
        client = aioredis.Redis.from_url(proxy.url, decode_responses=True)
        try:
            harness = Harness(client, retries=2, backoff=NoBackoff())
            assert await harness.apply("warm-up") == [0, "warm-up"]
            proxy.refuse()
            proxy.cut_after(0)
            replies = await asyncio.gather(
                *(harness.apply(f"u{i}") for i in range(20)), return_exceptions=True
            )
            assert all(isinstance(r, redis.exceptions.ConnectionError) for r in replies)
            proxy.refuse(False)
            assert await harness.apply("back") == [0, "back"]
        finally:
            await client.aclose()


@pytest.mark.real
async def test_a_stalled_server_times_out_after_the_socket_timeout(real_redis_url: str) -> None:
    async with faulty_proxy(real_redis_url) as proxy:
        # As the service configures it: one timeout for connecting and for replies.
        client = aioredis.Redis.from_url(
            proxy.url, decode_responses=True, socket_timeout=0.2, socket_connect_timeout=0.2
        )
        try:
            harness = Harness(client, socket_timeout_s=0.2, retries=1, backoff=NoBackoff())
            assert await harness.apply("warm-up") == [0, "warm-up"]
            proxy.stall()
            started = asyncio.get_running_loop().time()
            replies = await asyncio.gather(
                *(harness.apply(f"u{i}") for i in range(10)), return_exceptions=True
            )
            waited = asyncio.get_running_loop().time() - started
            assert all(isinstance(r, redis.exceptions.TimeoutError) for r in replies)
            assert 0.4 <= waited < 2  # two attempts of 0.2 s each, then the error
        finally:
            await client.aclose()
