"""Every script declares its flags in a `#!lua` shebang, the first line Redis sees: Redis
refuses the writes clients ask for up front over maxmemory, and runs the rest."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
import redis.exceptions

from groupbuy.storage.pipelining import AutoPipeline
from groupbuy.storage.specs import (
    SHEBANG,
    Scripts,
    lua_dir,
    script_flags,
    script_names,
    script_source,
)

# The writes a client asks for (a send, a grab, a seat): over maxmemory Redis refuses them
# before they run, so nothing is half-applied. Everything else may run there: what time does
# (sweeps, expiry: reads apply it too), what frees memory (acks, releases), the scheduler's
# lease, and the reads; a read that writes nothing declares it.
REFUSED_OVER_MAXMEMORY = {
    "activity_counts_put",
    "activity_sale",
    "packet_admit",
    "packet_create",
    "packet_grab",
    "packet_restore",
    "packet_withdraw",
    "ratelimit_take",
    "team_confirm",
    "team_dissolve",
    "team_extend",
    "team_join",
    "team_leave",
    "team_lock",
    "team_open",
    "team_restore",
    "team_unlock",
    "waitlist_join",
    "waitlist_leave",
    "write_probe",
}
NO_WRITES = {"user_lock_read", "waitlist_lines", "waitlist_read"}
# Commands a no-writes script must not call (Redis refuses them there at run time).
_WRITES = re.compile(
    r"redis\.p?call\('(SET|DEL|HSET|HINCRBY|HDEL|ZADD|ZREM|ZREMRANGEBYSCORE|XADD|XDEL|XACK|"
    r"XGROUP|RPUSH|LPOP|INCRBY|PEXPIRE|PEXPIREAT|EXPIRE|UNLINK)'"
)


def test_every_script_starts_with_a_shebang_and_no_library_does() -> None:
    for path in sorted(lua_dir().glob("*.lua")):
        first = path.read_text(encoding="utf-8").partition("\n")[0]
        if path.name.startswith("_"):
            assert not first.startswith("#!"), path.name  # it lands inside another script
        else:
            assert first == SHEBANG or first.startswith(f"{SHEBANG} flags="), path.name
            assert script_source(path.stem).startswith(f"{first}\n"), path.name
            assert not script_source(path.stem, flags=False).startswith("#!"), path.name


def test_each_script_declares_what_it_may_do() -> None:
    for name in script_names():
        flags = script_flags(name)
        assert flags <= {"no-writes", "allow-oom"}, (name, flags)
        assert (name in REFUSED_OVER_MAXMEMORY) == (not flags), (name, flags)
        assert (name in NO_WRITES) == ("no-writes" in flags), (name, flags)


def test_no_writes_scripts_call_no_write_command() -> None:
    for name in NO_WRITES:
        body = (lua_dir() / f"{name}.lua").read_text(encoding="utf-8")
        assert not _WRITES.search(body), name


async def test_the_registry_sends_flags_to_every_backend(redis_client: Any) -> None:
    # fakeredis is given the shebang too: groupbuy/storage/fake_adapter.py drops it there.
    scripts = Scripts(redis_client)
    for name in script_names():
        assert scripts.source(name) == script_source(name, flags=True), name
    # Both call paths (EVALSHA by redis-py, the coalescing pipeline) load that same source.
    pipeline = AutoPipeline(
        redis_client.connection_pool, max_batch=8, max_in_flight=1, socket_timeout_s=None
    )
    piped = Scripts(redis_client, pipeline)
    await redis_client.script_flush()
    await piped.call("lease_hold", ["lease"], ["me", 1000])
    await scripts.call("write_probe", ["lease"], [])
    for name in ("lease_hold", "write_probe"):
        sha = hashlib.sha1(scripts.source(name).encode()).hexdigest()
        assert (await redis_client.script_exists(sha)) == [True], name
    await pipeline.aclose()


@pytest.mark.real
async def test_over_maxmemory_redis_refuses_exactly_the_client_writes(real_redis_url: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(real_redis_url, decode_responses=True)
    scripts = Scripts(client)
    await scripts.load()
    await client.config_set("maxmemory", "1")
    try:
        for name in script_names():
            source = scripts.source(name)
            try:
                # Keys and arguments that make no sense: a refused script never gets to them.
                await client.evalsha(hashlib.sha1(source.encode()).hexdigest(), 1, "{x}k", "0")
            except redis.exceptions.OutOfMemoryError:
                assert name in REFUSED_OVER_MAXMEMORY, f"{name} refused over maxmemory"
            except redis.exceptions.ResponseError:
                assert name not in REFUSED_OVER_MAXMEMORY, f"{name} ran over maxmemory"
            else:
                assert name not in REFUSED_OVER_MAXMEMORY, f"{name} ran over maxmemory"
    finally:
        await client.config_set("maxmemory", "0")
        await client.aclose()
