"""groupbuy/storage/fake_adapter.py: fakeredis answers as Redis does where the service relies
on it, so the same checks pass on fakeredis and on a real server."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import redis.exceptions

from groupbuy.redpacket.writer import _missing_stream

SCRIPT = "#!lua flags=no-writes\nreturn {1, KEYS[1], ARGV[1]}"
SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()


async def test_a_script_with_a_shebang_runs_under_its_full_sha(redis_client: Any) -> None:
    assert await redis_client.script_load(SCRIPT) == SHA
    assert await redis_client.evalsha(SHA, 1, "k", "a") == [1, "k", "a"]
    await redis_client.script_flush()
    assert await redis_client.eval(SCRIPT, 1, "k", "b") == [1, "k", "b"]
    assert await redis_client.script_exists(SHA) == [True]  # EVAL cached it by that sha


async def test_a_script_error_keeps_its_line_number(redis_client: Any) -> None:
    failing = "#!lua\nlocal x = 1\nerror('boom')"
    with pytest.raises(redis.exceptions.ResponseError, match=r":3: boom"):
        await redis_client.eval(failing, 0)


async def test_reading_a_missing_stream_by_group_says_nogroup(redis_client: Any) -> None:
    with pytest.raises(redis.exceptions.ResponseError) as missing:
        await redis_client.xreadgroup("g", "c", {"gone": ">"}, count=10)
    assert str(missing.value).startswith("NOGROUP No such key 'gone' or consumer group 'g'")
    assert _missing_stream(missing.value)
    await redis_client.xgroup_create("there", "g", id="0", mkstream=True)
    with pytest.raises(redis.exceptions.ResponseError) as second:
        await redis_client.xreadgroup("g", "c", {"there": ">", "gone": ">"}, count=10)
    assert str(second.value).startswith("NOGROUP No such key 'gone'")
